"""Kill -9 anything, count exactly (issue: failure-proof state).

One deployment runs through the scenarios in order while the generator sends ~5K tweet
events/s over 20K ids (CHAOS_KEYS; ``python -m loadtest.chaos`` runs 100K), out of order and
with late events. After each failure the topic is drained and every (key, window) the
scenario changed, in every state, is compared with ground truth computed from the
generator's delivery log: 0 lost, 0 counted twice; the module's last test compares every
window of the whole run. The time until every partition
answers again is printed (loadtest/chaos.py repeats the scenarios for the numbers).

A shard or the driver dies deterministically: it is restarted with a fault point armed
(``qstate.core.process.faults``) and kills itself with SIGKILL at a named step of a batch N a few
batches ahead. Each scenario asserts the process died by that signal, what batch N was at
that moment (the shards' commit markers and Describe, Spark's logs), and what recovery did
with N (the shards' commit counters: applied once, or skipped as already there). The same
kills at random moments, from outside, are in random_timing.py, which only
``python -m loadtest.chaos`` runs. During every scenario a reader polls two keys per partition
(``harness.Reader``): each answer exact so far or a 503 with Retry-After, never above the
final ground truth, never going back.

Every scenario leaves the deployment as it found it (``Deployment.disarm``), so each can run
alone.
"""

from __future__ import annotations

import shutil
import time

import pytest

from qstate.embedded.procs import RouterProcess
from tests.chaos.harness import (
    JOB,
    Deployment,
    P,
    died_by_sigkill,
    every_window_exact,
    newest,
    scenario,
)
from tests.helpers import committed_batches, wait_until

# long: `make soak` (which CI runs after `make test`) and `python -m loadtest.chaos`;
# docs/architecture.md §9
pytestmark = [pytest.mark.chaos, pytest.mark.spark, pytest.mark.long]
OP = "per_tweet_1h"  # the operator a fault names; the job's other one runs on undisturbed


# the batch every partition of OP on the killed shard's disk has when it dies, relative to N
SHARD_POINTS = {"shard.received": -1, "shard.after-write": 0, "shard.after-ack": 0}


@pytest.mark.parametrize("point", list(SHARD_POINTS))
def test_shard_killed_at_a_step_of_batch_n_and_restarted(world, point: str) -> None:
    seen: dict = {}

    def inject(d: Deployment) -> float:
        n = d.arm_shard(0, point, OP)
        epoch = d.epoch()
        victim = d.shards[0]
        died_by_sigkill(victim, 120, f"{victim.name} armed with {point}@{n}")
        t = time.monotonic()
        disk = committed_batches(d.root / "shards" / victim.name, JOB, OP)
        assert disk and set(disk.values()) == {n + SHARD_POINTS[point]}, (n, disk)
        d.shards[0] = d.shard(0).start_and_wait()
        seen.update(n=n, epoch=epoch, parts=set(disk))
        return t

    def recovered(d: Deployment) -> None:
        n, parts = seen["n"], seen["parts"]
        k = len(parts)
        wait_until(lambda: (h := d.held(0, OP)).keys() == parts and min(h.values()) > n, 120,
                   f"c0 serving its partitions of {OP} past batch {n}")
        # a restart within the lease: the same partitions, recovered from c0's own disk
        assert d.epoch() == seen["epoch"], "c0's partitions moved while it was down"
        caught_up = d.shard_metric(0, "qstate_shard_caught_up_batches_total", OP)
        skipped = d.shard_metric(0, "qstate_shard_commits_total", OP, result="skipped")
        last_skipped = d.shard_metric(0, "qstate_shard_last_skipped_batch", OP)
        if point == "shard.received":
            # N replayed once from its manifest as the partitions came up; the driver's
            # retried Commit(N) then found it there
            assert (caught_up, skipped, last_skipped) == (k, k, n)
        elif point == "shard.after-write":
            # N on disk, unacknowledged: the retried Commit(N) skipped, nothing replayed
            assert (caught_up, skipped, last_skipped) == (0, k, n)
        else:
            # N acknowledged: never sent again (N+1 may have come up from its manifest on
            # some partitions, recorded while c0 was away)
            assert last_skipped in (0, n + 1) and 0 <= caught_up <= k, \
                (caught_up, skipped, last_skipped)

    scenario(world, f"shard SIGKILL at {point}@N, restart", inject, recovered)


# whether every shard had acknowledged N when the driver died there
DRIVER_POINTS = {"driver.after-record": False, "driver.after-commit": True}


@pytest.mark.parametrize("point", list(DRIVER_POINTS))
def test_driver_killed_at_a_step_of_batch_n_and_restarted(world, point: str) -> None:
    acknowledged = DRIVER_POINTS[point]
    seen: dict = {}

    def counters(d: Deployment) -> list[tuple[float, float]]:
        return [(d.shard_metric(i, "qstate_shard_commits_total", OP, result="skipped"),
                 d.shard_metric(i, "qstate_shard_caught_up_batches_total", OP))
                for i in range(len(d.shards))]

    def inject(d: Deployment) -> float:
        n = d.arm_job(point, OP)
        died_by_sigkill(d.job, 300, f"the driver armed with {point}@{n}")
        d.kill_job()  # its JVM, if still on its way out
        t = time.monotonic()
        # Spark started N and did not commit it; N is recorded, acknowledged or not sent
        assert (newest(d.checkpoint / "offsets"), newest(d.checkpoint / "commits")) == \
            (n, n - 1)
        assert d.recorded(OP) == n
        assert d.last_batches(OP) == dict.fromkeys(range(P), n if acknowledged else n - 1)
        seen.update(n=n, before=counters(d))
        d.start_job()
        return t

    def recovered(d: Deployment) -> None:
        n = seen["n"]
        wait_until(lambda: len(b := d.last_batches(OP)) == P and min(b.values()) > n, 300,
                   f"every partition of {OP} past batch {n}")
        assert newest(d.checkpoint / "commits") >= n  # Spark ran N again, and committed it
        after = counters(d)
        skipped = sum(a[0] - b[0] for a, b in zip(after, seen["before"], strict=True))
        caught_up = sum(a[1] - b[1] for a, b in zip(after, seen["before"], strict=True))
        # the re-run Commit(N): skipped on every partition when they all had it, else
        # applied; either way nothing came from a manifest
        assert (skipped, caught_up) == ((P if acknowledged else 0), 0)
        if acknowledged:  # ... by each shard holding some of them
            holders = [i for i in range(len(d.shards)) if d.held(i, OP)]
            assert [d.shard_metric(i, "qstate_shard_last_skipped_batch", OP)
                    for i in holders] == [n] * len(holders)

    scenario(world, f"driver SIGKILL at {point}@N, restart", inject, recovered)


def test_kill9_shard_and_lose_its_disk(world):
    def inject(d: Deployment) -> float:
        d.shards[1].kill()
        t = time.monotonic()
        shutil.rmtree(d.root / "shards" / "c1")
        return t  # not restarted: its partitions are restored on c0
    scenario(world, "shard kill -9 + disk lost", inject)  # disarm() brings c1 back, empty


def test_kill9_router_start_another(world):
    def inject(d: Deployment) -> float:
        assert d.router is not None
        d.router.kill()
        t = time.monotonic()
        d.router = RouterProcess.make(d.storage, d.root / "logs", "router2").start_and_wait()
        return t
    scenario(world, "router kill -9, new router", inject)


def test_restart_the_broker(world):
    _ = world

    def inject(d: Deployment) -> float:
        # kill -9 under load, producers running: idempotent producers ride through (their
        # retries land once), and the job rides through the outage
        d.broker.kill()
        t = time.monotonic()
        d.broker.start()
        return t
    scenario(world, "broker restart", inject)


def test_every_window_exact_after_every_scenario(world):
    """Last in the module: each scenario compared the windows it touched; this compares
    every window once more (what a restore could have changed in older windows too)."""
    every_window_exact(world)
