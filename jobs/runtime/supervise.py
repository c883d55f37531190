"""`qstate job ...`: run job modules in one SparkSession until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import replace

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from qstate.core.errors import InvalidRequest
from qstate.core.process.start import start_process
from qstate.jobs.job import JobContext
from qstate.jobs.runtime.launch import EXAMPLES, RunningJob, start_job
from qstate.jobs.runtime.metrics import JOB_UP
from qstate.jobs.runtime.origin import Seed
from qstate.jobs.runtime.spark import spark_session

__all__ = ["checkpoint_name", "checkpoint_names", "run_jobs", "watch"]

console = Console(stderr=True)
log = logging.getLogger(__name__)


def _status(jobs: list[RunningJob]) -> Text:
    line = Text()
    for job in jobs:
        for name, q in job.queries.items():
            p = q.lastProgress
            last = job.reports[name].last
            rate = (f"{p['inputRowsPerSecond'] or 0:,.0f} in/s "
                    f"{p['processedRowsPerSecond'] or 0:,.0f} proc/s") if p else "starting"
            if last is None:
                batch = "no batch yet"
            else:
                age = time.time() - last.watermark_ms / 1000
                batch = f"batch {last.batch} in {last.total_s:.1f}s, watermark {age:,.0f}s ago"
            line.append(f"{job.name}/{name}: ", style="bold")
            line.append(f"{rate}, {batch}   ")
        for topic, n in _lag(job).items():
            line.append(f"{topic}: {n:,} events behind   ", style="yellow" if n else "")
    return line


def _lag(job: RunningJob) -> dict[str, int]:
    """Events behind per topic; a status line never stops a job."""
    try:
        return job.behind()
    except Exception as exc:
        # Spark's JVM gone is said by the job's check, with what it means
        log.warning("%s: lag unknown: %s", job.name, _said(exc).splitlines()[0],
                    exc_info=not isinstance(exc, Py4JError | ConnectionError))
        return {}


def checkpoint_name(builder: str) -> str:
    """The checkpoint folder of a job: the module's own name (``tweets`` for the example,
    ``myjob`` for ``mypkg.myjob:build``), followed by the function's where it is not
    ``build`` (``myjob.build_b``), so that two jobs of one module keep apart."""
    module, _, func = EXAMPLES.get(builder, builder).partition(":")
    name = module.rsplit(".", 1)[-1]
    return name if func in ("", "build") else f"{name}.{func}"


def checkpoint_names(builders: list[str]) -> list[str]:
    """Each job's checkpoint folder; refuses two jobs that would share one (their queries
    would stop each other: Spark runs one query per checkpoint)."""
    names = [checkpoint_name(b) for b in builders]
    for name in set(names):
        same = [b for b, n in zip(builders, names, strict=True) if n == name]
        if len(same) > 1:
            raise InvalidRequest(f"jobs {' and '.join(same)} would share the checkpoint folder "
                                 f"{name!r}: run them from modules of different names, or "
                                 "under separate --checkpoints")
    return names


def run_jobs(builders: list[str], ctx: JobContext, metrics_port: int = 0,
             master: str = "local[2]", shuffle_partitions: int = 4, live: bool = True,
             spark_conf: dict[str, str] | None = None, metrics_host: str = "127.0.0.1",
             driver_host: str = "127.0.0.1", seed: Seed | None = None) -> None:
    """Run every job of ``builders`` (``module:function`` or an example's name); each gets
    ``ctx`` with its own checkpoint folder under ``ctx.checkpoint`` (``ctx.job``'s, when
    it names the one job). /metrics is served on ``metrics_host:metrics_port`` (0: any free
    port), printed at start; the Spark driver binds and advertises ``driver_host`` (its
    host's address when executors run elsewhere). ``seed``: a job beginning from a savepoint
    (``qstate.jobs.runtime.origin``)."""
    stop = start_process("job", metrics_port, metrics_host, console.print)
    names = [ctx.job] if ctx.job and len(builders) == 1 else checkpoint_names(builders)
    spark = spark_session("qstate-" + "-".join(names), master, shuffle_partitions, spark_conf,
                          driver_host)
    running = [start_job(spark, b, replace(ctx, checkpoint=ctx.checkpoint / n), seed)
               for b, n in zip(builders, names, strict=True)]
    console.print(f"[green]running[/green] {', '.join(j.name for j in running)} "
                  f"(checkpoints under {ctx.checkpoint})")
    try:
        with Live(_status(running), console=console, refresh_per_second=1,
                  transient=True) if live else nullcontext() as view:
            failed = watch(running, stop, view)
    finally:
        t0 = time.monotonic()
        _stop_all(running, spark)
        console.print(f"stopped in {time.monotonic() - t0:.1f}s")
    if failed:  # every job failed (a Ctrl-C with some failed ends here too): exit code 1
        raise SystemExit(1)


def _stop_all(running: list[RunningJob], spark: SparkSession) -> None:
    """Stop every job (its queries, then its commits under way and its coordinator) and
    Spark, each whatever the others did. Spark failing to stop is said, not raised: the
    process ends either way (its exit code says whether jobs failed), and a SIGTERM to the
    whole group (systemd's way) reaches Spark's JVM too, which may be gone first. What Spark
    had not recorded, the next start runs again (docs/architecture.md §3). Our own part
    failing (a commit not delivered) is raised, after the rest was stopped."""
    errors: list[Exception] = []
    for name, end in [*((job.name, job.stop) for job in running), ("spark", spark.stop)]:
        try:
            end()
        except Exception as exc:
            if not isinstance(exc, Py4JError | ConnectionError | PySparkException):
                errors.append(exc)
                continue
            log.warning("%s: Spark did not stop cleanly (its JVM gone or going: a signal to "
                        "the whole process group reaches it too): %s", name,
                        _said(exc).splitlines()[0])
    if errors:
        raise errors[0]


def watch(running: list[RunningJob], stop: threading.Event, view: Live | None = None,
          every_s: float = 1.0) -> list[RunningJob]:
    """Until ``stop`` or no job is left: drop a job whose query failed from ``running`` (the
    others keep running), keep the lag metric and status line current. Returns the failed."""
    for job in running:
        JOB_UP.labels(job.name).set(1)
    failed: list[RunningJob] = []
    while not stop.is_set() and running:
        for job in list(running):
            if not _alive(job, stop):
                running.remove(job)
                failed.append(job)
            elif stop.is_set():
                return failed
            elif view is None:
                _lag(job)  # the metric (the status line sets it too)
        if view is not None:
            try:
                view.update(_status(running))
            except Exception as exc:  # a status line never stops a job: ``_alive`` tells
                log.warning("status line: %s %s", type(exc).__name__,
                            _said(exc).splitlines()[0])
        stop.wait(every_s)
    return failed


def _said(exc: BaseException) -> str:
    """What an error says, or its type if saying it fails: a Py4JJavaError asks the JVM for
    its text, which a JVM that is gone cannot give."""
    try:
        text = str(exc).strip()
    except Exception:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def jvm_gone(exc: BaseException) -> bool:
    """Spark's JVM did not answer a call: its process is gone or going. Py4J says so with
    its network error, or in PySpark's pinned-thread mode with the socket's own; a Java
    exception (Py4JJavaError) is an answer."""
    return isinstance(exc, Py4JError | ConnectionError) and not isinstance(exc, Py4JJavaError)


STOP_GRACE_S = 2.0  # how long a JVM gone waits for this process's own stop signal


def _told_to_stop(stop: threading.Event) -> bool:
    """Spark's JVM did not answer: is this process stopping? A SIGTERM to the whole process
    group reaches the JVM and this process at once, and its handler may run only after the
    JVM is gone, so wait for it a moment; a JVM gone without a signal is a failure."""
    return stop.wait(STOP_GRACE_S)


def _alive(job: RunningJob, stop: threading.Event) -> bool:
    """False once a query of ``job`` has failed: said once, loudly; the process's other jobs
    keep running (a failed job does not take its neighbours down). Spark's JVM not
    answering while the process is told to stop is not a failure (``_told_to_stop``)."""
    try:
        job.check()
        return True
    except Exception as exc:
        if stop.is_set() or (jvm_gone(exc) and _told_to_stop(stop)):
            # stopping: Spark's JVM got the signal too and its shutdown may end a query
            log.warning("job %s: %s while stopping", job.name, type(exc).__name__)
            return True
        if not jvm_gone(exc):
            return _failed(job, _said(exc))
        return _failed(job, f"Spark's JVM does not answer ({type(exc).__name__})")


def _failed(job: RunningJob, why: str) -> bool:
    log.error("job %s failed: %s", job.name, why)
    console.print(f"[red]job {job.name} failed[/red]: {escape(why)}\n"
                  f"the other jobs keep running; restart this one from its checkpoint")
    JOB_UP.labels(job.name).set(0)
    try:  # all of it: its other queries, its coordinator (no writer left behind), sinks
        job.stop()
    except Exception:
        log.exception("stopping the failed job %s", job.name)
    return False
