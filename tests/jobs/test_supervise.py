"""`qstate job` with several jobs: one whose query fails is reported and dropped, the others
keep running (unit test of ``qstate.jobs.supervise.watch`` with stand-in jobs; no Spark)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, cast

import pytest

from qstate.core.errors import InvalidRequest
from qstate.jobs.launch import RunningJob
from qstate.jobs.metrics import JOB_UP
from qstate.jobs.supervise import checkpoint_name, checkpoint_names, watch


@dataclass
class StandIn:
    name: str
    fail_at: int | None = None  # the check at which its query has failed
    checks: int = 0
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True

    def check(self) -> None:
        self.checks += 1
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
