"""Spark Structured Streaming jobs whose window aggregates qstate makes queryable."""
