"""`qstate run` (what `make run` starts): it answers a curl, and Ctrl-C (SIGINT to the whole
process group, the way a terminal sends it) leaves no process within 10 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.embedded.ports import free_port

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]
STOP_BOUND_S = 10.0  # issue 9: every child gone within 10 s of a group signal


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_run_answers_curl_and_ctrl_c_stops_every_child(tmp_path: Path) -> None:
    http, grpc_port, kafka, shard = free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "QSTATE_HOME": str(tmp_path / "home"),
           "QSTATE_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka}", "QSTATE_HTTP_PORT": str(http),
           "QSTATE_GRPC_PORT": str(grpc_port), "QSTATE_SHARD_PORT": str(shard)}
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "run", "--tweets-rate", "300", "--tweet-keys", "50",
         "--ads-rate", "50", "--partitions", "4"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        answer = None
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= descendants(proc.pid)
            try:
                r = httpx.get(f"http://127.0.0.1:{http}/v1/state/tweets/per_tweet_1h/"
                              "impressions/tw-1", timeout=2)
                if r.status_code == 200:
                    answer = r.json()
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert answer is not None, (tmp_path / "run.log").read_text()[-3000:]
        assert answer["windows"][0]["value"] >= 1 and answer["batch"] >= 0
        seen |= descendants(proc.pid)
        assert len(seen) >= 7  # broker, 2 shards, router, 2 generators, jobs (+ its JVM)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the group
        signalled = time.monotonic()
        try:
            rc = proc.wait(90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    while [p for p in seen if alive(p)] and time.monotonic() - signalled < STOP_BOUND_S:
        time.sleep(0.1)
    left = [p for p in seen if alive(p)]
    took = time.monotonic() - signalled
    for pid in left:  # ours: do not leave them behind a failed test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {took:.1f}s after Ctrl-C: {left}"
    assert rc == 0, (tmp_path / "run.log").read_text()[-3000:]
