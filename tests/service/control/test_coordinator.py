"""Two coordinators of one job (a stale driver still running beside its replacement): each
epoch of the assignment is written by one of them only (``Storage.create``); the one that
finds its epoch taken while running stands down, fenced; one that is starting takes over."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from qstate.control.coordinator import Coordinator, driver_beat_age_s
from qstate.core.errors import Fenced
from qstate.core.records import paths
from qstate.core.records.assignment import load_assignment
from qstate.core.records.operator import OperatorSpec, WindowSpec
from qstate.core.records.storage import Storage
from qstate.jobs.runtime.commit import Committer

SPEC = OperatorSpec("j", "op", "k", {"n": "long"}, partitions=4,
                    window=WindowSpec("tumbling", 10))


class Clock:
    """A monotonic clock the test moves: leases expire when the test says, not after a
    sleep."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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
        Committer(old).deliver(SPEC, 0, 0, {})


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


def test_a_driver_goes_on_from_a_standby_epoch_and_a_standby_yields_to_a_driver(
        tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    driver = coordinator(s, {"s0": "h:1", "s1": "h:2"})
    driver._rebalance(bump=True)  # epoch 1
    standby = coordinator(s, {"s0": "h:1"})  # s1 died while the driver's beats did not come
    standby.writer = "standby:test"
    standby._rebalance(moves=True)  # epoch 2, all on s0
    assert load_assignment(s, "j").by_standby()
    # the driver would write epoch 2 too (s2 joined): a standby's epoch is no fence for it
    driver._last_ok["s2"], driver._addresses["s2"] = time.monotonic(), "h:4"
    driver._rebalance(moves=True)
    assert not driver.fenced and driver.assignment.epoch == 3
    assert set(driver.assignment.servers) == {"s0", "s1", "s2"}
    assert load_assignment(s, "j") == driver.assignment
    assert driver.assignment.writer == driver.writer
    # the standby's next move finds epoch 3 taken by a driver: it stands down
    standby._last_ok["s1"], standby._addresses["s1"] = time.monotonic(), "h:3"
    standby._rebalance(moves=True)
    assert standby.fenced and load_assignment(s, "j") == driver.assignment


def test_a_standby_acts_only_once_the_driver_lease_stops_changing(tmp_path: Path) -> None:
    from qstate.control.standby import Standby
    from qstate.core.config import Settings

    s = Storage(str(tmp_path))
    cfg = Settings.model_construct(lease_s=0.6, heartbeat_s=0.1, heartbeat_timeout_s=0.1)
    clock = Clock()
    driver = coordinator(s, {})
    driver.lease_s, driver.clock = cfg.lease_s, clock
    driver.beat()
    standby = Standby(s, "j", cfg, clock=clock)
    assert not standby.driver_down()  # a lease it has not watched for lease_s yet
    for _ in range(5):  # the driver beats every third of the lease: never down
        clock.advance(cfg.lease_s / 3 + 0.01)
        driver.beat()
        assert not standby.driver_down()
    clock.advance(cfg.lease_s - 0.01)  # the driver stops beating: not yet a lease
    assert not standby.driver_down()
    clock.advance(0.02)
    assert standby.driver_down()
    driver.beat()  # back
    assert not standby.driver_down()


def test_each_round_follows_a_newer_epoch_or_stands_down(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    driver = coordinator(s, {"s0": "h:1"})
    driver._rebalance(bump=True)  # epoch 1
    standby = coordinator(s, {"s0": "h:1"})
    standby.writer = "standby:test"
    standby._rebalance(bump=True)  # epoch 2 by a standby
    driver.follow()
    assert not driver.fenced and driver.assignment == load_assignment(s, "j")
    newer = coordinator(s, {"s0": "h:1"})  # a new driver
    newer._rebalance(bump=True)  # epoch 3
    driver.follow()
    assert driver.fenced
    with pytest.raises(Fenced):
        Committer(driver).deliver(SPEC, 0, 0, {})


class OneDeaf:
    """Shard clients where s0 answers Describe and s1 never does (busy, or dead)."""

    def describe(self, address: str, timeout: float, coordinator: str = "") -> SimpleNamespace:
        if address != "h:1":
            raise grpc.RpcError()
        return SimpleNamespace(server_id="s0", address=address, partitions=[], draining=False)


def test_a_coordinator_taking_over_gives_each_server_a_lease_before_moving(
        tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    driver = coordinator(s, {"s0": "h:1", "s1": "h:2"})
    driver._rebalance(bump=True)  # epoch 1 over both; then the driver stops
    clock = Clock()
    taker = Coordinator(s, "j", lease_s=0.5, writer="standby:test", clock=clock)
    taker.operators = {SPEC.operator: SPEC.partitions}
    taker.clients = OneDeaf()  # type: ignore[assignment]
    taker.presume_live()
    taker.round()  # s1 missed its first Describe: not dead yet
    assert load_assignment(s, "j") == driver.assignment
    clock.advance(0.49)
    taker.round()  # not a whole lease yet
    assert load_assignment(s, "j") == driver.assignment
    clock.advance(0.02)  # a lease without an answer: now it is
    taker.round()
    moved = load_assignment(s, "j")
    assert moved.epoch == 2 and moved.servers == {"s0": "h:1"} and moved.by_standby()


def test_a_driver_that_stops_ends_its_own_lease_and_not_a_newer_drivers(
        tmp_path: Path) -> None:
    """A rollback waits for no lease of a driver that stopped cleanly
    (``driver_beat_age_s``): its monitor deletes the lease it wrote when it stops; a lease
    another driver wrote since stays."""
    s = Storage(str(tmp_path))
    for newer in (False, True):
        c = coordinator(s, {"s0": "h:1"})
        c.heartbeat_s = 0.05
        c.register(SPEC)  # beats and starts monitoring
        age = driver_beat_age_s(s, "j")
        assert age is not None and age < 5
        if newer:
            Coordinator(s, "j", shards=[]).beat()  # another driver beats since
        c.stop()
        assert (driver_beat_age_s(s, "j") is not None) == newer
        s.delete(paths.driver_lease("j"))
