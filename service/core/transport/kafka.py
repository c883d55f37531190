"""Small helpers over confluent-kafka shared by jobs, generator and tests, and the one place
a Kafka client's configuration is made: the bootstrap servers and the deployment's client
properties (QSTATE_KAFKA_PROPERTIES: SASL, SSL), for the Python clients and, translated, for
Spark's Kafka source (README: Kafka with SASL or SSL)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from qstate.core.config import settings
from qstate.core.errors import StartFailed

__all__ = ["JAVA_ONLY", "EndOffsets", "client_config", "ensure_topic", "java_options",
           "kafka_properties", "read_properties", "topic_partitions"]

# ---- the deployment's client properties ---------------------------------------------

# librdkafka's SASL mechanisms and the JAAS login module Java's clients take for each
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
JAVA_ONLY = "java."  # a property for Spark's (Java) consumers alone, e.g. java.ssl.keystore.type


def read_properties(path: str) -> dict[str, str]:
    """``key=value`` lines of a properties file (``#`` and ``!`` start comments), as the
    file QSTATE_KAFKA_PROPERTIES names. Its values (passwords) are never logged."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise StartFailed(f"Kafka properties file {path} (QSTATE_KAFKA_PROPERTIES): "
                          f"{exc.strerror}") from None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise StartFailed(f"Kafka properties file {path}, line {n}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def kafka_properties(path: str | None = None) -> dict[str, str]:
    """The deployment's Kafka client properties, in librdkafka's names (security.protocol,
    sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...): the file ``path``
    names (None: QSTATE_KAFKA_PROPERTIES); {} when there is none."""
    path = settings().kafka_properties if path is None else path
    return read_properties(path) if path else {}


def client_config(bootstrap: str, properties: Mapping[str, str] | None = None,
                  **extra: Any) -> dict[str, Any]:
    """A confluent-kafka client's configuration: ``bootstrap``, the deployment's properties
    (None: ``kafka_properties()``) but the Java-only ones, then ``extra``. Every client
    qstate makes (dead letters, topics, lag, the generator) is made from this."""
    props = kafka_properties() if properties is None else properties
    return {"bootstrap.servers": bootstrap,
            **{k: v for k, v in props.items() if not k.startswith(JAVA_ONLY)}, **extra}


def java_options(properties: Mapping[str, str]) -> dict[str, str]:
    """The same properties for Java's Kafka clients (Spark's Kafka source; ``kafka.`` is
    prefixed there): what both take under one name as it is; librdkafka's sasl.username and
    sasl.password as the login module of the mechanism (sasl.jaas.config); ssl.ca.location
    as a PEM trust store; ``java.``-prefixed properties as themselves. librdkafka-only
    properties are left out."""
    shared = {"security.protocol", "sasl.mechanism", "ssl.endpoint.identification.algorithm",
              "client.id", "request.timeout.ms", "session.timeout.ms"}
    out = {k: v for k, v in properties.items() if k in shared}
    mechanism = properties.get("sasl.mechanism") or properties.get("sasl.mechanisms")
    if mechanism:
        out["sasl.mechanism"] = mechanism
    if "sasl.username" in properties:
        module = _LOGIN_MODULES.get((mechanism or "PLAIN").upper())
        if module is None:
            raise StartFailed(f"sasl.mechanism {mechanism}: qstate passes a username and "
                              f"password to Spark for {', '.join(_LOGIN_MODULES)}; give "
                              "java.sasl.jaas.config for others")
        user, password = (_jaas_quoted(properties.get(k, "")) for k in
                          ("sasl.username", "sasl.password"))
        out["sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
    if "ssl.ca.location" in properties:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = properties["ssl.ca.location"]
    out.update({k[len(JAVA_ONLY):]: v for k, v in properties.items()
                if k.startswith(JAVA_ONLY)})
    return out


def _jaas_quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def ensure_topic(bootstrap: str, topic: str, partitions: int = 4, timeout: float = 15.0,
                 properties: Mapping[str, str] | None = None) -> None:
    admin = AdminClient(client_config(bootstrap, properties))
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


def topic_partitions(bootstrap: str, topic: str, timeout: float = 15.0,
                     properties: Mapping[str, str] | None = None) -> list[int]:
    """The partitions of ``topic`` on the broker ([] if it has none, or no such topic)."""
    admin = AdminClient(client_config(bootstrap, properties))
    md = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    return sorted(md.partitions) if md is not None and md.error is None else []


class EndOffsets:
    """A topic's end offsets on the broker now (partition, as Spark names it: "0" -> offset);
    one consumer, made on first use, that never joins a group. None when the broker does not
    answer in ``timeout`` (a status line must not hang on it)."""

    def __init__(self, bootstrap: str, timeout: float = 2.0,
                 properties: Mapping[str, str] | None = None) -> None:
        self.bootstrap, self.timeout = bootstrap, timeout
        self.properties = properties
        self._consumer: Consumer | None = None

    def __call__(self, topic: str) -> dict[str, int] | None:
        try:
            if self._consumer is None:
                self._consumer = Consumer(client_config(
                    self.bootstrap, self.properties, **{"group.id": "qstate-end-offsets",
                                                        "enable.auto.commit": False}))
            md = self._consumer.list_topics(topic, timeout=self.timeout).topics[topic]
            return {str(p): self._consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=self.timeout)[1] for p in md.partitions}
        except (KafkaException, KeyError):
            return None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
