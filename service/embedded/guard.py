"""Runs a command whose own children could outlive it, so that none of them outlives the
guard's parent (docs/architecture.md §6).

A process qstate starts dies with its parent (``lifeline``: the kernel's SIGKILL), but that
signal reaches that process only: a server that forks workers (gunicorn, which ``feast serve``
runs) leaves them running, re-parented to init, when it is killed outright. The guard stands
between: it adopts descendants orphaned below it, gets SIGTERM (not SIGKILL) when its own
parent dies, and then stops the command (SIGTERM, then SIGKILL after ``--grace``) and kills
every descendant left. SIGTERM or SIGINT to the guard stops the command the same way.

    python -m qstate.embedded.guard [--grace SECONDS] -- COMMAND [ARG...]

Exit codes: the command's (128 + N when signal N ended it); 2: no command, or not on Linux
(no way to adopt descendants there).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from types import FrameType

import psutil

from qstate.embedded.lifeline import adopt_descendants

__all__ = ["guarded", "main"]

# how often the guard looks at its command and at a stop asked
POLL_S = 0.1


def guarded(args: list[str], grace_s: float = 10.0) -> list[str]:
    """``args`` run under the guard (for ``Child``)."""
    return [sys.executable, "-m", "qstate.embedded.guard", "--grace", str(grace_s), "--", *args]


def _kill_descendants(grace_s: float) -> None:
    """SIGTERM to every process below this one, SIGKILL to those left after ``grace_s``;
    each reaped (they are this process's children, adopted or not)."""
    procs = psutil.Process().children(recursive=True)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, left = psutil.wait_procs(procs, timeout=grace_s)
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(left, timeout=grace_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m qstate.embedded.guard",
        description="Run COMMAND so that neither it nor any process it starts outlives this "
        "guard's parent (docs/architecture.md §6).")
    ap.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                    help="seconds COMMAND has to stop after SIGTERM before it and everything "
                    "it started get SIGKILL (default: %(default)s)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no COMMAND given")
    stopping: list[float] = []  # when a stop was asked (the loop below acts on it)

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping:
            stopping.append(time.monotonic())

    # before the command starts: a parent dying from here on stops the guard through `stop`
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not adopt_descendants(signal.SIGTERM):
        print("qstate guard: cannot adopt descendants here (Linux only), or the parent is "
              "gone", file=sys.stderr)
        return 2
    proc = subprocess.Popen(command)
    terminated = False
    while proc.poll() is None:
        if stopping and not terminated:
            proc.terminate()
            terminated = True
        elif stopping and time.monotonic() - stopping[0] > args.grace:
            proc.kill()
        time.sleep(POLL_S)
    _kill_descendants(args.grace)
    rc = proc.returncode
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
