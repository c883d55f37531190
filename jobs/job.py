"""What a job module gives qstate, and what qstate gives it.

``qstate job mypkg.myjob:build`` imports ``mypkg.myjob`` and calls
``build(spark, ctx) -> JobDefinition``: the job reads its topic (``jobs.source``), parses it
(``jobs.parse``) and declares its queryable operators; qstate starts them with the
queryable sink and runs them until stopped. ``ctx`` carries the deployment's settings
(bootstrap servers, storage, partitions, ...) so a job module holds only its logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pyspark.sql import DataFrame

from service.core.operator import WindowSpec

__all__ = ["JobContext", "JobDefinition", "QueryableOperator"]


@dataclass(frozen=True)
class QueryableOperator:
    name: str
    frame: DataFrame  # streaming aggregation in update mode
    key: str
    states: list[str]
    window: WindowSpec


@dataclass(frozen=True)
class JobDefinition:
    name: str  # the served job: /v1/state/{name}/...
    topic: str  # the topic it reads (for lag and status)
    operators: list[QueryableOperator]


@dataclass(frozen=True)
class JobContext:
    bootstrap: str
    storage: str
    checkpoint: Path  # this job's Spark checkpoints: one folder per operator below it
    partitions: int
    trigger_interval: str
    max_rows_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    shards: list[str] | None = None  # explicit shard addresses; None: registered ones
    retention_ms: int | None = None
    job: str | None = None  # serve under another name than the module's own
    topic: str | None = None  # read another topic than the module's own
    options: dict[str, str] = field(default_factory=dict)  # job-specific (--option K=V)
    dead_letters: bool = True

    def dlq_topic(self, topic: str) -> str | None:
        """Where bad records of ``topic`` go, or None where another query sends them."""
        return f"{topic}.dlq" if self.dead_letters else None

    def without_dead_letters(self) -> JobContext:
        return replace(self, dead_letters=False)
