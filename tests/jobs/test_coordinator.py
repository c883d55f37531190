"""Two coordinators of one job (a stale driver still running beside its replacement): each
epoch of the assignment is written by one of them only (``Storage.create``); the one that
finds its epoch taken while running stands down, fenced; one that is starting takes over."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs.coordinator import Coordinator
from service.core.assignment import load_assignment
from service.core.errors import Fenced
from service.core.operator import OperatorSpec, WindowSpec
from service.core.storage import Storage

SPEC = OperatorSpec("j", "op", "k", {"n": "long"}, partitions=4,
                    window=WindowSpec("tumbling", 10))


def coordinator(storage: Storage, servers: dict[str, str]) -> Coordinator:
    """A coordinator that sees ``servers`` live (as if they had answered a heartbeat now)."""
    c = Coordinator(storage, "j", shards=[])
    c.operators = {SPEC.operator: SPEC.partitions}
    for sid, address in servers.items():
        c._last_ok[sid], c._addresses[sid] = time.monotonic(), address
    return c


def test_a_running_coordinator_that_finds_its_epoch_taken_is_fenced(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    old = coordinator(s, {"s0": "h:1"})
    old._rebalance(bump=True)
    new = coordinator(s, {"s0": "h:1"})
    new._rebalance(bump=True)  # the replacement driver: epoch 2
    assert (old.assignment.epoch, new.assignment.epoch) == (1, 2)
    # the old one sees a server join and would write epoch 2 over s0 and s1: taken
    old._last_ok["s1"], old._addresses["s1"] = time.monotonic(), "h:2"
    old._rebalance(moves=True)
    assert old.fenced and old._stop.is_set()
    assert load_assignment(s, "j") == new.assignment  # nothing of the old one's written
    with pytest.raises(Fenced, match="another coordinator"):
        old.deliver(SPEC, 0, 0, {})


def test_a_starting_coordinator_takes_over_past_an_epoch_written_meanwhile(
        tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    a = coordinator(s, {"s0": "h:1"})  # both loaded epoch 0
    b = coordinator(s, {"s0": "h:1", "s1": "h:2"})
    a._rebalance(bump=True)  # epoch 1
    b._rebalance(bump=True)  # epoch 1 taken: reads it, writes epoch 2
    assert not b.fenced and b.assignment.epoch == 2
    assert load_assignment(s, "j") == b.assignment
    assert set(b.assignment.servers) == {"s0", "s1"}
