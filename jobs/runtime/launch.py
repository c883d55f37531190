"""Start a job module's queries with the queryable sink, watch them, stop them.

A job's merged operators run as one streaming query (``qstate.jobs.runtime.pipeline``); each
Spark-state operator runs as its own (``qstate.jobs.runtime.spark_state.serve``).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import orjson
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from qstate.control.coordinator import release
from qstate.core.config import settings
from qstate.core.errors import InvalidRequest
from qstate.core.records.manifest import offsets_json
from qstate.core.records.savepoint import Savepoint, read_savepoint
from qstate.core.records.storage import Storage
from qstate.core.transport.kafka import EndOffsets, ensure_topic, topic_partitions
from qstate.jobs.job import JobContext
from qstate.jobs.queryable import QueryableJob
from qstate.jobs.runtime import metrics, pipeline
from qstate.jobs.runtime.origin import Origin, Seed, begin, split_savepoint
from qstate.jobs.runtime.reports import Reports
from qstate.jobs.runtime.sinks import QStateSink
from qstate.jobs.runtime.spark_state import serve

__all__ = ["EXAMPLES", "MERGED", "Builder", "RunningJob", "check_starting_offsets",
           "load_builder", "start_job"]

log = logging.getLogger(__name__)

Builder = Callable[[SparkSession, JobContext], QueryableJob]
EXAMPLES = {"tweets": "qstate.jobs.examples.tweets:build", "ads": "qstate.jobs.examples.ads:build"}
MERGED = "merged"  # the checkpoint folder (and query) of a job's merged operators


def load_builder(name: str) -> Builder:
    """``module:function``, or the name of an example job (tweets, ads). A failure says
    what was looked for where, and what to do."""
    target = EXAMPLES.get(name, name)
    module, sep, func = target.partition(":")
    if not sep or not module or not func:
        raise InvalidRequest(f"job {name!r}: expected MODULE:FUNCTION (e.g. mypkg.myjob:build) "
                             f"or one of the examples {sorted(EXAMPLES)}")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):  # the job's own module
            raise InvalidRequest(
                f"job {name!r}: no module named {exc.name!r} in the working directory "
                f"({os.getcwd()}) or the installed packages; run `qstate job` from the folder "
                f"that holds {exc.name.split('.')[0]}.py (or its package), or install your "
                "package (`pip install -e .`)") from exc
        raise InvalidRequest(f"job {name!r}: {module} imports {exc.name!r}, which is not "
                             "installed in this Python: install it (pip install ...)") from exc
    except Exception as exc:  # the module itself fails: its own error, named
        raise InvalidRequest(f"job {name!r}: importing {module} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
    builder = getattr(loaded, func, None)
    if builder is None:
        raise InvalidRequest(f"job {name!r}: module {module} ({loaded.__file__}) has no "
                             f"{func!r}; define `def {func}(spark, ctx)` that returns a "
                             "QueryableJob (docs/own-job.md)")
    if not callable(builder):
        raise InvalidRequest(f"job {name!r}: {target} is not a function")
    return builder  # type: ignore[no-any-return]


def check_starting_offsets(value: str) -> str:
    """Where a new job (no checkpoint yet) starts reading its topic, as Spark's Kafka
    source takes it: earliest, latest, or JSON of offsets per partition
    (``{"tweets": {"0": 42, "1": -2}}``, -2 earliest, -1 latest). A job with a checkpoint
    goes on from it whatever this says."""
    if value in ("earliest", "latest"):
        return value
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        parsed = None
    ok = isinstance(parsed, dict) and parsed and all(
        isinstance(t, str) and isinstance(ps, dict) and ps and all(
            p.isdigit() and type(o) is int and o >= -2 for p, o in ps.items())
        for t, ps in parsed.items())
    if not ok:
        raise InvalidRequest(
            f"starting offsets {value[:80]!r}: earliest, latest, or JSON of offsets per "
            'topic and partition, e.g. {"tweets": {"0": 42, "1": -2}} (-2: earliest, '
            "-1: latest)")
    return value


@dataclass
class RunningJob:
    job: QueryableJob
    context: JobContext
    queries: dict[str, StreamingQuery]
    reports: dict[str, Reports]
    sinks: list[QStateSink] = field(default_factory=list)
    end_offsets: Callable[[str], dict[str, int] | None] | None = None  # a topic's, on the broker

    @property
    def name(self) -> str:
        return self.job.name

    def stop(self) -> None:
        """Stop every query, then deliver the commits under way and stop the coordinator,
        even when stopping a query failed (Spark's JVM gone first): the first such error
        is raised after."""
        failed: Exception | None = None
        for q in self.queries.values():
            try:
                if q.isActive:
                    q.stop()
            except Exception as exc:
                failed = failed or exc
        try:
            for sink in self.sinks:
                sink.flush()  # the last batch's commits, under way when the query stopped
        finally:
            if isinstance(self.end_offsets, EndOffsets):
                self.end_offsets.close()
            release(self.context.storage, self.name)
        if failed is not None:
            raise failed

    def process_all_available(self) -> None:
        """Until every query has processed what is there and every commit is delivered."""
        for q in self.queries.values():
            q.processAllAvailable()
        for sink in self.sinks:
            sink.flush()

    def behind(self) -> dict[str, int]:
        """Events in the job's topics that its queries have not read yet, per topic: the
        topic's end offsets on the broker now minus where the last batch ended (Spark's
        progress); also set as ``qstate_job_lag_events``. Spark's own ``latestOffset`` is
        only what the last batch was planned with, so a stalled job would look caught up by
        it; it stands in only while the broker does not answer."""
        out: dict[str, int] = {}
        for q in self.queries.values():
            progress = q.lastProgress
            for source in progress.sources if progress is not None else []:
                latest, end = _offsets(source.latestOffset), _offsets(source.endOffset)
                for topic, done in end.items():
                    now = (self.end_offsets(topic) if self.end_offsets else None) or \
                        latest.get(topic, {})
                    out[topic] = max(out.get(topic, 0), sum(
                        max(0, now.get(p, off) - off) for p, off in done.items()))
        for topic, n in out.items():
            metrics.LAG.labels(self.name, topic).set(n)
        return out

    def check(self) -> None:
        """Raise the failure of any query that died."""
        for name, q in self.queries.items():
            if not q.isActive and q.exception() is not None:
                raise RuntimeError(f"query {name} failed: {q.exception()}")


def _offsets(text: str | None) -> dict[str, dict[str, int]]:
    """A Kafka source's offsets as Spark reports them: ``{"topic": {"0": 42}}`` (JSON)."""
    try:
        parsed = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(parsed, dict):  # "null" before the source has seen the topic
        return {}
    return {t: {p: int(o) for p, o in parts.items()} for t, parts in parsed.items()
            if isinstance(parts, dict)}


def start_job(spark: SparkSession, builder: str | Builder, ctx: JobContext,
              seed: Seed | None = None) -> RunningJob:
    """Build the job and start its queries. With ``ctx.from_savepoint``, the job begins
    from that savepoint (``qstate.jobs.runtime.origin``; ``seed`` writes its state) unless it
    already did."""
    build = load_builder(builder) if isinstance(builder, str) else builder
    sp = None
    if ctx.from_savepoint:
        owner, name = split_savepoint(ctx.from_savepoint, ctx.job or ctx.checkpoint.name)
        sp = read_savepoint(Storage(ctx.storage), owner, name)
        if not sp.offsets:
            raise InvalidRequest(f"savepoint {owner}@{name} records no source offsets: a "
                                 "job cannot begin from it")
        # Spark wants every partition named: one added since the savepoint is read whole
        offsets = {t: {**{p: -2 for p in topic_partitions(ctx.bootstrap, t)}, **ps}
                   for t, ps in sp.offsets.items()}
        ctx = replace(ctx, starting_offsets=orjson.dumps(offsets_json(offsets)).decode())
    job = build(spark, ctx)
    if sp is not None and "@" not in (ctx.from_savepoint or "") and sp.job != job.name:
        raise InvalidRequest(f"job {job.name!r}: name the savepoint's job "
                             f"(--from-savepoint JOB@{sp.name})")
    ensure_topic(ctx.bootstrap, job.topic)
    cfg = settings()
    retention = cfg.retention_ms if ctx.retention_ms is None else ctx.retention_ms
    if sp is not None:
        _check_savepoint_source(job, sp)
    origin = Origin()
    if job.operators:
        specs = [op.spec(job.name, ctx.partitions, retention) for op in job.operators]
        origin = begin(Storage(ctx.storage), ctx.checkpoint, job.name, specs, sp, seed,
                       [MERGED])
    queries: dict[str, StreamingQuery] = {}
    reports: dict[str, Reports] = {}
    sinks = []
    if job.operators:
        reports[MERGED] = Reports()
        sink = QStateSink(ctx.storage, ctx.shards, cfg.commit_timeout_s)
        sinks.append(sink)
        queries[MERGED] = pipeline.start(
            job, str(ctx.checkpoint / MERGED), sink, partitions=ctx.partitions,
            retention_ms=retention, trigger_interval=ctx.trigger_interval,
            reports=reports[MERGED], origin=origin)
    for op in job.spark_state:
        reports[op.name] = Reports()
        queries[op.name] = serve(
            op.frame, job=job.name, operator=op.name, key=op.key, states=op.states,
            window=op.window, partitions=ctx.partitions,
            checkpoint=str(ctx.checkpoint / op.name), storage=ctx.storage, shards=ctx.shards,
            retention_ms=retention, trigger_interval=ctx.trigger_interval,
            reports=reports[op.name])
    return RunningJob(job, ctx, queries, reports, sinks, EndOffsets(ctx.bootstrap))


def _check_savepoint_source(job: QueryableJob, sp: Savepoint) -> None:
    """A job begins from a savepoint of merged operators reading the same topic."""
    where = f"job {job.name!r} cannot begin from savepoint {sp.job}@{sp.name}"
    if job.spark_state:
        raise InvalidRequest(
            f"{where}: {', '.join(o.name for o in job.spark_state)} keep their state in "
            "Spark's checkpoint, which a savepoint does not hold (spark-state mode)")
    if job.topic not in sp.offsets:
        raise InvalidRequest(f"{where}: it reads {job.topic!r}, the savepoint's offsets are "
                             f"of {', '.join(sorted(sp.offsets))}")
