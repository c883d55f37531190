"""The control plane's metrics, exposed by the process that coordinates a job (its driver,
`qstate job`, or a standby, `qstate coordinator`) beside that process's own."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = ["ASSIGNMENT_EPOCH", "REASSIGNMENTS", "STANDBY_ACTIVE"]

ASSIGNMENT_EPOCH = Gauge("qstate_job_assignment_epoch",
                         "Epoch of the job's partition assignment", ["job"])
STANDBY_ACTIVE = Gauge("qstate_job_standby_active",
                       "1 while a standby coordinator (`qstate coordinator`) coordinates the "
                       "job because its driver's lease stopped changing, 0 while it stands by",
                       ["job"])
REASSIGNMENTS = Counter("qstate_job_reassignments_total",
                        "Times partitions moved after start-up because a shard server was "
                        "declared dead or (re)joined", ["job"])
