"""The shape of every answer: one model for the router's HTTP and gRPC front ends and the
Python client (docs/architecture.md §5). The OpenAPI document is generated from these models and the
server serializes these same models, so what is documented is what is served.

Answers grow, never change: a later router may add a field, and a client parses an answer
with fields it does not know by ignoring them, so clients need not be upgraded with the
routers (the schema does not forbid other properties either). Removing or renaming a field
is a new API version (docs/architecture.md §5, compatibility).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, TypeAdapter
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

__all__ = [
    "NEXT_FROM",
    "BatchAnswer",
    "BatchValues",
    "ClusterInfo",
    "ClusterMap",
    "ErrorBody",
    "JobInfo",
    "JobList",
    "JobPosition",
    "JobSummary",
    "OperatorInfo",
    "OperatorMap",
    "PartitionHolder",
    "PartitionOwners",
    "PartitionStatus",
    "Point",
    "ReadAddress",
    "Series",
    "ShardStatus",
    "StateAnswer",
    "StateInfo",
    "StateValues",
    "TopAnswer",
    "TopEntry",
    "WatchEvent",
    "Window",
    "WindowInfo",
    "WindowSpan",
    "WindowValue",
    "batch_values",
    "error_responses",
]

# unknown fields are ignored, not refused: an older client reads a newer router's answers
_OPEN = ConfigDict(extra="ignore")


class Window(BaseModel):
    model_config = _OPEN

    start: int | None = Field(description="Window start, epoch ms (null: not windowed)")
    end: int | None = Field(description="Window end, epoch ms, exclusive (null: not windowed)")
    value: int | float | None = Field(description="The aggregate; counts are exact integers")


class StateAnswer(BaseModel):
    """One key of one state: its latest window, or its windows in a time range, as of a batch."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{
        "job": "tweets", "operator": "per_tweet_1h", "state": "impressions", "key": "tw-42",
        "found": True, "batch": 311, "watermark": 1767225590000,
        "windows": [{"start": 1767225600000, "end": 1767229200000, "value": 17}]}]})

    job: str
    operator: str
    state: str
    key: str
    found: bool = Field(description="False: the key has no data as of `batch`")
    batch: int = Field(description="The job's batch this answer reflects (-1: none yet)")
    watermark: int = Field(description="The event-time watermark at that batch, epoch ms")
    windows: list[Window] = Field(description="Oldest first; the latest window alone when no "
                                  "time range was asked")
    next_from: int | None = Field(None, description="Set only when the range held more than "
                                  "`limit` windows: the start of the next one, epoch ms. Ask "
                                  "again with from=next_from (same to) for the next page; "
                                  "null: nothing more")

    @property
    def latest(self) -> Window | None:
        return self.windows[-1] if self.windows else None


class BatchAnswer(BaseModel):
    model_config = _OPEN

    results: list[StateAnswer] = Field(description="One per key asked, in the same order")


class WindowValue(TypedDict):
    """A ``Window``'s fields that a reader of values needs (``StateValues``)."""

    end: int | None
    value: int | float | None


class StateValues(TypedDict):
    """A ``StateAnswer``'s fields that a reader of values needs, as plain dicts: what a hot
    reader (the Feast store: docs/feast.md, speed) parses a ``:batchGet`` answer into, at half
    the models' cost (200 answers: 0.23 ms, 0.44 through ``BatchAnswer``). The same answer
    read through fewer fields, never a shape of its own: tests/service/core/test_answer.py
    holds each field to the model's."""

    found: bool
    batch: int
    watermark: int
    windows: list[WindowValue]


class BatchValues(TypedDict):
    results: list[StateValues]


_BATCH_VALUES = TypeAdapter(BatchValues)


def batch_values(body: bytes) -> list[StateValues]:
    """A ``BatchAnswer``'s JSON as ``StateValues``, one per key asked, in order; validated as
    the model validates them (a ``pydantic.ValidationError`` otherwise)."""
    return _BATCH_VALUES.validate_json(body)["results"]


class JobPosition(BaseModel):
    """The batch of a job that counted one Kafka record: read with ``min_batch`` set to it
    and the answer counts the record."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{
        "job": "tweets", "topic": "tweets", "partition": 2, "offset": 81234, "batch": 311,
        "end_offset": 81766}]})

    job: str
    topic: str
    partition: int
    offset: int
    batch: int = Field(description="The first batch recorded whose end is past the offset: "
                       "the batch that counted the record (for a record older than the "
                       "manifests kept, a later one that has counted it too)")
    end_offset: int = Field(description="Where that batch ended in the partition, exclusive")


class WindowSpan(BaseModel):
    model_config = _OPEN

    start: int = Field(description="Window start, epoch ms")
    end: int = Field(description="Window end, epoch ms, exclusive")


class TopEntry(BaseModel):
    model_config = _OPEN

    key: str
    value: int | float = Field(description="The key's value of the state in the window")


class TopAnswer(BaseModel):
    """The keys with the largest (or smallest) values of one state in one window, across
    every partition, ties broken by key."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{
        "job": "tweets", "operator": "per_tweet_1h", "state": "impressions",
        "window": {"start": 1767225600000, "end": 1767229200000}, "order": "desc",
        "batch": 311, "watermark": 1767225590000,
        "entries": [{"key": "tw-42", "value": 17}, {"key": "tw-7", "value": 11}]}]})

    job: str
    operator: str
    state: str
    window: WindowSpan | None = Field(description="The window ranked (null: not windowed)")
    order: str = Field(description="desc: largest first; asc: smallest first")
    batch: int = Field(description="The lowest batch of the partitions read: every "
                       "partition's part is as of this batch or a later one (-1: none yet)")
    watermark: int = Field(description="The lowest watermark of those partitions, epoch ms")
    entries: list[TopEntry] = Field(description="At most n, in order; ties by key, ascending")


class WatchEvent(BaseModel):
    """One pushed event of a watch: after a committed batch, the watched keys whose value
    changed (or the board, when it changed). SSE sends it as ``data`` with ``id`` = its
    ``batch``: reconnect with ``Last-Event-ID`` (or ``from_batch``) to get what changed
    since."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{
        "job": "tweets", "operator": "per_tweet_1h", "state": "impressions", "batch": 312,
        "watermark": 1767225595000, "committed_at": 1767225601250, "coalesced": False,
        "snapshot": False, "changes": [{
            "job": "tweets", "operator": "per_tweet_1h", "state": "impressions",
            "key": "tw-42", "found": True, "batch": 312, "watermark": 1767225595000,
            "windows": [{"start": 1767225600000, "end": 1767229200000, "value": 18}],
            "next_from": None}], "top": None}]})

    job: str
    operator: str
    state: str
    batch: int = Field(description="Every value here is as of this batch or a later one, "
                       "and every change up to it has been sent: resume after it")
    watermark: int = Field(description="The lowest watermark of the values here, epoch ms")
    committed_at: int | None = Field(description="When a shard applied the oldest batch "
                                     "whose change this carries, epoch ms (null: unknown, "
                                     "e.g. a first event)")
    coalesced: bool = Field(description="True: a value changed more than once before this "
                            "watcher took it; only the latest is sent")
    snapshot: bool = Field(description="True: every watched key is here (the first event, "
                           "or a resume this router could not serve incrementally): "
                           "replace what you hold. False: only the keys that changed")
    changes: list[StateAnswer] = Field(description="Keys form: each changed key's latest "
                                       "window (found false: it has none now)")
    top: TopAnswer | None = Field(description="Top form: the whole board (null in the keys "
                                  "form)")


class Point(BaseModel):
    """One window of a key as a point of a time series: the flat row a dashboard reads
    (Grafana's Infinity datasource)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{
        "time": 1767225600000, "value": 17}]})

    time: int = Field(description="Window start, epoch ms (a state without windows: the "
                      "watermark its value is as of)")
    value: int | float | None = Field(description="The aggregate; counts are exact integers")


class Series(RootModel[list[Point]]):
    """A key's windows as points, oldest first; empty when the key has no data. A range
    that held more than ``limit`` windows says where the next page starts in the
    ``NEXT_FROM`` header (a JSON array has no room for it)."""


NEXT_FROM = "Next-From"


class ErrorBody(BaseModel):
    """Every 4xx/5xx body. ``error`` names the failure (a class of qstate.core.errors)."""

    model_config = ConfigDict(extra="ignore", json_schema_extra={"examples": [{
        "error": "NotFound", "message": 'key "tw-9" has no data in tweets/per_tweet_1h/'
        "impressions as of batch 311", "batch": 311, "watermark": 1767225590000}]})

    error: str = Field(description="What failed: InvalidRequest, InvalidAddress, NotFound, "
                       "UnknownOperator, Unavailable, ...")
    message: str = Field(description="What happened and what to do about it")
    batch: int | None = Field(None, description="404 of a key: the batch it is absent as of; "
                              "503 of a min_batch read: the batch the partition has")
    watermark: int | None = Field(None, description="404 of a key: the watermark then")
    job: str | None = None
    operator: str | None = None
    state: str | None = None
    partition: int | None = Field(None, description="503: the partition that cannot answer")
    retry_after_s: float | None = Field(None, description="503, 429: when to ask again (also "
                                        "the Retry-After header, in whole seconds)")
    limit_bytes: int | None = Field(None, description="413: the largest body accepted")


class StateInfo(BaseModel):
    model_config = _OPEN

    name: str
    type: str = Field(description="long | double")


class WindowInfo(BaseModel):
    model_config = _OPEN

    kind: str = Field(description="tumbling | sliding | session | none")
    size_ms: int
    slide_ms: int
    gap_ms: int


class OperatorInfo(BaseModel):
    model_config = _OPEN

    name: str
    key: str = Field(description="The grouping column")
    states: list[StateInfo]
    window: WindowInfo
    partitions: int
    partitions_available: int = Field(description="Partitions answering now")
    retention_ms: int
    last_batch: int = Field(description="Lowest last batch over the operator's partitions: "
                            "every key answers as of at least this batch")
    watermark: int = Field(description="Lowest watermark over its partitions, epoch ms")


class JobInfo(BaseModel):
    model_config = _OPEN

    name: str
    operators: list[OperatorInfo]


class JobSummary(BaseModel):
    model_config = _OPEN

    name: str
    operators: list[str]


class JobList(BaseModel):
    model_config = _OPEN

    jobs: list[JobSummary]


class PartitionStatus(BaseModel):
    model_config = _OPEN

    job: str
    operator: str
    partition: int
    state: str = Field(description="ready | restoring | down (its owner did not report it) | "
                       "unassigned")
    last_batch: int | None = Field(description="The last batch its owner applied (null: not "
                                   "reported; -1: none yet)")
    watermark: int | None = Field(description="Its event-time watermark, epoch ms")
    freshness_s: float | None = Field(description="How far its state trails real time: now - "
                                      "watermark, seconds (null: no batch yet)")


class ShardStatus(BaseModel):
    model_config = _OPEN

    id: str = Field(description="Server id")
    address: str = Field(description="host:port of its internal gRPC API")
    up: bool = Field(description="It answered Describe just now")
    partitions: list[PartitionStatus] = Field(description="The partitions the assignment gives "
                                              "it, by job, operator, partition")
    following: list[PartitionStatus] = Field(
        default_factory=list, description="The partitions it holds a copy of (a follower: "
        "replicas > 1, or the incoming owner of a move), as it reports them")


class ClusterInfo(BaseModel):
    """Every shard server, the partitions it owns and those it follows, as the router sees them
    now."""

    model_config = _OPEN

    now: int = Field(description="When this was taken, epoch ms (freshness is measured to it)")
    shards: list[ShardStatus]
    unassigned: list[PartitionStatus] = Field(description="Partitions no server owns")


class ReadAddress(BaseModel):
    """A router a partition's keys may be read at: one on the node of the server holding it,
    which reads it in-process (no hop)."""

    model_config = _OPEN

    router: str = Field(description="Router id")
    url: str = Field(description="Its HTTP API, http(s)://host:port")
    grpc: str = Field(description="Its public gRPC port, host:port")


class PartitionHolder(BaseModel):
    model_config = _OPEN

    server: str = Field(description="Shard server id")
    ready: bool = Field(description="It reported the partition just now and is not restoring "
                        "it")
    read_at: list[ReadAddress] = Field(description="Routers on its node (none: ask any "
                                       "router, which forwards)")


class PartitionOwners(BaseModel):
    model_config = _OPEN

    partition: int
    owner: PartitionHolder | None = Field(description="Null: unassigned")
    followers: list[PartitionHolder] = Field(
        default_factory=list, description="Copies that answer reads a caller allows to be "
        "stale (replicas > 1, or the incoming owner of a move)")


class OperatorMap(BaseModel):
    model_config = _OPEN

    operator: str
    partitions: int = Field(description="P: a key's partition is pmod(xxhash64(utf8(key), "
                            "seed=42), P) on the signed 64-bit hash")
    owners: list[PartitionOwners] = Field(description="One per partition, in order")


class ClusterMap(BaseModel):
    """Where each partition of a job is read: what a client caches to send each key (each
    batch split by owner) straight to a router on its owner's node (docs/querying.md,
    cluster map). A router answers every key whatever the map says (it forwards one it does
    not hold, naming its owner in ``qstate-owner``), so a stale map costs a hop, never a
    wrong answer."""

    model_config = _OPEN

    job: str
    epoch: int = Field(description="The job's assignment epoch: every move bumps it")
    operators: list[OperatorMap]


def error_responses(body: bool = False) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of every route that reads state (for FastAPI's
    ``responses``); ``body``: the route takes a request body (413)."""
    retry = {"Retry-After": {"description": "Seconds to wait before asking again",
                             "schema": {"type": "integer"}}}
    out: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorBody, "description": "Invalid name, key, body, time range or "
                                                 "limit; the message says what to fix"},
        401: {"model": ErrorBody, "description": "The router asks for a token and none, or "
                                                 "one it does not know, was sent"},
        403: {"model": ErrorBody, "description": "The token may not read this job (or "
                                                 "operator)"},
        404: {"model": ErrorBody,
              "description": "Unknown job/operator/state, or no data for the key"},
        429: {"model": ErrorBody, "headers": retry,
              "description": "The router has more requests in flight, or more keys waiting "
                             "for one shard, than it takes (QSTATE_MAX_CONCURRENT_REQUESTS, "
                             "QSTATE_MAX_SHARD_QUEUE); retry after Retry-After"},
        503: {"model": ErrorBody, "headers": retry,
              "description": "The owning shard is unavailable or restoring; retry after "
                             "Retry-After"},
    }
    if body:
        out[413] = {"model": ErrorBody, "description": "A request body larger than the "
                                                       "router takes (QSTATE_MAX_BODY_BYTES)"}
    return out
