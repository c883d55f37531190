"""The cores a process may use size its thread pools (qstate.core.cpus)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qstate.core.cpus import usable_cpus

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")


def test_usable_cpus_are_the_affinity_not_the_machine() -> None:
    assert usable_cpus() == len(os.sched_getaffinity(0))


def test_a_pinned_router_starts_one_front_thread_and_one_reader_thread() -> None:
    # a child pinned to one core (as `taskset -c 1` or a cpuset pins a router): on a machine
    # of several cores, a thread a machine core would each sleep and wake for the other
    code = ("from qstate.router.engine import ENGINE_THREADS;"
            "from qstate.shard.reader import READER_THREADS;"
            "print(ENGINE_THREADS, READER_THREADS)")
    one = sorted(os.sched_getaffinity(0))[:1]
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, one), timeout=60)
    assert out.stdout.split() == ["1", "1"]
    if len(os.sched_getaffinity(0)) > 1:
        free = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                              text=True, timeout=60)
        assert int(free.stdout.split()[0]) == min(4, len(os.sched_getaffinity(0)))
