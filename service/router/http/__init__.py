"""The router's HTTP API (FastAPI): its definition (OpenAPI, /docs) and the Python app that
answers what the native front hands it. One module a group of routes: ``reads`` (point,
batch, several states, series: answered by the read core), ``top``, ``stream`` (watch),
``jobs`` (the job list, a job, position, the cluster), ``probes`` (/healthz, /readyz,
/metrics); ``params`` holds the parameters they share, ``app`` assembles them."""

from qstate.router.http.app import create_app, create_asgi, json_response

__all__ = ["create_app", "create_asgi", "json_response"]
