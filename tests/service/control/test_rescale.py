"""Live rescale (issue 11), on real shard and router processes: a reader hammering every key
through both routers sees no 503 and no wrong answer while a third shard server joins and
one drains (make-before-break), or, with replicas=2, while an owner is kill -9'd (the
router answers from followers). The world and its checks are loadtest/rescale.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.rescale import Outcome, double_partitions, join_drain, replica_loss


def no_503_nor_wrong_answer(o: Outcome, reads: int) -> None:
    print(o.row())
    t = o.tally
    assert t.reads > reads, o  # the readers read throughout
    assert not t.refused and t.wrong == 0, f"{t.examples}\n{o.logs}"
    assert o.mismatches == 0  # every window of every batch, read at the end


@pytest.mark.long  # rescale scenarios: `make soak` (CI; docs/architecture.md §9)
def test_a_server_joins_and_another_drains_without_a_503_or_a_wrong_answer(
        tmp_path: Path) -> None:
    o = join_drain(tmp_path, keys=400, partitions=8, hold_s=2.0)
    no_503_nor_wrong_answer(o, 10_000)
    # join: s2 followed its share, then took it (>= 2 epochs); drain: the same for s0's
    assert o.epochs >= 4, o


@pytest.mark.long  # rescale scenarios: `make soak` (CI; docs/architecture.md §9)
def test_with_replicas_an_owner_killed_is_answered_by_its_followers(tmp_path: Path) -> None:
    o = replica_loss(tmp_path, keys=400, partitions=8, hold_s=2.0)
    no_503_nor_wrong_answer(o, 10_000)
    assert o.follower_reads > 0  # the dead owner's keys were answered by its copies


@pytest.mark.long  # rescale scenarios: `make soak` (CI; docs/architecture.md §9)
def test_doubling_the_partition_count_with_the_job_down_keeps_every_answer(
        tmp_path: Path) -> None:
    """`qstate state rescale --partitions 2P` (a real process) while readers read: no 503,
    no wrong answer; the job goes on at 2P and every window of every batch, before and
    after, is exact."""
    o = double_partitions(tmp_path, keys=400, partitions=4, hold_s=2.0)
    no_503_nor_wrong_answer(o, 5_000)
    assert o.batches > 10 and o.epochs >= 2, o  # batches before and after; rescale's epoch
