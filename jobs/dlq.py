"""The dead-letter topic: where records that cannot be parsed go, with why and where from.

* key and value: the original bytes of the record
* headers ``qstate.error`` (why, naming the field), ``qstate.kind`` (the metric's reason),
  ``qstate.topic``, ``qstate.partition``, ``qstate.offset`` and ``qstate.timestamp`` (epoch
  ms; absent when the record had none)

Delivery is at-least-once: the writer is flushed before a parsed batch goes downstream, so a
committed micro-batch never loses a dead letter; a replayed micro-batch produces its bad
records again, with identical coordinates headers, which is the key to drop them by.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from qstate.core.transport.kafka import client_config

__all__ = ["DLQ_FLUSH_TIMEOUT_S", "DLQ_MAX_MESSAGE_BYTES", "DeadLetterWriter",
           "close_dlq_producers", "ensure_dlq"]

# The DLQ must take whatever the source topic took, plus our headers. Kafka brokers default
# to ~1 MB per record (max.message.bytes=1048588), so ensure_dlq raises it on the topic and
# the producer allows as much.
DLQ_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
DLQ_FLUSH_TIMEOUT_S = 120.0




def ensure_dlq(
    bootstrap: str,
    topic: str,
    partitions: int = 1,
    max_message_bytes: int = DLQ_MAX_MESSAGE_BYTES,
    timeout: float = 15.0,
    properties: Mapping[str, str] | None = None,
) -> None:
    """Create the DLQ topic if missing, sized for large records.

    Not service.kafka.ensure_topic: that cannot set topic configs, and a DLQ created with the
    broker default of ~1 MB per record would reject exactly the oversized values it is for.
    An existing topic is left as it is. ``properties``: the deployment's Kafka client
    properties (None: QSTATE_KAFKA_PROPERTIES's).
    """
    admin = AdminClient(client_config(bootstrap, properties, **{"log.connection.close": False}))
    # list_topics() without a topic name: asking for one topic auto-creates it on brokers
    # that allow that, with default configs.
    if topic in admin.list_topics(timeout=timeout).topics:
        return
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=1,
        config={"max.message.bytes": str(max_message_bytes + 64 * 1024)},
    )
    for fut in admin.create_topics([new], request_timeout=timeout).values():
        try:
            fut.result(timeout)
        except KafkaException as exc:  # created concurrently by someone else is fine
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


# One producer per worker process: Python workers are reused across tasks. An idle producer
# sends nothing, so unlike a consumer it is fine to keep around.
_PRODUCERS: dict[tuple[str, tuple[tuple[str, str], ...]], Producer] = {}
_PRODUCERS_PID = os.getpid()


def close_dlq_producers(timeout: float = 10.0) -> None:
    """Flush and close this process's cached DLQ producers (tests; also at interpreter exit)."""
    while _PRODUCERS:
        _, producer = _PRODUCERS.popitem()
        with contextlib.suppress(Exception):
            producer.flush(timeout)
            producer.close()


atexit.register(close_dlq_producers)


def _producer(bootstrap: str, properties: Mapping[str, str]) -> Producer:
    global _PRODUCERS_PID
    if os.getpid() != _PRODUCERS_PID:
        _PRODUCERS.clear()  # librdkafka handles do not survive fork()
        _PRODUCERS_PID = os.getpid()
    key = (bootstrap, tuple(sorted(properties.items())))
    producer = _PRODUCERS.get(key)
    if producer is None:
        producer = _PRODUCERS[key] = Producer(client_config(bootstrap, properties, **{
            "message.max.bytes": DLQ_MAX_MESSAGE_BYTES,
            "compression.type": "lz4",
            "linger.ms": 20,
            "acks": "all",
            # Delivery must resolve (either way) well within the flush timeout.
            "message.timeout.ms": int(DLQ_FLUSH_TIMEOUT_S * 1000 / 2),
            "log.connection.close": False,
        }))
    return producer


class DeadLetterWriter:
    """Produces bad records for one output batch and waits until the broker has them all."""

    def __init__(self, bootstrap: str, topic: str,
                 properties: Mapping[str, str] | None = None) -> None:
        """``properties``: the deployment's Kafka client properties; on an executor, those
        the driver read (``qstate.core.transport.kafka.kafka_properties``), carried in the task."""
        self.topic = topic
        self.producer = _producer(bootstrap, {} if properties is None else properties)
        self._failed: list[tuple[KafkaError, bytes | None, bytes | None, list]] = []

    def _delivery(self, key: bytes | None, value: bytes | None, headers: list) -> Callable:
        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                self._failed.append((err, key, value, headers))

        return on_delivery

    def send(
        self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        try:
            self._produce(key, value, headers)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            self._produce_without_value(key, value, headers, exc.args[0])

    def _produce(self, key: bytes | None, value: bytes | None, headers: list) -> None:
        while True:
            try:
                self.producer.produce(
                    self.topic, value=value, key=key, headers=headers,
                    on_delivery=self._delivery(key, value, headers),
                )
                return
            except BufferError:
                self.producer.poll(0.1)  # local queue full: let deliveries drain

    def _produce_without_value(
        self, key: bytes | None, value: bytes | None, headers: list, err: KafkaError
    ) -> None:
        # Bigger than the DLQ accepts even though the source topic took it. Keeping the job
        # alive beats keeping the bytes: the coordinates headers still point at the original.
        size = 0 if value is None else len(value)
        note = f"{size} bytes, dropped: {err.str()}".encode()
        self._produce(key, None, [*headers, ("qstate.value_dropped", note)])

    def flush(self) -> None:
        remaining = self.producer.flush(DLQ_FLUSH_TIMEOUT_S)
        failed, self._failed = self._failed, []
        retried = False
        for err, key, value, headers in failed:
            if err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                # Failing the task is the only way not to lose it: Spark retries the batch.
                raise KafkaException(err)
            self._produce_without_value(key, value, headers, err)
            retried = True
        if retried:
            remaining = self.producer.flush(DLQ_FLUSH_TIMEOUT_S)
            if self._failed:
                raise KafkaException(self._failed[0][0])
        if remaining:
            raise RuntimeError(f"dead-letter topic {self.topic}: {remaining} records undelivered")


