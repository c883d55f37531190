"""The driver's fault points, without Spark: a driver process runs ``QStateSink.finish`` batch
by batch against a real shard server and kills itself at a step of batch N; then a restarted
driver re-runs N, as Spark re-runs a batch it has not committed, and the shard answers what
the kill left: applied (deltas written or N recorded, never sent) or skipped (acknowledged).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from qstate.control.coordinator import release
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.operator import save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import ShardProcess
from qstate.jobs.runtime.partials import Plan
from qstate.jobs.runtime.sinks import QStateSink
from tests.helpers import metric, read_all_windows, shard_metrics_url
from tests.service.shard.test_recovery import KEYS, SPEC, P, write_batch

ROOT = Path(__file__).resolve().parents[2]
N = 3

# The driver: batches 0..N, each finished as foreachBatch finishes it (commits pipelined).
DRIVER = """
import sys
from qstate.jobs.runtime.partials import Plan
from qstate.jobs.runtime.sinks import QStateSink
from qstate.core.process import faults
from qstate.core.config import settings
from qstate.core.records.storage import Storage
from tests.service.shard.test_recovery import SPEC, write_batch

faults.arm(settings().fault)  # as `qstate job` does at start
storage, shard, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
sink = QStateSink(storage, [shard], 60.0)
sink.prepare([SPEC])
for b in range(last + 1):
    sink.finish(Plan(SPEC, 0, b), write_batch(Storage(storage), b, {}), b * 100)
sink.flush()
"""


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[tuple[Storage, ShardProcess]]:
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    s = ShardProcess.make("s0", tmp_path / "data", storage.uri, tmp_path / "logs",
                          env={**os.environ, "QSTATE_FAULT": ""}).start_and_wait()
    try:
        yield storage, s
    finally:
        release(storage.uri, SPEC.job)
        s.stop()


def last_batches(shard: ShardProcess) -> dict[int, int]:
    clients = ShardClients()
    try:
        return {p.partition: p.last_batch for p in clients.describe(shard.address).partitions}
    finally:
        clients.close()


@pytest.mark.parametrize(("point", "acknowledged"), [("driver.after-deltas", False),
                                                     ("driver.after-record", False),
                                                     ("driver.after-commit", True)])
def test_driver_killed_at_a_step_of_batch_n_then_n_rerun(shard, point: str,
                                                         acknowledged: bool) -> None:
    storage, server = shard
    driver = subprocess.run(
        [sys.executable, "-c", DRIVER, storage.uri, server.address, str(N + 2)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "QSTATE_FAULT": f"{point}@{N}:{SPEC.operator}"})
    assert driver.returncode == -signal.SIGKILL, driver.stderr
    assert f"fault {point}@{N}:{SPEC.operator}: killing this process" in driver.stderr
    # what the kill left: N-1 acknowledged everywhere, N recorded or not, sent or not
    assert last_batches(server) == dict.fromkeys(range(P), N if acknowledged else N - 1)
    assert manifest_batches(storage, SPEC.job, SPEC.operator)[-1] == \
        (N - 1 if point == "driver.after-deltas" else N)
    url = shard_metrics_url(storage.uri, server)
    labels = {"job": SPEC.job, "operator": SPEC.operator}

    def counters() -> tuple[float, float]:
        return (metric(url, "qstate_shard_commits_total", result="skipped", **labels),
                metric(url, "qstate_shard_caught_up_batches_total", **labels))

    before = counters()

    # the restarted driver: Spark runs N again (same records, same deltas), then N+1
    truth: dict = {}
    for b in range(N):
        write_batch(storage, b, truth)
    sink = QStateSink(storage.uri, [server.address], 60.0)
    sink.prepare([SPEC])
    sink.finish(Plan(SPEC, 0, N), write_batch(storage, N, truth), N * 100)
    rerun = sink.flush()
    assert rerun is not None
    assert (rerun.applied, rerun.skipped, rerun.caught_up) == \
        ((0, P, 0) if acknowledged else (P, 0, 0))
    sink.finish(Plan(SPEC, 0, N + 1), write_batch(storage, N + 1, truth), (N + 1) * 100)
    nxt = sink.flush()
    assert nxt is not None and (nxt.applied, nxt.skipped) == (P, 0)

    # skipped: N on every partition, or nothing; nothing replayed from a manifest
    skipped, caught_up = (a - b for a, b in zip(counters(), before, strict=True))
    assert (skipped, caught_up) == ((P if acknowledged else 0), 0)
    assert metric(url, "qstate_shard_last_skipped_batch", **labels) == (N if acknowledged else 0)
    assert last_batches(server) == dict.fromkeys(range(P), N + 1)
    got, _ = read_all_windows(storage.uri, SPEC.job, SPEC.operator, "n", KEYS, P)
    assert got == truth
