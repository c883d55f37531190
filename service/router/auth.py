"""Client tokens at the router's doors: who is asking and whether their token's scopes cover
what the request names, before any lookup. The rule is the read engine's, for every protocol
(``qstate._engine``: ``Engine.authorize`` of an HTTP path, ``Engine.authenticate`` of gRPC's
metadata, then ``Principal.check``); this module puts it at Python's doors
(docs/architecture.md §7).

HTTP: an ASGI wrapper outside both the read routes and FastAPI, so no route can forget it;
the request's ``Principal`` is left in ``scope["state"]["principal"]`` (FastAPI's
``request.state.principal``) for routes that filter (the job list). Behind the native front,
which asked the engine already, the principal comes with the request instead. gRPC:
``GrpcAuth.principal`` from the call's metadata. Open without a token: /healthz, /readyz, the
API's documents (/docs, /openapi.json) and the /ui page's files, and /metrics while
``metrics_public``. Without a tokens file everything is open, as on a laptop.
"""

from __future__ import annotations

from typing import Any

import grpc

from qstate._engine import Engine, Principal
from qstate.core.errors import QStateError
from qstate.core.transport.security import AUTH_HEADER
from qstate.router.wire import send_error

__all__ = ["PRINCIPAL_HEADER", "GrpcAuth", "with_auth"]

# how the native front hands the app the principal it let a request in with
# (engine/core/src/front/handle.rs; the front removes it from every request it is sent)
PRINCIPAL_HEADER = b"x-qstate-principal"


def _forwarded(scope: dict[str, Any]) -> Principal | None:
    raw = next((v for k, v in scope["headers"] if k == PRINCIPAL_HEADER), None)
    if raw is None:
        return None
    name, _, scopes = raw.decode("latin-1").partition(" ")
    return Principal.of(name, scopes.split(","))


def with_auth(app: Any, engine: Engine, forwarded: bool = False) -> Any:
    """``forwarded``: the app behind the native front, which let the request in and sends its
    principal along (docs/architecture.md §5, native front)."""

    async def asgi(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        if forwarded:
            principal = _forwarded(scope)
        else:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            try:
                principal = engine.authorize(scope["path"], header)
            except QStateError as exc:
                return await send_error(send, exc)
        if principal is not None:
            scope.setdefault("state", {})["principal"] = principal
        return await app(scope, receive, send)

    return asgi


class GrpcAuth:
    """The same rule for the public gRPC API: the token in metadata ``authorization``."""

    def __init__(self, engine: Engine | None) -> None:
        self.engine = engine

    def metadata(self, context: grpc.aio.ServicerContext) -> bytes | None:
        """The caller's ``authorization`` metadata, as the engine reads it."""
        sent = dict(context.invocation_metadata() or ()).get(AUTH_HEADER)
        return sent.encode("latin-1", "replace") if isinstance(sent, str) else None

    def principal(self, context: grpc.aio.ServicerContext) -> Principal | None:
        """The caller, or None when the router asks for no tokens; raises
        ``Unauthenticated``."""
        if self.engine is None:
            return None
        return self.engine.authenticate(self.metadata(context))

    def check(self, context: grpc.aio.ServicerContext, job: str,
              operator: str | None = None) -> None:
        p = self.principal(context)
        if p is not None:
            p.check(job, operator)
