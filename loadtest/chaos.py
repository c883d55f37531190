"""Repeat the chaos scenarios and tabulate them: lost, doubled, time to answer again.

    python -m loadtest.chaos --repeats 3

Runs ``pytest tests/chaos -s`` ``--repeats`` times (each a fresh deployment) and appends a
table (scenario, repeats, lost, doubled, p50 and max seconds until every partition answers
again) to ``--out``. Besides the test suite's scenarios (processes killed by their own fault
points at named steps of a batch), it runs the random-timing ones: a shard and the driver
killed from outside at whatever moment a batch is in (tests/chaos/random_timing.py).
``loadtest.cluster`` does the same for the multi-host scenarios.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from loadtest import results

__all__ = ["repeat"]


def repeat(module: str, tests: list[str], tag: str, setup: str, description: str,
           env: dict[str, str] | None = None) -> None:
    """``module``'s command line: run ``tests`` (pytest, ``-s``) ``--repeats`` times, collect
    the lines ``<tag> NAME: {lost, doubled, windows}, answering again after Xs`` they print,
    append the table to ``--out`` (default loadtest/results/<tag>.md)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(f"loadtest/results/{tag}.md"))
    args = ap.parse_args()
    env = env or {}
    # pytest's progress dots may precede the first line on the same line: search, not match
    line_re = re.compile(rf"{tag} (.+?): (\{{.*?\}}), answering again after ([\d.]+)s")
    runs: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    failed = 0
    for i in range(args.repeats):
        p = subprocess.run([sys.executable, "-m", "pytest", *tests, "-s", "-q", "-p",
                            "no:cacheprovider"], capture_output=True, text=True,
                           env={**os.environ, "QSTATE_LONG": "1", **env})
        failed += p.returncode != 0
        for line in p.stdout.splitlines():
            m = line_re.search(line)
            if m:
                runs[m.group(1)].append((ast.literal_eval(m.group(2)), float(m.group(3))))
        print(f"run {i + 1}/{args.repeats}: exit {p.returncode}", file=sys.stderr)
    lines = [f"\n## {tag}, {args.repeats} runs ({failed} failed)\n",
             f"`{results.command(module)}` ({time.strftime('%Y-%m-%d %H:%M')}; {setup})\n",
             "| scenario | repeats | windows compared | lost | doubled "
             "| answering again p50 / max |",
             "|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        t = [x[1] for x in rs]
        lines.append(f"| {name} | {len(rs)} | {sum(x[0]['windows'] for x in rs):,} | "
                     f"{sum(x[0]['lost'] for x in rs)} | {sum(x[0]['doubled'] for x in rs)} | "
                     f"{statistics.median(t):.2f}s / {max(t):.2f}s |")
    results.append(args.out, "\n".join(lines) + "\n")


def main() -> None:
    # files, not the folder: given tests/chaos too, pytest collects random_timing.py (no
    # test_ prefix, so only ever named) under the folder's rules, that is not at all
    repeat("loadtest.chaos", ["tests/chaos/test_chaos.py", "tests/chaos/random_timing.py"],
           "chaos",
           "~5K tweet events/s over 100K ids, ≤3 s out of order, 1% late; P=8, 2 shards, "
           "local[2]", __doc__.split("\n")[0], env={"CHAOS_KEYS": "100000"})


if __name__ == "__main__":
    main()
