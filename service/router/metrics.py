"""Prometheus metrics of a router. No per-key labels: an HTTP route is its template
(``/v1/state/{job}/{operator}/{state}/{key}``), never the path asked."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from qstate._engine import LATENCY_BUCKETS
from qstate.core.errors import (
    Forbidden,
    Overloaded,
    QStateError,
    TooLarge,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "BOARD_ANSWERS",
    "CATCHUPS",
    "ENGINE_PANICS",
    "FOLLOWER_READS",
    "FRONT_REQUESTS",
    "GRPC_LATENCY",
    "GRPC_REQUESTS",
    "HTTP_LATENCY",
    "HTTP_REQUESTS",
    "KEYS_WAITING",
    "LOCAL_READS",
    "METHODS",
    "REFUSED",
    "REMOTE_READS",
    "SHARD_READS",
    "UNAVAILABLE",
    "UNAVAILABLE_REASONS",
    "WATCHERS",
    "WATCH_COALESCED",
    "WATCH_DELAY",
    "WATCH_EVENTS",
    "WATCH_FAILURES",
    "count_error",
    "exposition",
    "http_method",
]

# the engine's bounds, so its histograms join these bucket by bucket (add_engine_counts)
_BUCKETS = tuple(LATENCY_BUCKETS)
# the method label takes these, anything else is "other": a client cannot make new series
METHODS = frozenset({"GET", "POST", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"})

HTTP_REQUESTS = Counter("qstate_router_http_requests_total",
                        "HTTP requests by route template (unmatched: no route), method and "
                        "status", ["route", "method", "status"])
HTTP_LATENCY = Histogram("qstate_router_http_request_seconds",
                         "HTTP request latency by route template", ["route"], buckets=_BUCKETS)
GRPC_REQUESTS = Counter("qstate_router_grpc_requests_total", "gRPC requests", ["method", "code"])
GRPC_LATENCY = Histogram("qstate_router_grpc_request_seconds", "gRPC latency", ["method"],
                         buckets=_BUCKETS)
SHARD_READS = Counter("qstate_router_shard_reads_total",
                      "Key lookups (and partitions a top-N reads) by path: local (in-process "
                      "from a co-located shard's files), remote (the owner's gRPC API, "
                      "coalesced) or follower (a copy's gRPC API, when the owner is down or "
                      "restoring)", ["path"])
LOCAL_READS, REMOTE_READS = SHARD_READS.labels("local"), SHARD_READS.labels("remote")
FOLLOWER_READS = SHARD_READS.labels("follower")
CATCHUPS = Histogram("qstate_router_catchup_seconds",
                     "Co-located partitions caught up with their shard's commits (or opened) "
                     "by the read engine, by who did it: read (a read waited for it) or "
                     "follower (off the read path, QSTATE_ROUTER_FOLLOW_MS)", ["by"],
                     buckets=_BUCKETS)
# every reason a router answers 503 for (``Unavailable.reason``), each a series from the start
UNAVAILABLE_REASONS = ("no-owner", "shard-down", "shard-timeout", "restoring", "moving",
                       "shard-refused", "behind")
UNAVAILABLE = Counter("qstate_router_unavailable_total",
                      "Answers 503 (HTTP) or UNAVAILABLE (gRPC) by reason: no-owner (the "
                      "partition has no shard server yet), shard-down (its owner cannot be "
                      "reached), shard-timeout (its owner did not answer in "
                      "QSTATE_SHARD_TIMEOUT_S), restoring, moving (between owners), "
                      "shard-refused (the shard refused this router's cluster token), behind "
                      "(a min_batch read whose partition did not reach it in "
                      "QSTATE_MIN_BATCH_WAIT_S)",
                      ["reason"])

FRONT_REQUESTS = Counter(
    "qstate_router_front_requests_total",
    "Requests of the native front by route template (other: not a read; grpc:Get, "
    "grpc:MultiGet, grpc:other: calls of the gRPC port) and who answered: engine (the read "
    "core, on the engine's threads) or app (handed to the Python app or gRPC server behind "
    "it)", ["route", "answered_by"])
ENGINE_PANICS = Counter(
    "qstate_router_engine_panics_total",
    "Panics the read engine caught, by where: front (a request, answered 500), accept (a "
    "connection being handed out, lost), call (a call from Python, raised as EngineFailed), "
    "follower (a pass of the follower), grpc (a read call of the gRPC port, answered "
    "INTERNAL); each one a bug to report", ["at"])
for _at in ("front", "accept", "call", "follower"):
    ENGINE_PANICS.labels(_at)
KEYS_WAITING = Gauge(
    "qstate_router_shard_keys_waiting",
    "Keys the router has asked of shard servers (owners, followers) whose answers have not "
    "come yet: queued to leave in a MultiGet or in one in flight (QSTATE_MAX_SHARD_QUEUE "
    "bounds the queue of each shard)", multiprocess_mode="livesum")

REFUSED = Counter("qstate_router_refused_total",
                  "Requests refused before any lookup, HTTP and gRPC, by reason: "
                  "unauthenticated (no or unknown token), forbidden (token without the "
                  "scope), too-large (body over QSTATE_MAX_BODY_BYTES), overloaded (over "
                  "QSTATE_MAX_CONCURRENT_REQUESTS or QSTATE_MAX_SHARD_QUEUE)", ["reason"])


# A counter with labels has no series until a child is made: a dashboard shows "No data"
# where it means 0. The children a fresh router can count are made now, at 0.
for _reason in UNAVAILABLE_REASONS:
    UNAVAILABLE.labels(_reason)

BOARD_ANSWERS = Counter("qstate_router_top_answers_total",
                        "Top-N answers (HTTP and gRPC) by how: kept (the board the router "
                        "keeps current while it is asked, re-read once per batch) or read "
                        "(asked of the shards now: min_batch, a window named, a board not "
                        "kept yet or whose last refresh failed)", ["how"])
for _how in ("kept", "read"):
    BOARD_ANSWERS.labels(_how)
WATCH_FORMS = ("keys", "top")
WATCHERS = Gauge("qstate_router_watchers", "Watches open, by form (keys: named keys; top: a "
                 "top-N board) and protocol (http: Server-Sent Events; grpc: a Watch stream)",
                 ["form", "protocol"], multiprocess_mode="livesum")
WATCH_EVENTS = Counter("qstate_router_watch_events_total", "Watch events sent, by form",
                       ["form"])
WATCH_COALESCED = Counter("qstate_router_watch_coalesced_total",
                          "Watch events that carry a value which replaced one the watcher had "
                          "not yet taken (a consumer slower than the changes), by form",
                          ["form"])
WATCH_DELAY = Histogram("qstate_router_watch_delay_seconds",
                        "From the shard applying a batch to the watch event carrying its "
                        "change being taken for sending, by form", ["form"],
                        buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1,
                                 2.5, 5))
WATCH_FAILURES = Counter("qstate_router_watch_failures_total",
                         "Watch reads that failed and are tried again at the next poll: read "
                         "(a partition could not answer), tick (anything else, logged)",
                         ["kind"])
for _form in WATCH_FORMS:
    WATCH_EVENTS.labels(_form)
    WATCH_COALESCED.labels(_form)
    for _protocol in ("http", "grpc"):
        WATCHERS.labels(_form, _protocol)
for _kind in ("read", "tick"):
    WATCH_FAILURES.labels(_kind)


def exposition() -> tuple[bytes, str]:
    """/metrics: this process's series, or with workers (``qstate router --workers``, which
    sets prometheus_client's PROMETHEUS_MULTIPROC_DIR) every worker's, summed."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


def http_method(method: str) -> str:
    return method if method in METHODS else "other"




_REFUSALS: tuple[tuple[type[QStateError], str], ...] = (
    (Unauthenticated, "unauthenticated"), (Forbidden, "forbidden"), (TooLarge, "too-large"),
    (Overloaded, "overloaded"))
for _, _reason in _REFUSALS:
    REFUSED.labels(_reason)


def count_error(exc: QStateError) -> None:
    """Count an error answer (HTTP or gRPC): a 503 by ``Unavailable.reason``, a refusal
    before any lookup (401, 403, 413, 429) by its kind."""
    if isinstance(exc, Unavailable):
        UNAVAILABLE.labels(exc.reason).inc()
        return
    for cls, reason in _REFUSALS:
        if isinstance(exc, cls):
            REFUSED.labels(reason).inc()
            return


def add_engine_counts(taken: dict[str, Any]) -> None:
    """What the read engine counted (``Engine.take_metrics``: requests its native front
    answered, their latency, reads by path, 503s by reason, refusals by kind) added to the
    same series, so /metrics says one router whoever answered (docs/architecture.md §5)."""
    for route, method, status, n in taken["requests"]:
        HTTP_REQUESTS.labels(route, method, str(status)).inc(n)
    for route, buckets, total in taken["latency"]:
        _add_histogram(HTTP_LATENCY.labels(route), buckets, total)
    for by, buckets, total in taken["catchups"]:
        _add_histogram(CATCHUPS.labels(by), buckets, total)
    for path, n in taken["reads"]:
        SHARD_READS.labels(path).inc(n)
    for reason, n in taken["unavailable"]:
        UNAVAILABLE.labels(reason).inc(n)
    for reason, n in taken["refused"]:
        REFUSED.labels(reason).inc(n)
    for route, by, n in taken["front"]:
        FRONT_REQUESTS.labels(route, by).inc(n)
    for at, n in taken["panics"]:
        ENGINE_PANICS.labels(at).inc(n)
    KEYS_WAITING.set(taken["keys_waiting"])
    for method, code, n in taken["grpc"]:
        GRPC_REQUESTS.labels(method, code).inc(n)
    for method, buckets, total in taken["grpc_latency"]:
        _add_histogram(GRPC_LATENCY.labels(method), buckets, total)


def _add_histogram(child: Any, buckets: list[int], total: float) -> None:
    # prometheus_client keeps a histogram's buckets apart (not cumulative) and its sum: the
    # engine counts them the same way, on the same bounds (_BUCKETS, then +Inf)
    for bucket, n in zip(child._buckets, buckets, strict=True):
        if n:
            bucket.inc(n)
    child._sum.inc(total)
