"""A shard server killed by its own fault point at a named step of batch N (real process,
real SIGKILL, no JVM), restarted, and what recovery did with N: written before the kill, the
committer's retried Commit(N) is skipped; not written, the restarted server replays N from
its manifest as it comes up (once), and the retried Commit(N) is skipped too.

The coordinator runs here as a driver runs it; the batches are ``test_recovery``'s.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from qstate.control.coordinator import Coordinator
from qstate.core.records.manifest import Fragments
from qstate.core.records.operator import OperatorSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import ShardProcess
from qstate.jobs.runtime.commit import CommitOutcome, Committer
from tests.helpers import (
    committed_batches,
    metric,
    read_all_windows,
    shard_metrics_url,
    wait_until,
)
from tests.service.shard.test_recovery import KEYS, SPEC, P, write_batch

N = 3  # the batch the fault names


@dataclass
class World:
    storage: Storage
    coord: Coordinator
    start: Callable[[str], ShardProcess]  # fault ("" none) -> the one shard, serving
    server_dir: Path

    def commit(self, spec: OperatorSpec, batch: int, watermark_ms: int,
               written: dict[int, Fragments]) -> CommitOutcome:
        # the committer keeps retrying while the one shard is down (each call bounded by
        # the lease)
        return Committer(self.coord, commit_timeout_s=60).commit(spec, batch, watermark_ms,
                                                                  written)

    def metric(self, shard: ShardProcess, name: str, **labels: str) -> float:
        return metric(shard_metrics_url(self.storage.uri, shard), name, job=SPEC.job,
                      operator=SPEC.operator, **labels)

    def ready(self, shard: ShardProcess) -> dict[int, int]:
        """Partition -> last batch of the partitions ``shard`` serves (not restoring)."""
        clients = ShardClients()
        try:
            d = clients.describe(shard.address)
        except grpc.RpcError:
            return {}
        finally:
            clients.close()
        return {p.partition: p.last_batch for p in d.partitions if not p.restoring}

    def served(self) -> dict:
        return read_all_windows(self.storage.uri, SPEC.job, SPEC.operator, "n", KEYS, P)[0]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    procs: list[ShardProcess] = []
    port = 0

    def start(fault: str) -> ShardProcess:
        nonlocal port
        s = ShardProcess.make("s0", tmp_path / "data", storage.uri, tmp_path / "logs",
                              port=port, env={**os.environ, "QSTATE_FAULT": fault})
        port = s.port  # a restart: the same address, as in the assignment
        procs.append(s.start_and_wait())
        return s

    first = start("")
    # one server: while it is down no other can take its partitions, and the committer
    # keeps retrying (each call bounded by the lease) until it is back
    coord = Coordinator(storage, SPEC.job, [first.address], lease_s=30,
                        heartbeat_s=0.2)
    coord.register(SPEC)
    first.stop()
    try:
        yield World(storage, coord, start, tmp_path / "data" / "s0")
    finally:
        coord.stop()
        for s in procs:
            s.stop()


@pytest.mark.parametrize(("point", "written_before"), [("shard.after-write", True),
                                                       ("shard.received", False)])
def test_killed_mid_commit_then_the_retried_commit(world: World, point: str,
                                                   written_before: bool) -> None:
    shard = world.start(f"{point}@{N}:{SPEC.operator}")
    truth: dict = {}
    for b in range(N):
        world.commit(SPEC, b, b * 100, write_batch(world.storage, b, truth))
    written = write_batch(world.storage, N, truth)
    with ThreadPoolExecutor(1) as pool:
        retrying = pool.submit(world.commit, SPEC, N, N * 100, written)
        assert shard.proc is not None
        assert shard.proc.wait(30) == -signal.SIGKILL
        # what the kill interrupted: N written on every partition, or none
        assert committed_batches(world.server_dir, SPEC.job, SPEC.operator) == \
            dict.fromkeys(range(P), N if written_before else N - 1)
        assert not retrying.done()  # the committer has no answer for N: it tries again
        again = world.start("")
        out = retrying.result(60)
    # the retried Commit(N) waits for the partitions to come up, which replays the batches
    # recorded (their manifests) that the disk does not have: N, when it was not written
    assert (out.applied, out.skipped, out.caught_up) == (0, P, 0)
    assert world.metric(again, "qstate_shard_caught_up_batches_total") == \
        (0 if written_before else P)  # one batch (N) per partition, or none
    assert world.metric(again, "qstate_shard_commits_total", result="skipped") == P
    assert world.metric(again, "qstate_shard_commits_total", result="applied") == 0
    assert world.metric(again, "qstate_shard_last_skipped_batch") == N
    assert committed_batches(world.server_dir, SPEC.job, SPEC.operator) == \
        dict.fromkeys(range(P), N)
    assert world.served() == truth  # N counted once, either way


def test_killed_after_the_ack_nothing_is_replayed(world: World) -> None:
    shard = world.start(f"shard.after-ack@{N}")
    truth: dict = {}
    for b in range(N):
        world.commit(SPEC, b, b * 100, write_batch(world.storage, b, truth))
    with ThreadPoolExecutor(1) as pool:
        acked = pool.submit(world.commit, SPEC, N, N * 100,
                            write_batch(world.storage, N, truth))
        assert shard.proc is not None
        assert shard.proc.wait(30) == -signal.SIGKILL
        # the reply went out before the kill: the committer has it, with nothing to retry
        out = acked.result(10)
    assert (out.applied, out.skipped) == (P, 0)
    assert committed_batches(world.server_dir, SPEC.job, SPEC.operator) == \
        dict.fromkeys(range(P), N)
    again = world.start("")
    # up from its own disk, with N: nothing to replay (then N+1 comes as a Commit, not as a
    # manifest the bring-up would replay)
    wait_until(lambda: world.ready(again) == dict.fromkeys(range(P), N), 30, "partitions up")
    assert world.metric(again, "qstate_shard_caught_up_batches_total") == 0
    out = world.commit(SPEC, N + 1, (N + 1) * 100,
                             write_batch(world.storage, N + 1, truth))
    assert (out.applied, out.skipped, out.caught_up) == (P, 0, 0)
    for result, want in (("applied", P), ("skipped", 0)):
        assert world.metric(again, "qstate_shard_commits_total", result=result) == want
    assert world.metric(again, "qstate_shard_caught_up_batches_total") == 0
    assert world.served() == truth
