"""What runs a job written with ``qstate.jobs``: the driver (launch, supervise, origin, commit,
metrics, reports, spark) and the executors' half (pipeline, partials, sinks, spark_state). A
user's job imports none of it (docs/architecture.md §1)."""
