"""ensure_topic against the session's Apache Kafka broker: a topic created by someone else
between our look and our create is fine; any other refusal is raised, by its error code."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from qstate.core.transport import kafka

pytestmark = pytest.mark.kafka


class _Blind(AdminClient):
    """An admin client whose listing misses every topic: what a concurrent creator's race looks
    like from our side."""

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        meta = super().list_topics(*args, **kwargs)
        meta.topics = {}
        return meta


def test_a_topic_created_concurrently_is_accepted(broker, monkeypatch) -> None:
    topic = f"race-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(15)
    monkeypatch.setattr(kafka, "AdminClient", _Blind)
    kafka.ensure_topic(broker.bootstrap, topic, partitions=2)  # TOPIC_ALREADY_EXISTS: fine
    assert len(admin.list_topics(timeout=15).topics[topic].partitions) == 2


def test_any_other_refusal_is_raised(broker) -> None:
    with pytest.raises(KafkaException) as err:
        kafka.ensure_topic(broker.bootstrap, f"bad!name-{uuid.uuid4().hex[:8]}")
    assert err.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
