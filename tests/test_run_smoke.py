"""`qstate run` (what `make run` starts), as shipped, for as long as it takes to answer.

Start it with its default settings and rates, wait until every operator has committed a batch,
produce a marker with kcat and read it back exact over HTTP, then Ctrl-C the whole process
group the way a terminal does: every process seen while it ran must be gone within 10 s. The
five-minute soak with a CPU hog and a truth comparison runs under ``make soak``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadtest.soak import DemoRun, Soak

pytestmark = pytest.mark.spark
STOP_BOUND_S = 10.0  # every child gone within 10 s of a group signal
ROLES = {"broker", "shard", "router", "generate-tweets", "generate-ads", "jobs", "spark"}


def test_make_run_answers_a_marker_exactly_then_ctrl_c_stops_everything(tmp_path: Path) -> None:
    if shutil.which("kcat") is None:
        pytest.fail("kcat is missing: .ci/run installs it (Debian package kcat)")
    demo = DemoRun(tmp_path).start()
    soak = Soak(demo)
    try:
        ready_s = soak.wait_ready()
        visible_s, exact = soak.marker()
        demo.see()
    finally:
        soak.close()
        rc, took, left = demo.ctrl_c(STOP_BOUND_S)
    print(f"ready in {ready_s:.1f}s; marker exact after {visible_s}s; stopped in {took:.1f}s")
    assert visible_s is not None and exact == 1, demo.tail()
    assert set(demo.roles.values()) >= ROLES, demo.roles
    assert not left, f"still running {took:.1f}s after Ctrl-C: {left}"
    assert rc == 0, demo.tail()
