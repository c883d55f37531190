"""`qstate job` with several jobs: one whose query fails is reported and dropped, the others
keep running (unit test of ``qstate.jobs.runtime.supervise.watch`` with stand-in jobs; no Spark)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, cast

import pytest
from py4j.protocol import Py4JJavaError, Py4JNetworkError

from qstate.core.errors import InvalidRequest
from qstate.jobs.runtime import supervise
from qstate.jobs.runtime.launch import RunningJob
from qstate.jobs.runtime.metrics import JOB_UP
from qstate.jobs.runtime.supervise import checkpoint_name, checkpoint_names, watch


@dataclass
class StandIn:
    name: str
    fail_at: int | None = None  # the check at which its query has failed
    jvm_gone_at: int | None = None  # the check at which Spark's JVM no longer answers
    gone: type[Exception] = Py4JNetworkError  # how Py4J says so
    checks: int = 0
    stopped: bool = False
    stop_error: Exception | None = None

    def stop(self) -> None:
        self.stopped = True
        if self.stop_error is not None:
            raise self.stop_error

    def check(self) -> None:
        self.checks += 1
        if self.jvm_gone_at is not None and self.checks >= self.jvm_gone_at:
            raise self.gone("An error occurred while trying to connect to the Java server "
                            "(127.0.0.1:39201)")
        if self.fail_at is not None and self.checks >= self.fail_at:
            raise RuntimeError(f"query of {self.name} failed: shard s1 partition 3")

    def behind(self) -> dict[str, int]:
        return {"t": 0}


def test_a_failed_job_is_dropped_and_the_others_keep_running() -> None:
    bad, good = StandIn("bad", fail_at=2), StandIn("good")
    running = cast(list[RunningJob], [bad, good])
    stop = threading.Event()
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(failed=watch(running, stop,
                                                                   every_s=0.01)))
    t.start()
    while good.checks < 20:  # the good job is still being watched long after
        assert t.is_alive()
    stop.set()
    t.join(5)
    assert result["failed"] == [bad] and running == [good]
    assert bad.checks == 2  # reported once, then left alone
    assert bad.stopped and not good.stopped  # all of the failed one, none of the other
    assert JOB_UP.labels("bad")._value.get() == 0
    assert JOB_UP.labels("good")._value.get() == 1


def test_watch_returns_when_every_job_failed() -> None:
    jobs = cast(list[RunningJob], [StandIn("a", fail_at=1), StandIn("b", fail_at=3)])
    failed = watch(jobs, threading.Event(), every_s=0.01)
    assert [j.name for j in failed] == ["a", "b"] and jobs == []


def test_each_job_gets_its_own_checkpoint_folder_and_a_shared_one_is_refused() -> None:
    assert [checkpoint_name(b) for b in ("tweets", "ads", "mypkg.myjob:build",
                                         "mypkg.myjob:build_b", "qstate.jobs.examples.tweets:build")
            ] == ["tweets", "ads", "myjob", "myjob.build_b", "tweets"]
    assert checkpoint_names(["mod:build_a", "mod:build_b"]) == ["mod.build_a", "mod.build_b"]
    with pytest.raises(InvalidRequest, match="share the checkpoint folder 'jobs'"):
        checkpoint_names(["a.jobs:build", "b.jobs:build"])


# Py4J's own error, and the socket's that PySpark's pinned-thread mode (its default) lets out
@pytest.mark.parametrize("gone", [Py4JNetworkError, ConnectionRefusedError])
def test_a_jvm_gone_with_the_stop_signal_is_a_stop_and_without_it_a_failure(
        gone: type[Exception], monkeypatch: pytest.MonkeyPatch) -> None:
    # a SIGTERM to the whole group (systemd) reaches Spark's JVM too: the driver may see it
    # gone before its own handler has run; it waits for that signal, and stops, not fails
    monkeypatch.setattr(supervise, "STOP_GRACE_S", 0.5)
    stop = threading.Event()
    job = StandIn("a", jvm_gone_at=3, gone=gone)
    threading.Timer(0.1, stop.set).start()
    jobs = cast(list[RunningJob], [job])
    assert watch(jobs, stop, every_s=0.01) == [] and jobs == [job] and not job.stopped
    # gone with no signal (the OOM killer took it): every job of the process failed
    jobs = cast(list[RunningJob], [StandIn("b", jvm_gone_at=2, gone=gone)])
    failed = watch(jobs, threading.Event(), every_s=0.01)
    assert [j.name for j in failed] == ["b"] and cast(StandIn, failed[0]).stopped

    # a Java exception is Spark answering: the job's failure, said at once
    java = Py4JJavaError.__new__(Py4JJavaError)  # Py4J builds it from the JVM's answer
    assert supervise.jvm_gone(gone("refused")) and not supervise.jvm_gone(java)


def test_stopping_goes_through_every_job_and_spark_and_raises_only_our_own_failure() -> None:
    class Spark:
        stopped = False

        def stop(self) -> None:
            self.stopped = True
            # a Java exception whose text cannot be had: its str() asks the JVM that is gone
            raise Py4JJavaError.__new__(Py4JJavaError)

    # Spark's JVM gone first (a SIGTERM to the group): said, not raised; every job stopped
    gone, other, spark = (StandIn("a", stop_error=ConnectionRefusedError(111, "refused")),
                          StandIn("b"), Spark())
    supervise._stop_all(cast(list[RunningJob], [gone, other]), cast(Any, spark))
    assert gone.stopped and other.stopped and spark.stopped
    # a commit not delivered is ours: raised, once the rest is stopped too
    lost, other, spark = (StandIn("a", stop_error=RuntimeError("commit 41 not delivered")),
                          StandIn("b"), Spark())
    with pytest.raises(RuntimeError, match="commit 41"):
        supervise._stop_all(cast(list[RunningJob], [lost, other]), cast(Any, spark))
    assert other.stopped and spark.stopped


def test_a_query_ended_by_the_stop_signal_is_a_stop() -> None:
    # Spark's JVM got the SIGTERM too: its shutdown ends a query while it still answers
    stop = threading.Event()

    class EndedByShutdown(StandIn):
        def check(self) -> None:
            stop.set()  # the handler has run
            raise RuntimeError("query per_tweet_1h failed: SparkContext was shut down")

    job = EndedByShutdown("a")
    jobs = cast(list[RunningJob], [job])
    assert watch(jobs, stop, every_s=0.01) == [] and jobs == [job] and not job.stopped
