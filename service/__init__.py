"""qstate: queryable state for Spark Structured Streaming."""
