"""``QStateOnlineStore``: Feast's online store over a running streaming job's state
(docs/feast.md). Feast asks it for feature views' values by entity key; it reads them from a
qstate router (a ``:batchGet`` of an operator's states as qstate's client sends it, through
``qstate.feast.wire``, chunked at the batch-key cap), every answer of one operator in one call
at one batch (``qstate.feast.reads``). It writes nothing: the job writes the state, so ``feast
materialize`` and push sources are refused, and ``teardown`` removes nothing.

Feast finds the store by the class path in ``feature_store.yaml`` (``type:
qstate.feast.QStateOnlineStore``) and its configuration class beside it, by name.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
from feast import utils as feast_utils
from feast.entity import Entity
from feast.feature_view import FeatureView
from feast.infra.online_stores.online_store import OnlineStore
from feast.infra.supported_async_methods import SupportedAsyncMethods
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.repo_config import FeastConfigBaseModel, RepoConfig
from pydantic import Field, StrictStr

from qstate.client import Client
from qstate.core.answer import JobInfo, StateValues
from qstate.core.config import settings
from qstate.core.errors import InvalidRequest, QStateError, Unavailable
from qstate.feast.config import ViewSource
from qstate.feast.errors import served
from qstate.feast.mapping import key_of, problems
from qstate.feast.reads import Ask, Marks, Row, ViewRead, rounds
from qstate.feast.wire import Wire, unreachable

__all__ = ["QStateOnlineStore", "QStateOnlineStoreConfig"]

log = logging.getLogger(__name__)


class QStateOnlineStoreConfig(FeastConfigBaseModel):
    """The qstate online store: the router to ask and what each feature view reads
    (``qstate.feast.config``). What is not given comes from qstate's own settings
    (QSTATE_ROUTER_URL, QSTATE_TOKEN, QSTATE_TOKEN_FILE, QSTATE_TLS_CA,
    QSTATE_MAX_BATCH_KEYS), as for ``qstate get``."""

    type: Literal["qstate.feast.QStateOnlineStore"] = "qstate.feast.QStateOnlineStore"
    url: StrictStr | None = Field(None, description="The router's HTTP URL")
    token: StrictStr | None = Field(None, description="A client token (qstate token add)")
    token_file: StrictStr | None = Field(None, description="A file holding the client token")
    ca: StrictStr | None = Field(None, description="CA bundle of an https:// router")
    timeout_s: float = Field(5.0, gt=0, description="Seconds per request to the router")
    retries: int = Field(3, ge=0, description="Times a 503 or 429 is asked again")
    batch_keys: int | None = Field(None, ge=1, description="Answers (keys × states) per "
                                   "batch read (the router's QSTATE_MAX_BATCH_KEYS)")
    max_rounds: int = Field(8, ge=1, description="Reads of one call before giving up on "
                            "answering it at one batch")
    direct: bool | None = Field(None, description="Ask each key at a router on its owner's "
                                "node, as the job's cluster map names it (None: "
                                "QSTATE_CLIENT_DIRECT)")
    allow_stale: bool | None = Field(None, description="When a partition's owner cannot "
                                     "answer, let a follower of it (an operator with "
                                     "replicas) answer as of its own batch (None: "
                                     "QSTATE_CLIENT_ALLOW_STALE)")
    feature_views: dict[StrictStr, ViewSource] = Field(
        default_factory=dict, description="Feature view name -> where it lives")

    def client_args(self) -> dict[str, Any]:
        return {"url": self.url, "timeout": self.timeout_s, "retries": self.retries,
                "ca": self.ca, "token": self.token, "token_file": self.token_file,
                "allow_stale": self.allow_stale}

    def cap(self) -> int:
        return self.batch_keys or settings().max_batch_keys

    def router(self) -> str:
        return self.url or settings().router_url

    def wire(self) -> Wire:
        s = settings()
        return Wire(self.url, self.timeout_s, self.retries, self.ca, self.token,
                    self.token_file, direct=s.client_direct if self.direct is None
                    else self.direct, map_ttl_s=s.client_map_ttl_s,
                    allow_stale=s.client_allow_stale if self.allow_stale is None
                    else self.allow_stale)


def _cfg(config: RepoConfig) -> QStateOnlineStoreConfig:
    cfg = config.online_store
    assert isinstance(cfg, QStateOnlineStoreConfig), type(cfg)
    return cfg


def _view(cfg: QStateOnlineStoreConfig, table: FeatureView,
          entity_keys: Sequence[EntityKeyProto], requested: Sequence[str] | None) -> ViewRead:
    """``table``'s part of a read: only the states of the features asked."""
    source = cfg.feature_views.get(table.name)
    if source is None:
        raise InvalidRequest(f"feature view {table.name!r} is not mapped: add "
                             f"online_store.feature_views.{table.name} to feature_store.yaml")
    asked = None if requested is None else set(requested)
    features = tuple((f.name, source.state_of(f.name), f.dtype.to_value_type())
                     for f in table.features if asked is None or f.name in asked)
    return ViewRead(source.job, source.operator, source.window, features,
                    tuple(key_of(k) for k in entity_keys), table.ttl)


def _range(ask: Ask) -> dict[str, Any]:
    """A closed window is a range read of the one window starting at ``start``."""
    if ask.start is None:
        return {"min_batch": ask.min_batch}
    return {"from_": ask.start, "to": ask.start + 1, "min_batch": ask.min_batch}


def _chunks(which: Sequence[int], cap: int) -> list[list[int]]:
    return [list(which[i:i + cap]) for i in range(0, len(which), cap)]


@dataclass(frozen=True, slots=True)
class Call:
    """One request of a round: keys ``which`` (indices into the ask's keys) of ask ``ask``
    (the round's ``index``-th), asked at the router ``at`` (None: the store's)."""

    index: int
    ask: Ask
    which: list[int]
    at: str | None = None

    @property
    def keys(self) -> list[str]:
        return [self.ask.keys[i] for i in self.which]


def _calls(asks: list[Ask], cap: int, wire: Wire) -> list[Call]:
    """A round's requests: each ask's keys by the router they are asked at (``wire.split``:
    one group, the store's router, unless ``direct``), in chunks of at most ``cap`` answers
    (keys × states)."""
    return [Call(i, a, chunk, at) for i, a in enumerate(asks)
            for at, which in wire.split(a.job, a.operator, a.keys).items()
            for chunk in _chunks(which, max(1, cap // len(a.states)))]


def _regroup(asks: list[Ask], calls: list[Call], got: list[list[StateValues]]
             ) -> list[list[StateValues]]:
    """The requests' answers (in the order of ``calls``) as one list per ask, keys in the
    ask's order, each key's states in order."""
    out: list[list[StateValues | None]] = [[None] * (len(a.keys) * len(a.states))
                                           for a in asks]
    for c, answers in zip(calls, got, strict=True):
        width = len(c.ask.states)
        for j, key in enumerate(c.which):
            out[c.index][key * width:(key + 1) * width] = answers[j * width:(j + 1) * width]
    return [[a for a in answers if a is not None] for answers in out]


def _drive(gen: Generator[list[Ask], list[list[StateValues]], list[list[Row]]],
           fetch: Callable[[list[Ask]], list[list[StateValues]]]) -> list[list[Row]]:
    asks = next(gen)
    while True:
        try:
            asks = gen.send(fetch(asks))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _unreachable(cfg: QStateOnlineStoreConfig, exc: Exception) -> Unavailable:
    return unreachable(cfg.router(), cfg.timeout_s, exc)


class QStateOnlineStore(OnlineStore):
    """Feast's online store, read from qstate (docs/feast.md)."""

    def __init__(self) -> None:
        self._marks = Marks()
        self._lock = threading.Lock()
        self._client: Client | None = None  # describe, jobs: a few calls, not per read
        self._wire: Wire | None = None
        self._pool: ThreadPoolExecutor | None = None  # a read's requests beyond its first
        self._hop: ThreadPoolExecutor | None = None  # online_read_async's reads

    @property
    def async_supported(self) -> SupportedAsyncMethods:
        # feast serve reads through online_read_async on its own loop when this says so; the
        # read itself runs on a thread (``_aread``), which keeps the loop free
        return SupportedAsyncMethods(read=True, write=False)

    # -- clients -------------------------------------------------------------------------

    def _sync(self, cfg: QStateOnlineStoreConfig) -> tuple[Client, Wire, ThreadPoolExecutor]:
        with self._lock:  # feast serve's sync path reads from a thread pool
            if self._client is None or self._wire is None or self._pool is None:
                self._client = Client(**cfg.client_args())
                self._wire = cfg.wire()
                self._pool = ThreadPoolExecutor(4, thread_name_prefix="qstate-feast")
            return self._client, self._wire, self._pool

    # -- reads ---------------------------------------------------------------------------

    def _read(self, config: RepoConfig, views: list[ViewRead]) -> list[list[Row]]:
        cfg = _cfg(config)
        client, wire, pool = self._sync(cfg)
        cap = cfg.cap()
        try:
            for job in self._undescribed(views):
                self._learn(client.describe(job))

            def one(c: Call) -> list[StateValues]:
                a = c.ask
                return wire.multi_get_states(a.job, a.operator, a.states, c.keys, at=c.at,
                                             **_range(a))

            def fetch(asks: list[Ask]) -> list[list[StateValues]]:
                # a round's requests at once (one per operator and window, and per chunk):
                # all but the first on the pool, the first here; answers in the order asked
                calls = _calls(asks, cap, wire)
                if len(calls) == 1:  # the usual round: one ask, one chunk
                    return [one(calls[0])]
                later = [pool.submit(one, c) for c in calls[1:]]
                got = [one(calls[0]), *(f.result() for f in later)] if calls else []
                return _regroup(asks, calls, got)

            return _drive(rounds(views, self._marks, cfg.max_rounds, datetime.now(UTC)),
                          fetch)
        except httpx.TransportError as exc:
            raise served(_unreachable(cfg, exc)) from exc
        except QStateError as exc:
            raise served(exc) from exc

    async def _aread(self, config: RepoConfig, views: list[ViewRead]) -> list[list[Row]]:
        """``_read`` on a thread of its own: the caller's loop (feast serve's) goes on
        answering while the reads wait on the router."""
        with self._lock:
            if self._hop is None:
                self._hop = ThreadPoolExecutor(8, thread_name_prefix="qstate-feast-read")
            hop = self._hop
        return await asyncio.get_running_loop().run_in_executor(hop, self._read, config, views)

    def _undescribed(self, views: list[ViewRead]) -> set[str]:
        """Jobs with a closed window whose operator's window is not known yet."""
        return {v.job for v in views
                if v.window == "closed" and (v.job, v.operator) not in self._marks.operators}

    def _learn(self, info: JobInfo) -> None:
        for op in info.operators:
            self._marks.operators[(info.name, op.name)] = op

    def online_read(self, config: RepoConfig, table: FeatureView,
                    entity_keys: list[EntityKeyProto],
                    requested_features: list[str] | None = None
                    ) -> list[tuple[datetime | None, dict[str, ValueProto] | None]]:
        """Each entity key's features (None, None when the key has no data)."""
        return self._read(config, [self._plan(config, table, entity_keys,
                                              requested_features)])[0]

    async def online_read_async(self, config: RepoConfig, table: FeatureView,
                                entity_keys: list[EntityKeyProto],
                                requested_features: list[str] | None = None
                                ) -> list[tuple[datetime | None,
                                                dict[str, ValueProto] | None]]:
        """``online_read`` on the caller's event loop."""
        return (await self._aread(config, [self._plan(config, table, entity_keys,
                                                      requested_features)]))[0]

    def _plan(self, config: RepoConfig, table: FeatureView,
              entity_keys: Sequence[EntityKeyProto], requested: Sequence[str] | None
              ) -> ViewRead:
        try:
            return _view(_cfg(config), table, entity_keys, requested)
        except QStateError as exc:
            raise served(exc) from exc

    # Feast reads a get_online_features call one feature view at a time through these two
    # (its Redis store overrides them to pipeline); here every view of the call is read in
    # the same rounds, so the views of one job answer at one batch too.

    def _read_features_per_fv(self, config: RepoConfig, grouped_refs: list[Any],
                              join_key_values: dict[str, Any],
                              entity_name_to_join_key_map: dict[str, str],
                              online_features_response: Any, full_feature_names: bool,
                              include_feature_view_version_metadata: bool) -> None:
        parts = self._parts(config, grouped_refs, join_key_values, entity_name_to_join_key_map)
        rows = self._read(config, [p[0] for p in parts])
        self._populate(parts, rows, online_features_response, full_feature_names,
                       include_feature_view_version_metadata)

    async def _read_features_per_fv_async(self, config: RepoConfig, grouped_refs: list[Any],
                                          join_key_values: dict[str, Any],
                                          entity_name_to_join_key_map: dict[str, str],
                                          online_features_response: Any,
                                          full_feature_names: bool,
                                          include_feature_view_version_metadata: bool
                                          ) -> None:
        parts = self._parts(config, grouped_refs, join_key_values, entity_name_to_join_key_map)
        rows = await self._aread(config, [p[0] for p in parts])
        self._populate(parts, rows, online_features_response, full_feature_names,
                       include_feature_view_version_metadata)

    def _parts(self, config: RepoConfig, grouped_refs: list[Any],
               join_key_values: dict[str, Any], entity_name_to_join_key_map: dict[str, str]
               ) -> list[tuple[ViewRead, FeatureView, list[str], Any, int]]:
        out = []
        for table, requested in grouped_refs:
            values, idxs, output_len = feast_utils._get_unique_entities(
                table, join_key_values, entity_name_to_join_key_map)
            keys = feast_utils._get_entity_key_protos(values)
            out.append((self._plan(config, table, keys, requested), table, requested, idxs,
                        output_len))
        return out

    @staticmethod
    def _populate(parts: list[tuple[ViewRead, FeatureView, list[str], Any, int]],
                  rows: list[list[Row]], response: Any, full_feature_names: bool,
                  version_metadata: bool) -> None:
        for (_, table, requested, idxs, output_len), read in zip(parts, rows, strict=True):
            feast_utils._populate_response_from_feature_data(
                requested, read, idxs, response, full_feature_names, table, output_len,
                version_metadata)

    # -- writes and infrastructure -------------------------------------------------------

    def online_write_batch(self, config: RepoConfig, table: FeatureView, data: list[Any],
                           progress: Callable[[int], Any] | None) -> None:
        """Refused: the streaming job writes this state (docs/feast.md, writes)."""
        source = _cfg(config).feature_views.get(table.name)
        where = f"{source.job}/{source.operator}" if source else "a qstate job"
        raise served(InvalidRequest(
            f"feature view {table.name!r} is served by qstate from {where}: the streaming "
            "job writes its state, so `feast materialize`, push sources and "
            "write_to_online_store cannot; write the events to the job's topic instead "
            "(docs/feast.md)"))

    async def online_write_batch_async(self, config: RepoConfig, table: FeatureView,
                                       data: list[Any],
                                       progress: Callable[[int], Any] | None) -> None:
        self.online_write_batch(config, table, data, progress)

    def update(self, config: RepoConfig, tables_to_delete: Sequence[FeatureView],
               tables_to_keep: Sequence[FeatureView], entities_to_delete: Sequence[Entity],
               entities_to_keep: Sequence[Entity], partial: bool) -> None:
        """``feast apply``: every online feature view kept must be served as mapped (its job,
        operator and states against the router's ``GET /v1/jobs``, its join key and dtypes);
        refused, naming each problem, otherwise. Creates nothing."""
        cfg = _cfg(config)
        tables = [t for t in tables_to_keep if getattr(t, "online", True)]
        client = self._sync(cfg)[0]
        try:
            served_jobs = {j.name for j in client.jobs().jobs}
            wanted = {s.job for t in tables if (s := cfg.feature_views.get(t.name))}
            described = {job: client.describe(job) for job in wanted & served_jobs}
        except httpx.TransportError as exc:
            raise served(_unreachable(cfg, exc)) from exc
        except QStateError as exc:
            raise served(exc) from exc
        found: list[str] = []
        for t in tables:
            source = cfg.feature_views.get(t.name)
            found += problems(t, source, served_jobs,
                              described.get(source.job) if source else None)
        if found:
            raise served(InvalidRequest(
                "qstate cannot serve these feature views as feature_store.yaml maps them:\n  "
                + "\n  ".join(found)))
        for job in described.values():
            self._learn(job)

    def teardown(self, config: RepoConfig, tables: Sequence[FeatureView],
                 entities: Sequence[Entity]) -> None:
        """Removes nothing: the state is the job's, and other readers read it."""
        log.info("feast teardown: qstate keeps %s's state (the job's; docs/feast.md)",
                 sorted({s.job for s in _cfg(config).feature_views.values()}))

    async def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            if self._wire is not None:
                self._wire.close()
            for pool in (self._pool, self._hop):
                if pool is not None:
                    pool.shutdown(wait=False)
            self._client, self._wire, self._pool, self._hop = None, None, None, None
