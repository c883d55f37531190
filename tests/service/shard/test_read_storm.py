"""A read storm does not stall a shard (issue 25): while clients ask the largest reads a router
lets through (QSTATE_MAX_REQUEST_WINDOWS windows each) without pause, the shard goes on
answering heartbeats (Describe, what a coordinator's lease hangs on) and acknowledging
commits, and every read is exact. A real shard process."""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from qstate.core.address import partition_of
from qstate.core.config import DEFAULTS
from qstate.proto import shard_pb2 as pb
from tests.helpers import wait_until
from tests.service.shard.test_server import commit, env  # noqa: F401

KEYS = [f"s{i}" for i in range(1000)]
WINDOWS = 100  # per key: KEYS × WINDOWS = the router's default request budget
STORMERS = 3
pytestmark = pytest.mark.long  # ~15 s of storms: `make soak`, which CI runs


def storm_commit(stub, storage, batch: int) -> float:
    t0 = time.perf_counter()
    commit(stub, storage, batch, keys=KEYS)
    return time.perf_counter() - t0


def test_heartbeats_and_commits_go_on_under_the_largest_reads(env) -> None:  # noqa: F811
    storage, _, stub = env
    assert len(KEYS) * WINDOWS == DEFAULTS.max_request_windows
    quiet = [storm_commit(stub, storage, b) for b in range(WINDOWS)]
    ask = pb.LookupRequest(job="j", operator="op", state="n", range=True, from_ms=0,
                           to_ms=10 * WINDOWS + 10_000, limit=WINDOWS,
                           keys=[pb.KeyQuery(key=k, partition=partition_of(k, 4)) for k in KEYS])
    stop = threading.Event()
    reads: list[float] = []
    wrong: list[str] = []
    beats: list[float] = []
    failed: list[BaseException] = []

    def stormer() -> None:
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                rep = stub.MultiGet(ask, timeout=60)
                reads.append(time.perf_counter() - t0)
                # each key: the first WINDOWS windows, batch b's worth b + 1
                for r in rep.results:
                    if [w.int_value for w in r.windows] != list(range(1, WINDOWS + 1)):
                        wrong.append(r.key)
        except BaseException as exc:
            failed.append(exc)

    def heart() -> None:
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                stub.Describe(pb.DescribeRequest(), timeout=DEFAULTS.heartbeat_timeout_s)
                beats.append(time.perf_counter() - t0)
                stop.wait(DEFAULTS.heartbeat_s)
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=stormer) for _ in range(STORMERS)]
    threads.append(threading.Thread(target=heart))
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(reads) >= STORMERS or failed, 120, "every stormer's first read")
        during = [storm_commit(stub, storage, b) for b in range(WINDOWS, WINDOWS + 20)]
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    print(f"commit p50 quiet {statistics.median(quiet) * 1000:.1f} ms, during the storm "
          f"{statistics.median(during) * 1000:.1f} ms (max {max(during) * 1000:.1f}); "
          f"{len(reads)} reads of {len(KEYS) * WINDOWS} windows, p50 "
          f"{statistics.median(reads):.2f} s; heartbeat max {max(beats) * 1000:.0f} ms over "
          f"{len(beats)}")
    assert not failed, failed  # no heartbeat missed its deadline, no read failed
    assert not wrong, wrong[:5]
    # the loop answers a heartbeat in the time of a commit, not of a storm of reads
    assert max(beats) < max(min(reads), 4 * max(quiet)), (beats, reads)
    # and a commit takes about twice its quiet time, not the GIL's default turns (25x)
    assert statistics.median(during) < 4 * statistics.median(quiet), (quiet, during)
