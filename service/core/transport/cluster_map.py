"""Where a client sends each key: a job's cluster map (``GET /v1/cluster/{job}``), cached
(docs/architecture.md §5, cluster map; docs/querying.md).

The map names, per partition, its owner and the routers on the owner's node, which read it
in-process: a key asked there costs no hop. The map is a hint, never the authority: every
router answers every key (it forwards one it does not hold), and its answer names the
owner of the keys it read (``qstate-owner``). So a stale map (a partition moved, a router
gone) costs a hop or a fallback, never a wrong answer, and the client re-reads the map when
an answer names another owner than its map does, when a router on the map cannot be
reached, and at the latest every ``ttl_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from urllib.parse import quote

from qstate.core.address import partition_of
from qstate.core.answer import ClusterMap

__all__ = ["DOWN_S", "OWNER", "OWNER_URL", "Owners", "map_path"]

log = logging.getLogger(__name__)

# the headers (and gRPC trailing metadata) an answer names its keys' owner with, when one
# owner holds them all (the read engine's read::OWNER)
OWNER = "qstate-owner"
OWNER_URL = "qstate-owner-url"
# a router of the map that could not be reached is not asked again for this long
DOWN_S = 5.0


def map_path(job: str) -> str:
    """Where a router answers ``job``'s map."""
    return f"/v1/cluster/{quote(job, safe='')}"


class Owners:
    """The cluster maps of the jobs a client reads, each fetched at most every ``ttl_s`` (or
    when forgotten), and the routers it could not reach lately."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._maps: dict[str, tuple[float, dict[str, tuple[int, list[str | None],
                                                           list[str | None]]]]] = {}
        self._down: dict[str, float] = {}  # url -> until when it is not asked

    def wants(self, job: str) -> bool:
        """Whether ``job``'s map should be fetched (none yet, or older than ``ttl_s``)."""
        got = self._maps.get(job)
        return got is None or time.monotonic() - got[0] >= self.ttl_s

    def put(self, job: str, m: ClusterMap | None) -> None:
        """``job``'s map as fetched (None: the router has none to give, an older router or a
        job it does not know: every key of it goes to the client's router until ``ttl_s``)."""
        ops: dict[str, tuple[int, list[str | None], list[str | None]]] = {}
        for op in (m.operators if m is not None else []):
            urls: list[str | None] = [None] * op.partitions
            ids: list[str | None] = [None] * op.partitions
            for p in op.owners:
                if p.owner is not None and 0 <= p.partition < op.partitions:
                    ids[p.partition] = p.owner.server
                    urls[p.partition] = p.owner.read_at[0].url if p.owner.read_at else None
            ops[op.operator] = (op.partitions, ids, urls)
        self._maps[job] = (time.monotonic(), ops)

    def put_answer(self, job: str, status: int | None, body: bytes = b"") -> None:
        """``job``'s map from a router's answer to ``map_path`` (``status`` None: it could
        not be asked; anything but a 200 of a map: none to follow until ``ttl_s``)."""
        m = None
        if status == 200:
            try:
                m = ClusterMap.model_validate_json(body)
            except ValueError:
                m = None
        self.put(job, m)

    def forget(self, job: str) -> None:
        self._maps.pop(job, None)

    def _of(self, job: str, operator: str, key: str) -> tuple[str | None, str | None]:
        """The owner's id and a router on its node for ``key`` (None: not on the map)."""
        op = self._maps.get(job, (0.0, {}))[1].get(operator)
        if op is None:
            return None, None
        p = partition_of(key, op[0])
        return op[1][p], op[2][p]

    def url_of(self, job: str, operator: str, key: str) -> str | None:
        """Where to ask ``key``: a router on its owner's node, None: the client's router (not
        on the map, or that router was unreachable lately)."""
        url = self._of(job, operator, key)[1]
        if url is None or self._down.get(url, 0.0) > time.monotonic():
            return None
        return url

    def split(self, job: str, operator: str, keys: Sequence[str]) -> dict[str | None, list[int]]:
        """The indices of ``keys`` by where each is asked (``url_of``), in order."""
        out: dict[str | None, list[int]] = {}
        for i, k in enumerate(keys):
            out.setdefault(self.url_of(job, operator, k), []).append(i)
        return out

    def down(self, job: str, url: str, why: object) -> None:
        """``url`` could not be reached (``why``): not asked for ``DOWN_S``, and ``job``'s map
        re-read; its keys go to the client's router meanwhile."""
        log.warning("router %s of %s's cluster map unreachable (%r); asking the client's "
                    "router", url, job, why)
        self._down[url] = time.monotonic() + DOWN_S
        self.forget(job)

    def answered(self, job: str, operator: str, key: str, owner: str | None) -> None:
        """An answer about ``key`` named ``owner`` (its ``qstate-owner``): the map is
        forgotten when it names another (the partition moved since it was fetched)."""
        on_map = operator in self._maps.get(job, (0.0, {}))[1]
        if owner is not None and on_map and self._of(job, operator, key)[0] != owner:
            self.forget(job)
