"""Fault points: the setting's format, which step and batch a fault names, inert unless a
process arms it, and a hit is a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from qstate.core.errors import InvalidRequest
from qstate.core.process import faults
from qstate.core.process.faults import POINTS, Fault, parse

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def disarmed() -> Iterator[None]:
    """A test that arms this (the test) process leaves it inert again."""
    try:
        yield
    finally:
        faults.arm("")


def python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env}, timeout=60)


@pytest.mark.parametrize(("text", "want"), [
    ("shard.after-write@12", Fault("shard.after-write", 12)),
    ("shard.after-write@12:per_tweet_1h", Fault("shard.after-write", 12, "per_tweet_1h")),
    ("  driver.after-commit@0:a.b-c  ", Fault("driver.after-commit", 0, "a.b-c")),
    ("", None),
    ("   ", None),
])
def test_parse(text: str, want: Fault | None) -> None:
    assert parse(text) == want
    if want is not None:
        assert parse(str(want)) == want  # str() is the setting's own format


@pytest.mark.parametrize(("text", "says"), [
    ("shard.after-wrte@3", "unknown point 'shard.after-wrte'"),
    ("shard.received", "expected POINT@BATCH"),
    ("shard.received@", "expected POINT@BATCH"),
    ("shard.received@-1", "expected POINT@BATCH"),
    ("shard.received@x", "expected POINT@BATCH"),
    ("shard.received@1.5", "expected POINT@BATCH"),
    ("shard.received@3:", "expected POINT@BATCH"),
    ("shard.received@3:has space", "invalid operator"),
    ("driver@3", "unknown point"),
])
def test_parse_errors_name_the_setting_and_the_problem(text: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse(text)
    assert f"QSTATE_FAULT={text.strip()!r}" in err.value.message
    assert says in err.value.message
    assert "shard.after-ack" in err.value.message or says == "invalid operator"


def test_every_point_parses() -> None:
    assert {parse(f"{p}@1").point for p in POINTS} == set(POINTS)  # type: ignore[union-attr]
    assert {p.split(".")[0] for p in POINTS} == {"shard", "driver", "savepoint", "router"}


def test_matching_point_batch_and_operator() -> None:
    any_op = Fault("shard.after-write", 12)
    assert any_op.matches("shard.after-write", 12, "a")
    assert any_op.matches("shard.after-write", 12, "b")
    assert not any_op.matches("shard.after-write", 11, "a")
    assert not any_op.matches("shard.after-write", 13, "a")
    assert not any_op.matches("shard.received", 12, "a")
    one_op = Fault("shard.after-write", 12, "a")
    assert one_op.matches("shard.after-write", 12, "a")
    assert not one_op.matches("shard.after-write", 12, "b")


def test_at_follows_what_is_armed(disarmed: None) -> None:
    assert faults.armed() is None
    assert not faults.at("shard.received", 3, "op")
    assert faults.arm("shard.received@3:op") == Fault("shard.received", 3, "op")
    assert faults.armed() == Fault("shard.received", 3, "op")
    assert faults.at("shard.received", 3, "op")
    assert not faults.at("shard.received", 3, "other")
    assert not faults.at("shard.after-write", 3, "op")
    faults.hit("shard.received", 4, "op")  # not this batch: nothing happens
    assert faults.arm("") is None
    assert not faults.at("shard.received", 3, "op")


def test_inert_unless_armed_even_with_the_variable_set() -> None:
    """Importing the module (as Spark's Python workers import the sink's modules) arms
    nothing: only ``qstate shard``/``qstate job`` arm the setting when they start."""
    every_point = "; ".join(f"faults.hit({p!r}, 3, 'op')" for p in POINTS)
    r = python(f"from qstate.core.process import faults; {every_point}; "
               "assert faults.armed() is None; print('alive')", QSTATE_FAULT="shard.received@3")
    assert (r.returncode, r.stdout.strip()) == (0, "alive"), r.stderr


def test_a_hit_is_a_sigkill_after_one_log_line() -> None:
    r = python("import logging; logging.basicConfig(); from qstate.core.process import faults; "
               "faults.arm('driver.after-record@3:op'); faults.hit('driver.after-record', 2, "
               "'op'); faults.hit('driver.after-record', 3, 'other'); print('still here', "
               "flush=True); faults.hit('driver.after-record', 3, 'op'); print('survived')")
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    assert r.stdout.split() == ["still", "here"]
    killing = [line for line in r.stderr.splitlines() if "SIGKILL" in line]
    assert len(killing) == 1 and "driver.after-record@3:op" in killing[0], r.stderr


@pytest.mark.parametrize("command", [["shard", "--port", "0"], ["job", "tweets"]])
def test_a_bad_setting_stops_the_process_at_start(command: list[str], tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "qstate", *command, "--storage",
                        str(tmp_path / "s")], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "QSTATE_FAULT": "shard.after-write@twelve",
                            "QSTATE_HOME": str(tmp_path)}, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    text = " ".join(r.stderr.replace("│", " ").split())
    assert "QSTATE_FAULT='shard.after-write@twelve'" in text, r.stderr
    assert "expected POINT@BATCH[:OPERATOR]" in text
