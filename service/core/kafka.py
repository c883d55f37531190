"""Small helpers over confluent-kafka shared by jobs, generator and tests."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = ["ensure_topic"]


def ensure_topic(bootstrap: str, topic: str, partitions: int = 4, timeout: float = 15.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=timeout).topics
    if topic in existing:
        return
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    futures = admin.create_topics([new])
    for fut in futures.values():
        try:
            fut.result(timeout)
        except KafkaException as exc:  # created concurrently by someone else is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
