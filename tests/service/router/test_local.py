"""In-process reads of a co-located shard's partitions through the read core (RocksDB
secondary instances, Rust): fresh after every commit, reopened after a restore, refused once
the partition moved away or its server died (then its owner is asked: here none answers, a
503), and never an answer that mixes two batches. Real RocksDB written by a real
PartitionStore; no processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from rocksdict import Checkpoint

from qstate._engine import Engine, answer
from qstate.core.address import PartitionId, partition_of
from qstate.core.config import DEFAULTS, engine_settings
from qstate.core.errors import Unavailable
from qstate.core.records.assignment import ServerInfo
from qstate.core.records.operator import OperatorSpec, WindowSpec
from qstate.partition.files import partition_dir
from qstate.router.hits import Hit, Row
from qstate.router.local import LocalReader
from qstate.shard.store import PartitionStore
from tests.helpers import wait_until

PID = PartitionId("j", "op", 3)
ADDRESS = "127.0.0.1:7999"


SPEC = OperatorSpec("j", "op", "k", {"n": "long"}, 8, WindowSpec("tumbling", 10))
# keys of partition PID (the only one the shard holds here): the read core routes each key
HERE = [k for k in (f"k{i}" for i in range(2000)) if partition_of(k, SPEC.partitions) == 3]
K = HERE[0]


def delta(key: str, start: int, n: int) -> pa.Table:
    return pa.table({"key": [key], "start": pa.array([start], pa.int64()),
                     "end": pa.array([start + 10], pa.int64()),
                     "tag": pa.nulls(1, pa.int64()), "n": pa.array([n], pa.int64())})


@pytest.fixture
def world(tmp_path: Path):
    server_dir = tmp_path / "shard"
    store = PartitionStore(partition_dir(server_dir, PID), SPEC)
    engine = Engine(str(tmp_path / "scratch"), 8 << 20, engine_settings(DEFAULTS))
    engine.set_table([(SPEC.to_json(), [ADDRESS] * SPEC.partitions, [[]] * SPEC.partitions)],
                     str(tmp_path), True)
    reader = LocalReader(engine, socket.gethostname())
    reader.set_servers([ServerInfo("s", ADDRESS, "", os.getpid(), 0, socket.gethostname(),
                                   str(server_dir))])
    reader.set_ready(ADDRESS, {PID})
    yield store, reader, server_dir
    reader.close()
    store.close()


def read(reader: LocalReader, keys: list[str]) -> list[Hit] | None:
    """The keys' latest windows as the read core answers them; None when this host could not
    answer them (its owner was asked instead, and none answers here: a 503)."""
    try:
        got = asyncio.run(answer(lambda loop, fut: reader.engine.read(
            PID.job, PID.operator, "n", keys, True, loop, fut)))
    except Unavailable:
        return None
    return [Hit(f, b, w, [Row(*r) for r in rows], n) for f, b, w, rows, n in got]


def value(reader: LocalReader, key: str = K) -> tuple[int, int | float | None] | None:
    hits = read(reader, [key])
    if hits is None:
        return None
    [h] = hits
    return h.batch, (h.windows[-1].value if h.windows else None)


def test_follows_every_commit(world) -> None:
    store, reader, _ = world
    store.apply(0, 0, 1, delta(K, 0, 1), None)
    assert value(reader) == (0, 1)
    for b in range(1, 20):
        store.apply(b, 0, 1, delta(K, 0, b + 1), None)
        assert value(reader) == (b, b + 1)


def test_reopens_after_a_restore_of_an_older_snapshot(world, tmp_path: Path) -> None:
    store, reader, server_dir = world
    store.apply(0, 0, 1, delta(K, 0, 5), None)
    snap = tmp_path / "snap"
    Checkpoint(store.db).create_checkpoint(str(snap))
    store.apply(1, 0, 1, delta(K, 0, 6), None)
    assert value(reader) == (1, 6)
    # what recovery does: close, replace the directory with the snapshot, reopen
    path = partition_dir(server_dir, PID)
    with store.lock:
        store.close()
        shutil.rmtree(path)
        shutil.copytree(snap, path)
        store.reopen()
    assert value(reader) == (0, 5)  # a new incarnation: the secondary was reopened
    store.apply(1, 0, 1, delta(K, 0, 7), None)
    assert value(reader) == (1, 7)


def test_refuses_what_it_must_not_read(world, tmp_path: Path) -> None:
    store, reader, _ = world
    store.apply(0, 0, 1, delta(K, 0, 1), None)
    assert value(reader) == (0, 1)
    elsewhere = "10.0.0.9:7100"  # the routing table names an owner on another host
    reader.engine.set_table([(SPEC.to_json(), [elsewhere] * SPEC.partitions,
                              [[]] * SPEC.partitions)], "", True)
    assert value(reader) is None
    reader.engine.set_table([(SPEC.to_json(), [ADDRESS] * SPEC.partitions,
                              [[]] * SPEC.partitions)], "", True)
    assert value(reader) == (0, 1)
    reader.set_ready(ADDRESS, {PartitionId("j", "op", 4)})  # not among the ready ones
    assert value(reader) is None
    reader.set_ready(ADDRESS, set())  # restoring (the owner's Describe says so)
    assert value(reader) is None
    reader.set_ready(ADDRESS, {PID})
    assert value(reader) == (0, 1)
    store.retire()  # moved away: the marker is gone
    assert value(reader) is None


def test_refuses_a_dead_server(world) -> None:
    store, reader, server_dir = world
    store.apply(0, 0, 1, delta(K, 0, 1), None)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    reader.set_servers([ServerInfo("s", ADDRESS, "", dead_pid, 0, socket.gethostname(),
                                   str(server_dir))])
    reader.set_ready(ADDRESS, {PID})
    assert value(reader) is None


def test_an_answer_never_mixes_two_batches(world) -> None:
    """Batches committed while readers read many keys of the partition at once: every answer
    is every key's value at the one batch it names (batch b sets key i to b * 1000 + i)."""
    store, reader, _ = world
    keys = HERE[:50]

    def commit(b: int) -> None:
        t = pa.concat_tables([delta(k, 0, 0) for k in keys])
        n = pa.array([b * 1000 + i for i in range(len(keys))], pa.int64())
        store.apply(b, 0, 1, t.set_column(4, "n", n), None)

    commit(0)
    last = 60
    answers: list[list[Hit]] = []
    done = threading.Event()

    def reading() -> None:
        while not done.is_set():
            hits = read(reader, keys)
            assert hits is not None
            answers.append(hits)

    # a failure in a reader is raised here, by its future (not a thread's warning)
    with ThreadPoolExecutor(3) as pool:
        readers = [pool.submit(reading) for _ in range(3)]
        try:
            for b in range(1, last + 1):
                commit(b)
        finally:
            done.set()
        for r in readers:
            r.result()
    seen = set()
    for hits in answers:
        batch = hits[0].batch
        seen.add(batch)
        # a Spark-state value: each batch replaces it
        want = [batch * 1000 + i for i in range(len(keys))]
        assert [h.batch for h in hits] == [batch] * len(keys)
        assert [h.windows[-1].value for h in hits] == want, batch
    assert len(seen) > 5, seen  # the readers did see the batches move under them
    assert value(reader, keys[0]) == (last, last * 1000)


def test_a_read_begun_after_a_commit_answers_that_commit(world) -> None:
    """Readers read while batches commit: a read begun after the shard wrote a batch's marker
    answers that batch or a later one, also while another reader is catching the partition up
    (a reader finding a catch-up under way waits for it, rather than answer the batch before:
    after a commit, no answer goes back to older state; docs/architecture.md §5)."""
    store, reader, _ = world
    keys = HERE[:20]

    def commit(b: int) -> None:
        t = pa.concat_tables([delta(k, 0, 0) for k in keys])
        store.apply(b, 0, 1, t.set_column(4, "n", pa.array([b] * len(keys), pa.int64())), None)

    committed = [0]
    commit(0)
    older: list[tuple[int, int]] = []
    reads = [0]
    done = threading.Event()

    def reading() -> None:
        while not done.is_set():
            since = committed[0]  # the marker of this batch is written: read after it
            hits = read(reader, keys)
            assert hits is not None
            reads[0] += 1
            if hits[0].batch < since:
                older.append((since, hits[0].batch))

    with ThreadPoolExecutor(4) as pool:
        readers = [pool.submit(reading) for _ in range(4)]
        try:
            for b in range(1, 151):
                commit(b)
                committed[0] = b
        finally:
            done.set()
        for r in readers:
            r.result()
    assert reads[0] > 150
    assert older == [], f"{len(older)} reads answered a batch before one committed: {older[:5]}"


def catchups(engine: Engine) -> Counter[str]:
    """Partitions caught up since the last call, by who did it (the engine's counts)."""
    return Counter({by: sum(buckets) for by, buckets, _ in engine.take_metrics()["catchups"]})


def test_the_follower_catches_a_partition_up_before_its_next_read(world) -> None:
    """With the follower on, each commit to a partition read lately is caught up off the read
    path: the next read answers the new batch without catching up itself."""
    store, reader, _ = world
    engine = reader.engine
    store.apply(0, 0, 1, delta(K, 0, 1), None)
    assert value(reader) == (0, 1)
    assert catchups(engine) == Counter(read=1)  # the first read opens the partition
    engine.start_follower(0.005)
    for b in range(1, 6):
        store.apply(b, 0, 1, delta(K, 0, b + 1), None)
        seen: Counter[str] = Counter()

        def by_follower(seen: Counter[str] = seen) -> bool:
            seen.update(catchups(engine))
            return seen["follower"] >= 1

        wait_until(by_follower, 10, f"the follower catching up to batch {b}")
        assert value(reader) == (b, b + 1)
        seen.update(catchups(engine))
        assert seen == Counter(follower=1), seen
