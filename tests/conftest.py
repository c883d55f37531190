"""Session fixtures: one broker, one SparkSession, one checkpoint storage, one shop deployment
per test session.

A test that uses the ``spark`` fixture is marked ``spark`` and one that uses ``broker`` is
marked ``kafka``, whatever its file says, so ``make test-fast`` (neither) needs no JVM.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import qstate.core.process.forks  # noqa: F401  (first: this session forks only to exec)
from qstate.embedded.kafka import KafkaBroker

# Hypothesis runs randomized with its example database in use (.hypothesis/examples): a
# failing example is saved and tried first by the next run, and printed with a
# @reproduce_failure blob that replays it anywhere (docs/architecture.md §9). No seed is forced:
# under --hypothesis-seed Hypothesis neither saves nor replays examples. The parent is named:
# with CI (or GITHUB_ACTIONS, ...) in the environment Hypothesis loads its own ``ci`` profile at
# import (no database, derandomized), and a profile registered without a parent inherits it.
# No deadline and no too_slow check: both are wall-clock bounds, which no test asserts here.
settings.register_profile(
    "qstate", parent=settings.get_profile("default"), print_blob=True,
    database=settings.get_profile("default").database, derandomize=False, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The ``qstate`` profile, unless ``--hypothesis-profile`` names another; loaded before
    the test modules build their ``settings`` (which inherit from it)."""
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile("qstate")


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.getoption("hypothesis_seed", None)
    if seed is not None:
        return (f"hypothesis seed {seed}: --hypothesis-seed={seed} repeats this run's examples "
                "(no example database under a seed: failures are neither saved nor replayed)")
    db = settings().database  # the loaded profile's
    return (f"hypothesis example database {getattr(db, 'path', db)}: a failure is saved and "
            "tried first next run; its @reproduce_failure(...) blob, added to the test, "
            "replays it exactly")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "spark" in names:
            item.add_marker(pytest.mark.spark)
        if "broker" in names:
            item.add_marker(pytest.mark.kafka)
    # tests marked ``long`` (soaks, the chaos and multi-host scenarios beyond one of each kind)
    # run under ``make soak``, ``python -m loadtest.chaos`` and ``loadtest.cluster``, which set
    # QSTATE_LONG=1; ``make test`` deselects them and says how many (docs/architecture.md §9)
    if os.environ.get("QSTATE_LONG") == "1":
        return
    long = [i for i in items if i.get_closest_marker("long")]
    if long:
        items[:] = [i for i in items if not i.get_closest_marker("long")]
        config.hook.pytest_deselected(items=long)


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qstate")


@pytest.fixture(scope="session")
def broker(session_dir: Path) -> Iterator[KafkaBroker]:
    b = KafkaBroker(data_dir=session_dir / "broker").start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def topic() -> str:
    """A fresh topic name per test, so tests sharing the broker never see each other's data."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def spark(session_dir: Path):
    from qstate.jobs.runtime.spark import spark_session

    s = spark_session("qstate-tests", "local[2]")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def storage_uri(session_dir: Path) -> str:
    return str(session_dir / "storage")


@pytest.fixture(scope="session")
def shards(session_dir: Path, storage_uri: str):
    """Two shard server processes over real sockets, shared by the session."""
    from qstate.embedded.procs import ShardProcess

    procs = [ShardProcess.make(f"s{i}", session_dir / "shards", storage_uri,
                               session_dir / "logs").start_and_wait() for i in range(2)]
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="session")
def shop(tmp_path_factory: pytest.TempPathFactory):
    """The static shop deployment (tests/shop.py): shards, a coordinator, two routers."""
    from tests.shop import start_shop

    s = start_shop(tmp_path_factory.mktemp("shop"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def router(session_dir: Path, storage_uri: str, shards):
    """One router process (HTTP + gRPC) over the session's storage and shards."""
    from qstate.embedded.procs import RouterProcess

    r = RouterProcess.make(storage_uri, session_dir / "logs").start_and_wait()
    try:
        yield r
    finally:
        r.stop()
