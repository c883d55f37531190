"""Load generation and ground truth for qstate: seeded workloads, a Kafka producer, pandas truth."""
