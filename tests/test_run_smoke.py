"""`qstate run` (what `make run` starts), as shipped, for as long as it takes to answer.

Start it with its default settings and rates, wait until every operator has committed a batch,
produce with kcat what a careless producer sends (invalid UTF-8 in a key, NaN, Infinity,
nesting 5,000 deep, an event dated ten years ahead, a 30-digit time, ``{}``: issue 25), then a
marker, and read the marker back exact over HTTP: every bad record is in the dead-letter topic
with its reason, the watermark did not leave for the future, counting went on; then Ctrl-C the
whole process group the way a terminal does: every process seen while it ran must be gone
within 10 s. Then
once more, killed -9 alone (the OOM killer, a closed session): every process it started, down
to Spark's JVM and its Python workers, must go by itself within 10 s. The five-minute soak with
a CPU hog and a truth comparison runs under ``make soak``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from loadtest.soak import DemoRun, Soak
from tests.helpers import wait_until

pytestmark = pytest.mark.spark
STOP_BOUND_S = 10.0  # every child gone within 10 s of a group signal
ROLES = {"broker", "shard", "router", "generate-tweets", "generate-ads", "jobs", "spark"}


YEAR_MS = 365 * 86_400_000
# key -> (the dead-letter reason, the value): each kind a careless producer sent to make run
POISON: dict[str, tuple[str, bytes]] = {
    "poison-utf8": ("bad_encoding", b'{"tweet_id": "tw-\xff\xfe", "event": "impression", '
                                    b'"time": NOW}'),
    "poison-nan": ("bad_number", b'{"tweet_id": "tw-1", "event": "impression", "time": NOW, '
                                 b'"weight": NaN}'),
    "poison-inf": ("bad_number", b'{"tweet_id": "tw-1", "event": "impression", "time": NOW, '
                                 b'"weight": Infinity}'),
    "poison-deep": ("too_deep", b'{"tweet_id": "tw-1", "event": "impression", "time": NOW, '
                                b'"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    "poison-future": ("future_time", b'{"tweet_id": "tw-1", "event": "impression", '
                                     b'"time": FUTURE}'),
    "poison-30-digits": ("out_of_range", b'{"tweet_id": "tw-1", "event": "impression", '
                                         b'"time": 123456789012345678901234567890}'),
    "poison-empty": ("missing_field", b"{}"),
}


def produce_poison(bootstrap: str) -> None:
    now = int(time.time() * 1000)
    lines = b"".join(key.encode() + b"|" + value.replace(b"NOW", str(now).encode()).replace(
        b"FUTURE", str(now + 10 * YEAR_MS).encode()) + b"\n"
        for key, (_, value) in POISON.items())
    subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", "tweet-events", "-K", "|"],
                   input=lines, check=True, timeout=30)


def dead_letters(bootstrap: str, n: int, timeout_s: float = 60) -> dict[str, str]:
    """key -> the qstate.kind header of the poison records in the dead-letter topic."""
    found: dict[str, str] = {}

    def all_there() -> bool:  # the topic read from its start, as kcat shows it
        p = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", "tweet-events.dlq", "-o",
                            "beginning", "-e", "-q", "-f", "%k\t%h\n"],
                           capture_output=True, timeout=30)
        for line in p.stdout.decode(errors="replace").splitlines():
            key, _, headers = line.partition("\t")
            kinds = [h.split("=", 1)[1] for h in headers.split(",")
                     if h.startswith("qstate.kind=")]
            if key.startswith("poison-") and kinds:
                found[key] = kinds[0]
        return len(found) >= n

    wait_until(all_there, timeout_s, f"{n} poison records in tweet-events.dlq")
    return found


# a minute of make run: `make soak` (CI), keeping make test under 10 min (docs/architecture.md §9)
@pytest.mark.long
def test_make_run_answers_a_marker_exactly_then_ctrl_c_stops_everything(tmp_path: Path) -> None:
    if shutil.which("kcat") is None:
        pytest.fail("kcat is missing: .ci/run installs it (Debian package kcat)")
    demo = DemoRun(tmp_path).start()
    soak = Soak(demo)
    try:
        ready_s = soak.wait_ready()
        produce_poison(demo.bootstrap)
        visible_s, exact = soak.marker()
        dead = dead_letters(demo.bootstrap, len(POISON))
        watermarks = {k: o["watermark"] for k, o in soak.operators().items()}
        niceness: dict[str, int] = {}
        for pid, role in demo.see().items():
            with contextlib.suppress(ProcessLookupError):  # gone since seen (a Spark worker)
                niceness[role] = os.getpriority(os.PRIO_PROCESS, pid)
    finally:
        soak.close()
        rc, took, left = demo.ctrl_c(STOP_BOUND_S)
    print(f"ready in {ready_s:.1f}s; marker exact after {visible_s}s; stopped in {took:.1f}s")
    print("dead letters:", dead)
    assert visible_s is not None and exact == 1, demo.tail()
    assert dead == {key: kind for key, (kind, _) in POISON.items()}, dead
    assert max(watermarks.values()) < time.time() * 1000 + 60_000, watermarks
    assert set(demo.roles.values()) >= ROLES, demo.roles
    # batch work yields the CPU to the processes that answer (docs/architecture.md §6)
    base, batch = os.getpriority(os.PRIO_PROCESS, 0), ("jobs", "spark", "generate-tweets",
                                                       "generate-ads")
    assert {r: niceness[r] - base for r in batch} == dict.fromkeys(batch, 10), niceness
    assert {niceness[r] - base for r in ("router", "shard", "broker")} == {0}, niceness
    assert not left, f"still running {took:.1f}s after Ctrl-C: {left}"
    assert rc == 0, demo.tail()


@pytest.mark.long  # a second start of make run: `make soak`, which CI runs
def test_kill_9_of_make_run_alone_takes_every_process_with_it(tmp_path: Path) -> None:
    demo = DemoRun(tmp_path).start()
    soak = Soak(demo)
    try:
        soak.wait_ready()  # every operator committed a batch: Spark's Python workers are up
        demo.see()
    finally:
        soak.close()
        rc, took, left = demo.kill9(STOP_BOUND_S)
    print(f"kill -9 of qstate run: {len(demo.roles)} processes gone in {took:.1f}s")
    assert set(demo.roles.values()) >= ROLES | {"spark-python"}, demo.roles
    assert rc == -9
    assert not left, f"still running {took:.1f}s after kill -9 of qstate run: {left}"
