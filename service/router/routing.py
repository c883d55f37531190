"""Key -> partition -> shard server, from the assignment and operator specs in storage.

The table is cached and refreshed in the background every ``refresh_s`` and on demand (a
miss, an unknown-partition answer, a connection error), at most every ``min_interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from qstate.core.address import PartitionId
from qstate.core.config import DEFAULTS
from qstate.core.records.assignment import Assignment, ServerInfo, list_servers, load_assignment
from qstate.core.records.operator import OperatorSpec, list_specs
from qstate.core.records.routers import RouterInfo, list_routers
from qstate.core.records.storage import Storage

__all__ = ["RoutingTable"]

log = logging.getLogger(__name__)


class RoutingTable:
    def __init__(self, storage: Storage, refresh_s: float = DEFAULTS.routing_refresh_s,
                 min_interval_s: float = DEFAULTS.routing_min_interval_s) -> None:
        self.servers: list[ServerInfo] = []
        self.routers: list[RouterInfo] = []  # registered: the cluster map's read addresses
        self.storage = storage
        self.refresh_s = refresh_s
        self.min_interval_s = min_interval_s
        # name the jobs it serves in an unknown job's 404 (the read engine words it): off
        # where client tokens scope what a caller may see (GET /v1/jobs then lists what the
        # caller's token may read)
        self.disclose_jobs = True
        self.assignments: dict[str, Assignment] = {}
        self.specs: dict[tuple[str, str], OperatorSpec] = {}
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        # told when the table changed (the read engine takes it: qstate.router.engine)
        self.on_change: Callable[[], None] | None = None

    def _load(self) -> tuple[dict[str, Assignment], dict[tuple[str, str], OperatorSpec],
                             list[ServerInfo], list[RouterInfo]]:
        specs = {(s.job, s.operator): s for s in list_specs(self.storage)}
        assignments = {job: load_assignment(self.storage, job) for job, _ in specs}
        return assignments, specs, list_servers(self.storage), list_routers(self.storage)

    async def refresh(self, force: bool = False) -> None:
        async with self._lock:
            if not force and time.monotonic() - self._loaded_at < self.min_interval_s:
                return
            try:
                loaded = await asyncio.to_thread(self._load)
            except Exception as exc:  # storage hiccup: keep serving the last table
                log.warning("routing refresh failed: %s", exc)
                return
            finally:
                self._loaded_at = time.monotonic()
            changed = loaded != (self.assignments, self.specs, self.servers, self.routers)
            self.assignments, self.specs, self.servers, self.routers = loaded
            if changed and self.on_change is not None:
                self.on_change()

    def read_at(self) -> dict[str, list[RouterInfo]]:
        """Server id -> the routers registered on its node, which read its partitions
        in-process: where the cluster map sends their keys (docs/architecture.md §5)."""
        by_node: dict[str, list[RouterInfo]] = {}
        for r in self.routers:
            by_node.setdefault(r.node, []).append(r)
        return {s.id: by_node.get(s.hostname, []) for s in self.servers if s.hostname}

    async def start(self) -> None:
        await self.refresh(force=True)
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh(force=True)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def jobs(self) -> dict[str, list[OperatorSpec]]:
        out: dict[str, list[OperatorSpec]] = {}
        for (job, _), spec in sorted(self.specs.items()):
            out.setdefault(job, []).append(spec)
        return out

    async def spec(self, job: str, operator: str) -> OperatorSpec | None:
        """The operator's spec, the table refreshed once when it does not know it; None when
        storage does not either (the read engine words the 404: ``QueryService.spec``)."""
        spec = self.specs.get((job, operator))
        if spec is None:
            await self.refresh()
            spec = self.specs.get((job, operator))
        return spec

    def owner_now(self, pid: PartitionId) -> str | None:
        """The owner's address in the cached table (None: unassigned or unknown)."""
        a = self.assignments.get(pid.job)
        return a.owner(pid.operator, pid.partition) if a is not None else None

    def followers_now(self, pid: PartitionId) -> list[str]:
        """Addresses of the partition's followers in the cached table."""
        a = self.assignments.get(pid.job)
        return a.follower_addresses(pid.operator, pid.partition) if a is not None else []

    async def owner(self, pid: PartitionId) -> str | None:
        """The owner's address, refreshing the table once when it names none."""
        address = self.owner_now(pid)
        if address is None:
            await self.refresh()
            address = self.owner_now(pid)
        return address

    async def moved(self, pid: PartitionId, address: str) -> bool:
        """After a failed call to ``address``: refresh, and say whether ``pid`` moved."""
        await self.refresh()
        return self.owner_now(pid) != address

    def partitions_of(self, job: str, operator: str) -> dict[str, list[int]]:
        a = self.assignments.get(job)
        return a.partitions_of(operator) if a is not None else {}
