"""docs/metrics.md lists every metric: its tables are the metric definitions
(``python -m qstate.metrics_doc`` prints them), and no process defines a qstate series
elsewhere that the doc misses."""

from __future__ import annotations

import importlib
from pathlib import Path

from prometheus_client import REGISTRY

from qstate.metrics_doc import metrics_tables

DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()


def test_the_metrics_tables_are_in_the_doc() -> None:
    assert metrics_tables() in DOC


def test_every_series_of_every_process_is_documented() -> None:
    for main in ("qstate.jobs.runtime.supervise", "qstate.shard.main", "qstate.router.main"):
        importlib.import_module(main)  # every module a process imports registers its series
    names = {f.name for f in REGISTRY.collect() if f.name.startswith("qstate_")}
    assert names
    missing = {n for n in names if f"`{n}`" not in DOC and f"`{n}_total`" not in DOC}
    assert not missing, f"run `python -m qstate.metrics_doc` into docs/metrics.md: {missing}"
