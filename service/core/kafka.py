"""Small helpers over confluent-kafka shared by jobs, generator and tests."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
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
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


class EndOffsets:
    """A topic's end offsets on the broker now (partition, as Spark names it: "0" -> offset);
    one consumer, made on first use, that never joins a group. None when the broker does not
    answer in ``timeout`` (a status line must not hang on it)."""

    def __init__(self, bootstrap: str, timeout: float = 2.0) -> None:
        self.bootstrap, self.timeout = bootstrap, timeout
        self._consumer: Consumer | None = None

    def __call__(self, topic: str) -> dict[str, int] | None:
        try:
            if self._consumer is None:
                self._consumer = Consumer({"bootstrap.servers": self.bootstrap,
                                           "group.id": "qstate-end-offsets",
                                           "enable.auto.commit": False})
            md = self._consumer.list_topics(topic, timeout=self.timeout).topics[topic]
            return {str(p): self._consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=self.timeout)[1] for p in md.partitions}
        except (KafkaException, KeyError):
            return None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
