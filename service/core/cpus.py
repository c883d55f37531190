"""The cores this process may run on: what its thread pools are sized by.

``os.cpu_count()`` counts the machine's cores, not the ones the process is allowed: a router
pinned to one core (``taskset``, a cpuset, a Kubernetes static CPU policy) would otherwise
start a thread per machine core and pay a sleep and wake-up between them on every read
(measured in loadtest/results/cluster_reads.md, 2026-12-07).
"""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """How many cores this process may be scheduled on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform (macOS)
        return max(1, os.cpu_count() or 1)
