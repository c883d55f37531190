"""The chaos deployment: one per test module (broker, 2 shards, router, the tweets job, a
generator under load), brought back to its starting point after each scenario."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from qstate.embedded.kafka import KafkaBroker
from tests.chaos.harness import BOUNDARY, RESULTS, Deployment, Generator


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("chaos")
    broker = KafkaBroker(root / "broker").start()
    d = Deployment(root, broker)
    gen = Generator(broker.bootstrap, root / "events.jsonl")
    RESULTS.clear()  # what other modules' scenarios recorded (loadtest.chaos runs two)
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
        RESULTS.clear()
