"""The router's own gRPC channels to shard servers, one per address, for what Python still asks
of them: ``Describe`` (``qstate.router.describer``) and ``Top`` (``qstate.router.top``).
Reads of keys go through the read engine's own channels (docs/architecture.md §5)."""

from __future__ import annotations

import grpc

from qstate.core.config import DEFAULTS, Settings
from qstate.core.transport import security
from qstate.core.transport.shard_client import CHANNEL_OPTIONS
from qstate.proto import shard_pb2_grpc as pb_grpc

__all__ = ["ShardStubs"]


class ShardStubs:
    def __init__(self, timeout_s: float = DEFAULTS.shard_timeout_s,
                 cfg: Settings = DEFAULTS) -> None:
        self.cfg = cfg  # TLS and the cluster token of the shard API
        self.timeout_s = timeout_s
        self._stubs: dict[str, pb_grpc.ShardStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def stub(self, address: str) -> pb_grpc.ShardStub:
        stub = self._stubs.get(address)
        if stub is None:
            ch = security.aio_channel(address, self.cfg, CHANNEL_OPTIONS)
            self._channels.append(ch)
            stub = self._stubs[address] = pb_grpc.ShardStub(ch)
        return stub

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()
