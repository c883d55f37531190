"""What qstate gives a job module.

``qstate job mypkg.myjob:build`` imports ``mypkg.myjob`` and calls
``build(spark, ctx) -> QueryableJob``: the job reads its topic (``qstate.jobs.source``),
parses it (``qstate.jobs.parse``) and declares its operators (``qstate.jobs.queryable``);
qstate starts them and runs them until stopped. ``ctx`` carries the deployment's settings
(bootstrap servers, storage, partitions, ...) so a job module holds only its logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["JobContext"]


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
    # begin from this savepoint (JOB@NAME, or NAME of this job): qstate.jobs.runtime.origin
    from_savepoint: str | None = None
