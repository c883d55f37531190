"""Which cores a benchmark's processes run on, and the CPU time a server spent.

Load generators and servers are pinned apart (``taskset``): wrk, redis-benchmark and the Go
open-loop tool cost different amounts of CPU, so on a shared core a server's figure would
partly be its load generator's. A server's CPU time over a run (utime + stime of every
thread, and of its live child processes: ``--workers``) over the requests it answered is its
CPU cost a request (loadtest/results/router.md).
"""

from __future__ import annotations

import os
import subprocess

import psutil

__all__ = ["cpu_seconds", "pin", "pin_self", "pinned"]


def pinned(args: list[str], cpus: str) -> list[str]:
    """``args`` run on ``cpus`` (a taskset list, e.g. ``1`` or ``0,1``); empty: anywhere."""
    return ["taskset", "-c", cpus, *args] if cpus else list(args)


def pin(pid: int, cpus: str) -> None:
    """Every thread of the running process ``pid``, and of its live children, on ``cpus``
    (threads and processes it starts later inherit it); empty: left alone."""
    if not cpus:
        return
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(p.pid)], check=True,
                       capture_output=True)


def pin_self(cpus: str) -> None:
    """This process on ``cpus`` (for a load generator run in a child process)."""
    if not cpus:
        return
    chosen: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        chosen.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, chosen)


def cpu_seconds(*pids: int) -> float:
    """User + system CPU seconds of the processes ``pids`` and their live descendants, every
    thread counted."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
    return total
