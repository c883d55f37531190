"""Start a job module's operators with the queryable sink, watch them, stop them."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from jobs import metrics
from jobs.coordinator import release
from jobs.job import JobContext, JobDefinition
from jobs.sink import SinkStats, serve
from service.core.errors import InvalidRequest
from service.core.kafka import ensure_topic

__all__ = ["EXAMPLES", "Builder", "RunningJob", "load_builder", "start_job"]

log = logging.getLogger(__name__)

Builder = Callable[[SparkSession, JobContext], JobDefinition]
EXAMPLES = {"tweets": "jobs.examples.tweets:build", "ads": "jobs.examples.ads:build"}


def load_builder(name: str) -> Builder:
    """``module:function``, or the name of an example job (tweets, ads)."""
    target = EXAMPLES.get(name, name)
    module, sep, func = target.partition(":")
    if not sep or not module or not func:
        raise InvalidRequest(f"job {name!r}: expected MODULE:FUNCTION (e.g. mypkg.myjob:build) "
                             f"or one of the examples {sorted(EXAMPLES)}")
    try:
        builder = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequest(f"job {name!r}: cannot load {target}: {exc}") from exc
    if not callable(builder):
        raise InvalidRequest(f"job {name!r}: {target} is not a function")
    return builder  # type: ignore[no-any-return]


@dataclass
class RunningJob:
    definition: JobDefinition
    context: JobContext
    queries: dict[str, StreamingQuery]
    stats: dict[str, SinkStats]
    _seen: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.definition.name

    def stop(self) -> None:
        for q in self.queries.values():
            if q.isActive:
                q.stop()
        release(self.context.storage, self.name)

    def process_all_available(self) -> None:
        for q in self.queries.values():
            q.processAllAvailable()

    def check(self) -> None:
        """Raise the failure of any query that died."""
        for name, q in self.queries.items():
            if not q.isActive and q.exception() is not None:
                raise RuntimeError(f"query {name} failed: {q.exception()}")

    def export_metrics(self) -> None:
        """Copy new StreamingQueryProgress into the Prometheus metrics (the sink exports its
        own commit metrics as it goes)."""
        for name, q in self.queries.items():
            for p in q.recentProgress:
                if p.batchId <= self._seen.get(name, -1):
                    continue
                self._seen[name] = p.batchId
                metrics.INPUT_RATE.labels(self.name, name).set(p.inputRowsPerSecond or 0.0)
                metrics.PROCESSED_RATE.labels(self.name, name).set(
                    p.processedRowsPerSecond or 0.0)
                metrics.BATCH_SECONDS.labels(self.name, name).observe(
                    p.durationMs.get("triggerExecution", 0) / 1000)
                obs = (p.observedMetrics or {}).get("qstate_parse")
                if obs is not None:
                    metrics.DEAD_LETTERED.labels(self.name, self.definition.topic).inc(
                        obs["dead_lettered"] or 0)


def start_job(spark: SparkSession, builder: str | Builder, ctx: JobContext) -> RunningJob:
    build = load_builder(builder) if isinstance(builder, str) else builder
    definition = build(spark, ctx)
    ensure_topic(ctx.bootstrap, definition.topic)
    # Each operator is its own streaming query over the topic; only the first one sends
    # bad records to the dead-letter topic, so each lands there once.
    ops = definition.operators
    if len(ops) > 1:
        ops = ops[:1] + build(spark, ctx.without_dead_letters()).operators[1:]
    queries: dict[str, StreamingQuery] = {}
    stats: dict[str, SinkStats] = {}
    for op in ops:
        stats[op.name] = SinkStats()
        queries[op.name] = serve(
            op.frame, job=definition.name, operator=op.name, key=op.key, states=op.states,
            window=op.window, partitions=ctx.partitions,
            checkpoint=str(ctx.checkpoint / op.name), storage=ctx.storage, shards=ctx.shards,
            retention_ms=ctx.retention_ms, trigger_interval=ctx.trigger_interval,
            stats=stats[op.name])
    return RunningJob(definition, ctx, queries, stats)

