"""Every qstate process tells gRPC it forks only to exec (qstate.core.process.forks): with
threads inside gRPC, a fork + exec runs none of gRPC's fork handlers. Seen from outside: a
fresh interpreter forks children while calls wait; with the handlers on, gRPC logs that it
skips them, and a child may abort before its exec (the CI failure this guards against:
``Check failed: next_worker->state == KICKED``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qstate.core.process.forks import FORK_SUPPORT

SKIPPING = "skipping fork() handlers"

PROBE = """
import subprocess, sys, threading
{first}
import grpc
call = grpc.insecure_channel("127.0.0.1:1").unary_unary("/qstate.Probe/Wait")
def wait():
    try:
        call(b"", timeout=1, wait_for_ready=True)
    except grpc.RpcError:
        pass
threads = [threading.Thread(target=wait) for _ in range(4)]
for t in threads:
    t.start()
while not all(t.is_alive() for t in threads):
    pass
codes = [subprocess.run(["true"], preexec_fn=lambda: None).returncode  # fork + exec
         for _ in range(5)]  # (a preexec_fn forces a fork, as qstate's lifeline does)
for t in threads:
    t.join()
print(sum(c != 0 for c in codes))
"""


def probe(first: str, **env: str) -> tuple[str, int]:
    """gRPC's log of a fresh interpreter that runs ``first``, then forks while calls wait,
    and how many of its children died before they ran."""
    clean = {k: v for k, v in os.environ.items() if k != FORK_SUPPORT}
    done = subprocess.run([sys.executable, "-c", PROBE.format(first=first)],
                          env={**clean, "GRPC_VERBOSITY": "INFO", **env},
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stderr, int(done.stdout)


def test_the_probe_sees_grpc_fork_handlers_when_nothing_turns_them_off() -> None:
    log, _ = probe("")
    assert SKIPPING in log


@pytest.mark.parametrize("first", ["import qstate.cli", "import tests.conftest"])
def test_the_command_line_and_the_test_session_turn_them_off_before_grpc_starts(
        first: str) -> None:
    log, died = probe(first)
    assert SKIPPING not in log and died == 0, log

