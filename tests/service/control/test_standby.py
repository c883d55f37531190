"""Serving outlives the job (issue 11): with the driver down, a shard server dies and
`qstate coordinator` (a standby, a real process) moves its partitions to the live one, so
every key answers again, exact, without the job. When a driver starts again it takes over
from the standby's epoch and the standby stands aside.

The world is a shop of its own (tests/shop.py): two shard processes, three batches
committed by a driver's coordinator that then stopped (the job is down), two routers."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import orjson
import pytest

from qstate.control.coordinator import Coordinator
from qstate.core.records import paths
from qstate.core.records.assignment import load_assignment
from qstate.core.records.storage import Storage
from qstate.embedded.procs import Child, qstate_command
from tests.helpers import http_windows, metric, wait_until
from tests.shop import BATCHES, KEYS, SPEC, start_shop, views, window

LEASE_S = 2.0


def beats(storage: Storage) -> int:
    """How many times the driver's coordinator has beaten its lease."""
    return int(orjson.loads(storage.read_bytes(paths.driver_lease(SPEC.job)))["beat"])


@pytest.mark.long  # `make soak` (CI; docs/architecture.md §9)
def test_a_standby_moves_a_dead_shards_partitions_while_the_job_is_down(
        tmp_path: Path) -> None:
    shop = start_shop(tmp_path)
    standby = Child("standby", qstate_command("coordinator", SPEC.job, "--storage",
                                              shop.storage.uri, "--metrics-port", "0"),
                    tmp_path / "logs" / "standby.log",
                    {**os.environ, "QSTATE_LEASE_S": str(LEASE_S), "QSTATE_HEARTBEAT_S": "0.2"})
    driver: Coordinator | None = None
    try:
        standby.start()
        truth = {(k, window(b)[0]): views(k, b) for k in KEYS for b in range(BATCHES)}
        url = shop.routers["grpc"].url
        assert http_windows(url, SPEC.job, SPEC.operator, "views", KEYS) == truth
        before = load_assignment(shop.storage, SPEC.job)
        dead, live = shop.shards[1], shop.shards[0]
        dead.kill()
        t = time.monotonic()
        wait_until(lambda: set(load_assignment(shop.storage, SPEC.job).servers.values())
                   == {live.address}, 60, "the standby moved the dead shard's partitions")
        moved = load_assignment(shop.storage, SPEC.job)
        assert moved.by_standby() and moved.epoch > before.epoch
        [metrics_url] = re.findall(r"coordinator metrics: (http://\S+)/metrics",
                                   standby.log_path.read_text())
        assert metric(metrics_url, "qstate_job_standby_active", job=SPEC.job) == 1
        # every key answers again, exact, through the router that reads over gRPC

        def exact() -> bool:
            try:
                return http_windows(url, SPEC.job, SPEC.operator, "views", KEYS) == truth
            except AssertionError:  # a 503 while the partitions restore
                return False

        wait_until(exact, 60, "every key answering exact from the live shard")
        print(f"standby: every key exact {time.monotonic() - t:.1f}s after the kill "
              f"(lease {LEASE_S}s)")
        # the job starts again: its coordinator goes on past the standby's epoch, beats its
        # lease, and gives the restarted shard its share back; the standby stands aside
        dead.start_and_wait()
        driver = Coordinator(shop.storage, SPEC.job, [s.address for s in shop.shards],
                             lease_s=LEASE_S, heartbeat_s=0.2)
        driver.register(SPEC)
        def shared() -> bool:  # taken over by the restarted shard, make-before-break
            a = load_assignment(shop.storage, SPEC.job)
            return len(set(a.owners[SPEC.operator])) == 2 and not a.followers

        wait_until(shared, 60, "the restarted shard given its share back")
        back = load_assignment(shop.storage, SPEC.job)
        assert back.writer == driver.writer and back.epoch > moved.epoch
        # three leases of driver beats (one every third of a lease), which the standby
        # watches: meanwhile it writes nothing
        first = beats(shop.storage)
        wait_until(lambda: beats(shop.storage) >= first + 9, 60, "nine more driver beats")
        assert load_assignment(shop.storage, SPEC.job) == back and not driver.fenced
        wait_until(exact, 60, "every key exact across both shards again")
        assert "standing by" in standby.log_path.read_text()
        assert metric(metrics_url, "qstate_job_standby_active", job=SPEC.job) == 0
    finally:
        if driver is not None:
            driver.stop()
        if standby.alive():
            assert standby.proc is not None
            standby.proc.send_signal(signal.SIGTERM)
            assert standby.proc.wait(30) == 0
        shop.stop()
