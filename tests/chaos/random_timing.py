"""Kills at random moments, from outside: a shard kill -9 right after batch N's manifest
appears (before, during or after its Commit) and a driver kill -9 right after a batch starts.
Not collected by ``make test`` (the name does not start with ``test_``; the deterministic
fault points of test_chaos.py cover these steps); ``python -m loadtest.chaos`` runs it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chaos.harness import Deployment, every_window_exact, newest, scenario

pytestmark = [pytest.mark.chaos, pytest.mark.spark]


def _wait_new(path: Path, timeout: float = 60) -> None:
    """Return right after a new numbered file appears in ``path``."""
    start = newest(path)
    deadline = time.monotonic() + timeout
    while newest(path) == start:
        assert time.monotonic() < deadline, f"nothing new in {path}"
        time.sleep(0.002)


def test_kill9_shard_mid_commit_and_restart(world):
    def inject(d: Deployment) -> float:
        # the driver writes batch N's manifest right before it sends Commit(N); the kill
        # lands before, during or after the commit
        _wait_new(Path(d.storage) / "jobs" / "tweets" / "per_tweet_1h" / "batches")
        d.shards[0].kill()
        t = time.monotonic()
        d.shards[0].start_and_wait()
        return t
    scenario(world, "shard kill -9 mid-commit, restart", inject)


def test_kill9_driver_mid_batch_and_restart(world):
    def inject(d: Deployment) -> float:
        _wait_new(d.checkpoint / "offsets")  # a batch has started and is not committed
        d.kill_job()
        t = time.monotonic()
        d.start_job()
        return t
    scenario(world, "driver kill -9 mid-batch, restart", inject)


def test_every_window_exact_after_every_scenario(world):
    """Last in the module: each scenario compared the windows it touched; this compares
    every window once more (what a restore could have changed in older windows too)."""
    every_window_exact(world)
