from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from typer.testing import CliRunner

from qstate.embedded import generate as gen
from qstate.embedded.generate import DeliveryError, app, produce
from qstate.embedded.ports import free_port
from qstate.jobs.examples.workloads import (
    AD_FIELDS,
    TWEET_FIELDS,
    Tweets,
    events_over_span,
    load_mapping,
)

T0 = 1_700_000_000_000
PARTITIONS = 4


Record = tuple[int | None, bytes | None, bytes | None, int]


def read_records(bootstrap: str, topic: str, timeout: float = 60.0) -> list[Record]:
    """Every (partition, key, value, timestamp in ms) in the topic, read from offset 0 up to
    the high marks."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"loadtest-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        highs = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
        want = sum(highs.values())
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            # consume() waits its full timeout when fewer than num_messages remain.
            for msg in consumer.consume(num_messages=min(5000, want - len(out)), timeout=1):
                assert msg.error() is None, msg.error()
                out.append((msg.partition(), msg.key(), msg.value(), msg.timestamp()[1]))
        assert len(out) == want, f"read {len(out)} of {want} messages"
        return out
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0
               ) -> list[tuple[int | None, bytes | None, bytes | None]]:
    """Every (partition, key, value) in the topic, read from offset 0 up to the high marks."""
    return [(p, k, v) for p, k, v, _ in read_records(bootstrap, topic, timeout)]


def log_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def test_produce_delivers_and_logs_exactly_what_the_topic_holds(broker, topic, tmp_path) -> None:
    events = list(
        events_over_span(Tweets(500, seed=1), 20_000, t0_ms=T0, span_ms=120_000, disorder_ms=2000)
    )
    log = tmp_path / "log" / "events.jsonl"
    n = produce(broker.bootstrap, topic, iter(events), log_path=log, progress=True, total=20_000)
    assert n == 20_000

    held = read_topic(broker.bootstrap, topic)
    logged = log_lines(log)
    assert Counter(v for _, _, v in held) == Counter(logged)
    assert Counter(logged) == Counter(orjson.dumps(e) for e in events)
    # Keyed by tweet_id: the key is the id, and one id lives in one partition.
    partitions_of: dict[bytes | None, set[int | None]] = {}
    for p, k, v in held:
        assert v is not None and orjson.loads(v)["tweet_id"].encode() == k
        partitions_of.setdefault(k, set()).add(p)
    assert all(len(ps) == 1 for ps in partitions_of.values())
    assert len({p for p, _, _ in held}) == PARTITIONS

    # Appends: a second run adds to the same log.
    produce(broker.bootstrap, topic, iter(events[:10]), log_path=log, progress=False)
    assert len(log_lines(log)) == 20_010


def test_rate_pacing(broker, topic) -> None:
    """Pacing never sends event i before start + i/rate: each record's timestamp (the
    producer's clock when it was handed the record, in ms) is at least its slot after a clock
    reading taken before ``produce`` began. How long the run took is not asserted."""
    n, rate = 1500, 3000.0
    events = ({**e, "seq": i} for i, e in
              enumerate(events_over_span(Tweets(10), n, t0_ms=T0, span_ms=1000)))
    before_ms = int(time.time() * 1000)
    assert produce(broker.bootstrap, topic, events, rate=rate, progress=False) == n
    sent = sorted((orjson.loads(v or b"")["seq"], ts)
                  for _, _, v, ts in read_records(broker.bootstrap, topic))
    assert [i for i, _ in sent] == list(range(n))
    # a record may go up to 2 ms before its slot (pacing waits only once it is ahead by more:
    # qstate.embedded.generate._send_all), and the timestamp is cut to the ms
    early = [(i, ts - before_ms, i * 1000 / rate) for i, ts in sent
             if ts < before_ms + i * 1000 / rate - 3]
    assert early == [], f"sent before their slot (seq, ms after start, slot ms): {early[:5]}"


def test_failed_deliveries_raise_and_are_not_logged(broker, topic, tmp_path) -> None:
    log = tmp_path / "events.jsonl"
    # The topic exists (ensure_topic uses the real broker) but the producer talks to a port
    # nobody listens on, so every event times out undelivered.
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(DeliveryError) as info:
        produce(
            broker.bootstrap, topic, events_over_span(Tweets(10), 50, t0_ms=T0, span_ms=1000),
            log_path=log, progress=False,
            config={"bootstrap.servers": dead, "message.timeout.ms": 500},
        )
    assert info.value.failed == 50 and info.value.delivered == 0
    assert log.read_bytes() == b""


def test_events_raising_still_flushes_and_logs(broker, topic, tmp_path) -> None:
    log = tmp_path / "events.jsonl"

    def events():
        yield from events_over_span(Tweets(10), 100, t0_ms=T0, span_ms=1000)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        produce(broker.bootstrap, topic, events(), log_path=log, progress=False)
    assert len(log_lines(log)) == 100
    assert len(read_topic(broker.bootstrap, topic)) == 100


runner = CliRunner()


def test_cli_help() -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0
    for option in ("--bootstrap", "--rate", "--keys", "--duration", "--count", "--disorder-ms",
                   "--late-fraction", "--late-by-ms", "--seed", "--log", "--mapping"):
        assert option in result.output
    assert "QSTATE_KAFKA_BOOTSTRAP" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["clicks"],
        ["tweets", "--late-fraction", "1.5"],
        ["tweets", "--rate", "-1"],
        ["tweets", "--keys", "0"],
        ["tweets", "--bogus"],
    ],
)
def test_cli_bad_usage_exits_2(args: list[str]) -> None:
    assert runner.invoke(app, args).exit_code == 2


def test_cli_tweets_count(broker, topic, tmp_path) -> None:
    log = tmp_path / "tweets.jsonl"
    before = int(time.time() * 1000)
    result = runner.invoke(
        app,
        ["tweets", "--bootstrap", broker.bootstrap, "--topic", topic, "--count", "300",
         "--rate", "0", "--keys", "50", "--disorder-ms", "1000", "--log", str(log),
         "--no-progress"],
    )
    after = int(time.time() * 1000)
    assert result.exit_code == 0, result.output
    events = [orjson.loads(line) for line in log_lines(log)]
    assert len(events) == 300
    assert all(tuple(e) == TWEET_FIELDS for e in events)
    assert all(before - 1000 <= e["time"] <= after for e in events)
    assert len({e["tweet_id"] for e in events}) <= 50
    assert Counter(v for _, _, v in read_topic(broker.bootstrap, topic)) == Counter(
        log_lines(log)
    )


def test_cli_ads_writes_mapping_and_honours_duration(broker, topic, tmp_path, monkeypatch) -> None:
    log, mapping = tmp_path / "ads.jsonl", tmp_path / "m" / "campaigns.json"
    monkeypatch.setenv("QSTATE_KAFKA_BOOTSTRAP", broker.bootstrap)
    result = runner.invoke(
        app,
        ["ads", "--topic", topic, "--duration", "0.5", "--rate", "400", "--keys", "7",
         "--log", str(log), "--mapping", str(mapping), "--late-fraction", "0.1"],
    )
    assert result.exit_code == 0, result.output
    campaigns = load_mapping(mapping)
    assert len(campaigns) == 70
    events = [orjson.loads(line) for line in log_lines(log)]
    assert 50 <= len(events) <= 400
    assert all(tuple(e) == AD_FIELDS and e["ad_id"] in campaigns for e in events)
    assert len(read_topic(broker.bootstrap, topic)) == len(events)


def test_cli_delivery_failure_exits_1(monkeypatch, tmp_path) -> None:
    def failing(*args, **kwargs):
        raise DeliveryError(3, 7, "broker went away")

    monkeypatch.setattr(gen, "produce", failing)
    result = runner.invoke(
        app, ["tweets", "--bootstrap", "127.0.0.1:1", "--count", "10", "--no-progress"]
    )
    assert result.exit_code == 1
    assert "not delivered" in result.output


def test_cli_ctrl_c_stops_cleanly(broker, topic, tmp_path) -> None:
    """The default run-until-Ctrl-C mode: the first SIGINT ends the stream, everything sent is
    flushed and logged, and the exit code is 0."""
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qstate", "generate", "tweets", "--bootstrap", broker.bootstrap,
         "--topic", topic, "--rate", "2000", "--log", str(log), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[3],
    )
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and log.stat().st_size > 0) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    logged = log_lines(log)
    assert logged
    assert Counter(v for _, _, v in read_topic(broker.bootstrap, topic)) == Counter(logged)
