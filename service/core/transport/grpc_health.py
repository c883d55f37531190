"""The standard gRPC health and reflection services on the router and the shards.

A generic client (``grpcurl``, a Kubernetes gRPC probe, Evans) lists the services and calls
them without qstate's proto files (reflection), and asks ``grpc.health.v1.Health/Check``
whether a server is SERVING: a router once it has an assignment to route by, a shard while
none of its partitions is restoring (docs/architecture.md §5). The status is the process's
own ``ready`` predicate, the same one its HTTP /readyz answers, looked at every ``every_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

__all__ = ["Health"]

log = logging.getLogger(__name__)


class Health:
    """Health and reflection added to ``server`` for ``services`` (full names)."""

    def __init__(self, server: grpc.aio.Server, services: Sequence[str]) -> None:
        self.services = ["", *services]  # "": the server as a whole
        self.servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        reflection.enable_server_reflection(
            [*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        self._serving: bool | None = None

    async def set(self, serving: bool) -> None:
        if serving == self._serving:
            return
        self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.services:
            await self.servicer.set(name, status)
        log.info("health: %s", "SERVING" if serving else "NOT_SERVING")

    async def follow(self, ready: Callable[[], bool], every_s: float = 0.5) -> None:
        """Keep the status equal to ``ready()`` (run as a task until cancelled)."""
        while True:
            await self.set(ready())
            await asyncio.sleep(every_s)

    async def stop(self) -> None:
        """NOT_SERVING on every name, for the seconds a server takes to stop."""
        await self.servicer.enter_graceful_shutdown()
