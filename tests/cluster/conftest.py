"""The cluster: one per test module (six emulated hosts, see harness.py), under load from a
generator whose delivery log is the ground truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import RESULTS, Generator
from tests.cluster.harness import Cluster, wait_started


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("cluster")
    RESULTS.clear()  # what other modules' scenarios recorded
    c = Cluster.build(root)
    gen = Generator(c.broker.bootstrap, root / "events.jsonl", rate=2000)
    try:
        c.start()
        gen.start()
        gen.running.set()
        wait_started(c)
        gen.late.set()
        yield c, gen
    finally:
        gen.stopped.set()
        gen.running.clear()
        c.stop()
        for name, res, tta in RESULTS:
            print(f"cluster {name}: {res}, answering again after {tta:.2f}s")
        RESULTS.clear()
