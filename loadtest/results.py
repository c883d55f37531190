"""Where benchmark results go: appended to a Markdown file with the command that made them."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def command(module: str) -> str:
    """The command line that reproduces this run, e.g. ``python -m loadtest.bench_router ...``."""
    return shlex.join(["python", "-m", module, *sys.argv[1:]])


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def append(out: Path, text: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    print(text)
