"""Kill -9 anything, count exactly (issue: failure-proof state).

One deployment runs through the scenarios in order while the generator sends ~5K tweet
events/s over 100K ids, out of order and with late events. After each failure the topic is
drained and every (key, window) of every state is compared with ground truth computed from
the generator's delivery log: 0 lost, 0 counted twice. The time until every partition
answers again is printed (loadtest/chaos.py repeats the scenarios for the numbers).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from jobs.runner import MERGED
from service.embedded.kafka import KafkaBroker
from service.embedded.procs import RouterProcess
from tests.chaos.harness import BOUNDARY, Deployment, Generator, compare

pytestmark = [pytest.mark.chaos, pytest.mark.spark]
RESULTS: list[tuple[str, dict, float]] = []


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("chaos")
    broker = KafkaBroker(root / "broker").start()
    d = Deployment(root, broker)
    gen = Generator(broker.bootstrap, root / "events.jsonl")
    try:
        d.start()
        gen.start()
        gen.running.set()
        assert d.router is not None
        deadline = time.monotonic() + 240
        while True:  # late events only once the watermark has closed their windows
            r = httpx.get(f"{d.router.url}/v1/jobs/tweets", timeout=2)
            ops = r.json().get("operators", []) if r.status_code == 200 else []
            if len(ops) == 2 and all(o["watermark"] > BOUNDARY for o in ops):
                break
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(1)
        gen.late.set()
        yield d, gen
    finally:
        gen.stopped.set()
        gen.running.clear()
        d.stop()
        broker.stop()
        for name, res, tta in RESULTS:
            print(f"chaos {name}: {res}, answering again after {tta:.2f}s")


def newest(path: Path) -> int:
    names = [int(p.name.split(".")[0]) for p in path.glob("[0-9]*")] if path.exists() else []
    return max(names, default=-1)


def scenario(world, name: str, inject) -> None:
    d, gen = world
    gen.running.set()
    time.sleep(6)
    t = inject(d)
    tta = d.time_to_answer(t)
    time.sleep(4)
    gen.pause()
    assert gen.error is None, gen.error
    d.drain()
    res = compare(d, gen.log)
    RESULTS.append((name, res, tta))
    assert res["windows"] > 1000
    assert (res["lost"], res["doubled"]) == (0, 0), res


def _wait_new(path: Path, timeout: float = 60) -> None:
    """Return right after a new numbered file appears in ``path``."""
    start = newest(path)
    deadline = time.monotonic() + timeout
    while newest(path) == start:
        assert time.monotonic() < deadline, f"nothing new in {path}"
        time.sleep(0.002)


def test_kill9_shard_mid_commit_and_restart(world):
    def inject(d: Deployment) -> float:
        # the driver writes batch N's manifest right before it sends Commit(N)
        _wait_new(Path(d.storage) / "jobs" / "tweets" / "per_tweet_1h" / "batches")
        d.shards[0].kill()
        t = time.monotonic()
        d.shards[0].start_and_wait()
        return t
    scenario(world, "shard kill -9 mid-commit, restart", inject)


def test_kill9_shard_and_lose_its_disk(world):
    def inject(d: Deployment) -> float:
        d.shards[1].kill()
        t = time.monotonic()
        shutil.rmtree(d.root / "shards" / "c1")
        return t  # not restarted: its partitions are restored on c0
    scenario(world, "shard kill -9 + disk lost", inject)
    d, _ = world
    d.shards[1] = d.shard(1).start_and_wait()  # back, empty, for the next scenarios


def test_kill9_driver_mid_batch_and_restart(world):
    def inject(d: Deployment) -> float:
        ckpt = d.root / "ckpt" / "tweets" / MERGED
        _wait_new(ckpt / "offsets")  # a batch has started and is not committed
        d.kill_job()
        t = time.monotonic()
        d.start_job()
        return t
    scenario(world, "driver kill -9 mid-batch, restart", inject)


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
