"""docs/metrics.md's tables of every metric, from the metric objects themselves
(``python -m qstate.metrics_doc`` prints them; a test keeps the doc in step)."""

from __future__ import annotations

from types import ModuleType

from prometheus_client.metrics import MetricWrapperBase

__all__ = ["metrics_tables"]


def _rows(module: ModuleType) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(exposed name, type, labels, help) of every metric a metrics module defines."""
    rows = []
    seen: set[int] = set()
    for obj in vars(module).values():
        collector = not isinstance(obj, type) and callable(getattr(obj, "collect", None))
        if id(obj) in seen or not (isinstance(obj, MetricWrapperBase) or collector):
            continue
        seen.add(id(obj))
        if isinstance(obj, MetricWrapperBase):
            [family] = obj.describe()
            # private, but the only place the client keeps a metric's label names
            labels: tuple[str, ...] = tuple(obj._labelnames)
            name = family.name + "_total" if family.type == "counter" else family.name
            rows.append((name, family.type, labels, family.documentation))
        else:  # a custom collector: its describe() lists the families it collects
            describe = getattr(obj, "describe", None)
            for family in describe() if describe is not None else ():
                name = family.name + "_total" if family.type == "counter" else family.name
                rows.append((name, family.type, tuple(getattr(family, "_labelnames", ())),
                             family.documentation))
    return sorted(set(rows))  # a labelled child (``SHARD_READS.labels("local")``) repeats


def _table(*modules: ModuleType) -> str:
    """One table of the metrics one process exposes, defined in ``modules``."""
    out = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for name, kind, labels, doc in sorted(r for m in modules for r in _rows(m)):
        out.append(f"| `{name}` | {kind} | {', '.join(labels) or '-'} | "
                   f"{doc.replace('|', '/')} |")
    return "\n".join(out)


def metrics_tables() -> str:
    """One table per process: job, shard server, router."""
    from qstate.control import metrics as control
    from qstate.jobs.runtime import metrics as job
    from qstate.router import metrics as router
    from qstate.shard import metrics as shard

    return "\n\n".join(f"### {title}\n\n{_table(*m)}" for title, m in (
        ("Job (`qstate job`, /metrics on `QSTATE_JOB_METRICS_PORT`)", (job, control)),
        ("Shard server (`qstate shard`, /metrics on `QSTATE_SHARD_METRICS_PORT`)", (shard,)),
        ("Router (`qstate router`, /metrics on its HTTP port)", (router,))))


if __name__ == "__main__":
    print(metrics_tables())
