"""The tweets job on a Kafka cluster that asks every client for SASL/PLAIN credentials,
given once in the file QSTATE_KAFKA_PROPERTIES names (README: Kafka with SASL or SSL): the
topic is made, Spark's source reads it (the properties in Java's names), a bad record is
dead-lettered, the lag is known, and the counts served are those produced."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from qstate.client import Client
from qstate.core import config
from qstate.core.errors import StartFailed
from qstate.core.transport.kafka import client_config, java_options, read_properties
from qstate.embedded.kafka import KafkaBroker
from qstate.jobs.job import JobContext
from qstate.jobs.runtime.launch import start_job
from tests.helpers import wait_until
from tests.jobs.test_exactness import dead_letters

HOUR = 3_600_000


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("sasl") / "broker",
                         sasl_users={"alice": "alice-s3cret"}).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_java_options_carry_the_credentials_spark_needs() -> None:
    props = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
             "sasl.username": "bob", "sasl.password": 'p"w\\d', "ssl.ca.location": "/ca.pem",
             "linger.ms": "5", "java.ssl.endpoint.identification.algorithm": ""}
    assert java_options(props) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                            'required username="bob" password="p\\"w\\\\d";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": ""}
    assert "java.ssl.endpoint.identification.algorithm" not in client_config("b:9092", props)


def test_a_properties_file_is_read_and_its_mistakes_named(tmp_path: Path) -> None:
    f = tmp_path / "kafka.properties"
    f.write_text("# a comment\n! another\n\nsecurity.protocol = SASL_SSL\nsasl.password=a=b\n")
    assert read_properties(str(f)) == {"security.protocol": "SASL_SSL", "sasl.password": "a=b"}
    f.write_text("security.protocol SASL_SSL\n")
    with pytest.raises(StartFailed, match="line 1: expected key=value"):
        read_properties(str(f))


@pytest.mark.kafka
# a SASL broker of its own and the job on it: `make soak` (CI; §9)
@pytest.mark.long
def test_the_tweets_job_on_a_cluster_with_sasl(spark, sasl_broker: KafkaBroker, tmp_path: Path,
                                               storage_uri: str, shards, router,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    props = tmp_path / "kafka.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in sasl_broker.client_properties.items()))
    props.chmod(0o600)
    # without credentials the broker answers nothing
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": sasl_broker.bootstrap}).list_topics(timeout=3)
    monkeypatch.setenv("QSTATE_KAFKA_PROPERTIES", str(props))
    config.settings.cache_clear()
    topic, job = "sasl-tweets", "sasltweets"
    ctx = JobContext(sasl_broker.bootstrap, storage_uri, tmp_path / "ckpt", 4, "500 milliseconds",
                     topic=topic, job=job, shards=[s.address for s in shards])
    try:
        running = start_job(spark, "tweets", ctx)  # makes the topic: over SASL
        try:
            now = int(time.time() * 1000) // HOUR * HOUR + 60_000
            truth = {"tw-a": 5, "tw-b": 2, "tw-c": 7}
            producer = Producer(client_config(sasl_broker.bootstrap))
            for key, n in truth.items():
                for i in range(n):
                    producer.produce(topic, orjson.dumps(
                        {"tweet_id": key, "event": "impression", "time": now + i}), key.encode())
            producer.produce(topic, b"not json at all", b"tw-bad")
            assert producer.flush(10) == 0
            ends = running.end_offsets
            assert ends is not None
            wait_until(lambda: sum((ends(topic) or {}).values()) == 15, 30,
                       "end offsets read over SASL")
            running.process_all_available()
            assert running.behind() == {topic: 0}  # the lag, from the broker's end offsets
            with Client(router.url, timeout=30, retries=40, backoff_s=0.25) as c:
                got = {k: c.get(job, "per_tweet_1h", "impressions", k).latest
                       for k in truth}
            assert {k: w.value for k, w in got.items() if w} == truth
            letters = dead_letters(sasl_broker.bootstrap, f"{topic}.dlq")
            assert [(k, v, h["qstate.kind"]) for k, v, h in letters] == [
                (b"tw-bad", b"not json at all", "invalid_json")]
        finally:
            running.stop()
    finally:
        monkeypatch.delenv("QSTATE_KAFKA_PROPERTIES")
        config.settings.cache_clear()
