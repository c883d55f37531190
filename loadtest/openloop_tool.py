"""``qstate-openloop`` (loadtest/openloop, Go, built by ``make bench-setup``): where it is and
how a benchmark runs it. Request i is due at i/rate whether or not earlier ones were
answered; its latency counts from when it was due."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadtest.cpu import pinned

__all__ = ["openloop_binary", "run_openloop"]


def openloop_binary() -> str:
    path = Path(sys.prefix) / "bin" / "qstate-openloop"
    if not path.exists():
        raise SystemExit(f"{path} is missing: `make bench-setup` builds it (Go)")
    return str(path)


def run_openloop(binary: str, target: list[str], keys: Path, rate: int, duration: int,
                 cpus: str = "") -> dict[str, float]:
    """One schedule against ``target``; ``cpus``: the taskset CPU list it runs on."""
    out = subprocess.run(pinned([binary, *target, "-keys", str(keys), "-rate", str(rate),
                                 "-duration", f"{duration}s"], cpus), capture_output=True,
                         text=True, timeout=duration + 120, check=True)
    return json.loads(out.stdout)
