"""What a user imports to write a Spark job whose window aggregates qstate makes queryable, as
a Spark job imports from ``pyspark.sql.functions`` (docs/own-job.md)::

    from qstate.jobs import QueryableJob, JobContext, window, count, read_kafka, parse_events

The library's modules (``job``, ``queryable``, ``windows``, ``aggregates``, ``source``,
``parse``, ``dlq``) import nothing of ``qstate.jobs.runtime``, the driver and executors that run
a job, nor the control plane (docs/architecture.md §1).

The names are loaded on first use (PEP 562): importing ``qstate.jobs.runtime.metrics`` or
``qstate.jobs.examples.workloads`` (``qstate --help`` does) must not start PySpark.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ below
    from qstate.jobs.aggregates import approx_count_distinct as approx_count_distinct
    from qstate.jobs.aggregates import avg as avg
    from qstate.jobs.aggregates import count as count
    from qstate.jobs.aggregates import max as max
    from qstate.jobs.aggregates import min as min
    from qstate.jobs.aggregates import sum as sum
    from qstate.jobs.job import JobContext as JobContext
    from qstate.jobs.parse import parse_events as parse_events
    from qstate.jobs.queryable import QueryableJob as QueryableJob
    from qstate.jobs.queryable import dlq_topic as dlq_topic
    from qstate.jobs.source import read_kafka as read_kafka
    from qstate.jobs.windows import session_window as session_window
    from qstate.jobs.windows import window as window

__all__ = ["JobContext", "QueryableJob", "approx_count_distinct", "avg", "count", "dlq_topic",
           "max", "min", "parse_events", "read_kafka", "session_window", "sum", "window"]

# each name of the face -> the library module that defines it
_HOME = {"JobContext": "job", "QueryableJob": "queryable", "dlq_topic": "queryable",
         "window": "windows", "session_window": "windows", "read_kafka": "source",
         "parse_events": "parse",
         **{n: "aggregates" for n in ("count", "sum", "min", "max", "avg",
                                      "approx_count_distinct")}}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
