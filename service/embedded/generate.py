"""Producing load-test events to Kafka, and the ``qstate generate`` command.

``produce`` appends every event the broker acknowledged to a JSON-lines log, byte for byte
as sent, so ground truth (``loadtest.truth``) can be computed without trusting any qstate
code, nor the topic itself.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from enum import StrEnum
from pathlib import Path
from typing import IO, Annotated, Any

import orjson
import typer
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from qstate.cli_options import S, option
from qstate.core.transport.kafka import client_config, ensure_topic
from qstate.jobs.examples.workloads import (
    Ads,
    Event,
    default_mapping_path,
    live_events,
    make_workload,
)

__all__ = [
    "DEFAULT_KEYS",
    "DEFAULT_MAPPING",
    "KEY_FIELDS",
    "PRODUCER_DEFAULTS",
    "DeliveryError",
    "KeyDistribution",
    "WorkloadName",
    "generate",
    "main",
    "produce",
]

KEY_FIELDS = ("tweet_id", "ad_id")
DEFAULT_MAPPING = default_mapping_path()
DEFAULT_KEYS = {"tweets": 100_000, "ads": 1_000}

# Idempotence: a retried batch must not land twice, or the topic would hold events the
# delivery log has once. The dev broker supports it, as does any Kafka since 0.11.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "linger.ms": 10,
    "message.timeout.ms": 60_000,
}

_PROGRESS_EVERY_S = 0.1  # updating the bar per event would cost more than producing


class DeliveryError(RuntimeError):
    """Some events were not acknowledged by the broker (the log holds only those that were)."""

    def __init__(self, failed: int, delivered: int, first: KafkaError | str | None) -> None:
        super().__init__(f"{failed} event(s) not delivered ({delivered} were): {first}")
        self.failed = failed
        self.delivered = delivered
        self.first = first


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        label = "-- ev/s" if speed is None else f"{speed:,.0f} ev/s"
        return Text(label, style="progress.data.speed")


def _progress_bar(enabled: bool, total: int | None) -> AbstractContextManager[Progress | None]:
    if not enabled:
        return nullcontext()
    columns: list[ProgressColumn | str] = [TextColumn("[bold]{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    else:
        columns.append(TextColumn("{task.completed:,} sent"))
    columns += [
        TextColumn("{task.fields[delivered]:,} delivered"),
        _RateColumn(),
        TimeElapsedColumn(),
    ]
    # stderr: stdout stays free for whatever a caller pipes.
    return Progress(*columns, console=Console(stderr=True), speed_estimate_period=5.0)


class _Tally:
    """Counts sent events and takes delivery reports (librdkafka calls it from poll()/flush(),
    in this thread), logging the delivered ones."""

    def __init__(self, log: IO[bytes] | None) -> None:
        self.log = log
        self.sent = 0
        self.delivered = 0
        self.failed = 0
        self.first_error: KafkaError | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = err
            return
        self.delivered += 1
        if self.log is not None:
            self.log.write((msg.value() or b"") + b"\n")


def produce(
    bootstrap: str,
    topic: str,
    events: Iterable[Event],
    *,
    rate: float | None = None,
    log_path: str | os.PathLike[str] | None = None,
    progress: bool = True,
    total: int | None = None,
    key_field: str | None = None,
    partitions: int = 4,
    config: Mapping[str, Any] | None = None,
) -> int:
    """Produces ``events`` as JSON to ``topic``, keyed by ``key_field`` (default: whichever of
    ``tweet_id`` / ``ad_id`` the events have), and returns how many were delivered.

    ``rate`` paces to that many events/s (None or 0: as fast as possible); ``total`` only sizes
    the progress bar. Delivered events are appended to ``log_path`` as JSON lines. Waits for
    every delivery report, also when ``events`` raises or on Ctrl-C, so the log is complete;
    raises ``DeliveryError`` if any event was not delivered. ``config`` overrides producer
    settings (``PRODUCER_DEFAULTS``).
    """
    if rate is not None and rate < 0:
        raise ValueError(f"rate must be >= 0, got {rate}")
    ensure_topic(bootstrap, topic, partitions=partitions)
    producer = Producer(client_config(bootstrap, None, **{**PRODUCER_DEFAULTS, **(config or {})}))
    log_file: IO[bytes] | None = None
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in the finally below
    tally = _Tally(log_file)
    remaining = 0
    try:
        with _progress_bar(progress, total) as bar:
            task = bar.add_task(topic, total=total, delivered=0) if bar is not None else None
            try:
                _send_all(producer, topic, events, rate, key_field, tally, bar, task)
            finally:
                # Wait for every report even when interrupted: an event the broker holds but
                # the log lacks would make the ground truth wrong.
                remaining = producer.flush()
                if bar is not None and task is not None:
                    bar.update(task, completed=tally.sent, delivered=tally.delivered)
    finally:
        if log_file is not None:
            log_file.close()
    if tally.failed or remaining:
        raise DeliveryError(
            tally.failed + remaining,
            tally.delivered,
            tally.first_error or f"{remaining} still queued after flush",
        )
    return tally.delivered


def _send_all(
    producer: Producer,
    topic: str,
    events: Iterable[Event],
    rate: float | None,
    key_field: str | None,
    tally: _Tally,
    bar: Progress | None,
    task: TaskID | None,
) -> None:
    interval = 1.0 / rate if rate else 0.0
    start = shown = time.monotonic()
    for event in events:
        if interval:
            # Sleeping per event would oversleep at thousands/s; wait only once we are
            # ahead by a couple of ms, then catch up in a short burst. Falling behind is
            # caught up the same way, so the average rate holds.
            delay = start + tally.sent * interval - time.monotonic()
            if delay > 0.002:
                while delay > 0:
                    producer.poll(delay)
                    delay = start + tally.sent * interval - time.monotonic()
        if key_field is None:
            key_field = next((f for f in KEY_FIELDS if f in event), None)
            if key_field is None:
                raise ValueError(f"event has none of the key fields {KEY_FIELDS}: {event}")
        value = orjson.dumps(event)
        key = str(event[key_field]).encode()
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=tally)
                break
            except BufferError:  # local queue full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
        tally.sent += 1
        if bar is not None and task is not None:
            now = time.monotonic()
            if now - shown >= _PROGRESS_EVERY_S:
                bar.update(task, completed=tally.sent, delivered=tally.delivered)
                shown = now


# ---------------------------------------------------------------------------------------------
# CLI


class WorkloadName(StrEnum):
    tweets = "tweets"
    ads = "ads"


class KeyDistribution(StrEnum):
    uniform = "uniform"
    zipf = "zipf"


app = typer.Typer(
    help="Produce load-test events (tweets, YSB ads) to Kafka.",
    add_completion=False,
    no_args_is_help=True,
)


class _StopOnSigint:
    """Turns the first Ctrl-C into a stop flag, so the event stream ends and everything sent
    is still flushed and logged; a second Ctrl-C interrupts as usual."""

    def __init__(self) -> None:
        self.stopped = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: object) -> None:
        self.stopped = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self) -> _StopOnSigint:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: Ctrl-C stays a KeyboardInterrupt
            self._previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


@app.command("generate", no_args_is_help=True)
def generate(
    workload: Annotated[
        WorkloadName,
        typer.Argument(
            help="tweets: {tweet_id, event, time}, keyed by tweet_id. "
            "ads: Yahoo Streaming Benchmark events keyed by ad_id; the ad -> campaign "
            "mapping is written to --mapping.",
            show_default=False,
        ),
    ],
    bootstrap: Annotated[str, option("kafka_bootstrap", "--bootstrap")] = S.kafka_bootstrap,
    topic: Annotated[
        str | None,
        typer.Option(help="Topic, created with 4 partitions if missing "
                     "(default: tweet-events / ad-events).", show_default=False),
    ] = None,
    rate: Annotated[float, typer.Option(min=0, help="Events per second; 0: as fast as possible.")]
    = 5000.0,
    keys: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Distinct keys: tweet ids, or ad campaigns (10 ads each) "
            f"(default: {DEFAULT_KEYS['tweets']} tweets / {DEFAULT_KEYS['ads']} campaigns).",
            show_default=False,
        ),
    ] = None,
    distribution: Annotated[
        KeyDistribution,
        typer.Option(help="How keys are drawn; zipf: key i has weight 1/(i+1)^1.1."),
    ] = KeyDistribution.uniform,
    duration: Annotated[
        float | None,
        typer.Option(min=0, help="Stop after this many seconds.", show_default=False),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(min=0, help="Stop after this many events. Without --duration and "
                     "--count: run until Ctrl-C.", show_default=False),
    ] = None,
    disorder_ms: Annotated[
        int, typer.Option(min=0, help="Event times lag wall-clock time by up to this much.")
    ] = 0,
    late_fraction: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Fraction of events sent --late-by-ms behind the "
                     "newest event time sent so far."),
    ] = 0.0,
    late_by_ms: Annotated[int, typer.Option(min=0, help="How far behind late events lie.")]
    = 60_000,
    seed: Annotated[int, typer.Option(help="Seed for keys, ids and the ads mapping.")] = 0,
    log: Annotated[
        Path | None,
        typer.Option(help="Append every delivered event here (JSON lines), for ground truth.",
                     dir_okay=False, show_default=False),
    ] = None,
    mapping: Annotated[
        Path, typer.Option(help="ads: where to write the ad_id -> campaign_id JSON.",
                           dir_okay=False)
    ] = DEFAULT_MAPPING,
    progress: Annotated[bool, typer.Option(help="Show a progress bar (stderr).")] = True,
) -> None:
    """Produce load-test events to Kafka with wall-clock event times.

    Exit codes: 0 done (or stopped with Ctrl-C), 1 events not delivered, 2 bad usage.
    """
    console = Console(stderr=True)
    wl = make_workload(
        workload.value,
        keys if keys is not None else DEFAULT_KEYS[workload.value],
        seed=seed,
        distribution=distribution.value,
    )
    topic = topic or wl.default_topic
    if isinstance(wl, Ads):
        wl.write_mapping(mapping)
        console.print(f"campaign mapping ({len(wl.mapping):,} ads) written to {mapping}")

    sigint = _StopOnSigint()
    deadline = None if duration is None else time.monotonic() + duration

    def stop() -> bool:
        return sigint.stopped or (deadline is not None and time.monotonic() >= deadline)

    events: Iterable[Event] = live_events(
        wl,
        disorder_ms=disorder_ms,
        late_fraction=late_fraction,
        late_by_ms=late_by_ms,
        seed=seed,
        stop=stop,
    )
    if count is not None:
        events = itertools.islice(events, count)
    if duration is None and count is None:
        console.print("producing until Ctrl-C")
    started = time.monotonic()
    try:
        with sigint:
            delivered = produce(
                bootstrap,
                topic,
                events,
                rate=rate or None,
                log_path=log,
                progress=progress,
                total=count,
            )
    except DeliveryError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    except KafkaException as exc:
        console.print(f"[red]error:[/red] Kafka at {bootstrap}: {exc}")
        raise typer.Exit(1) from exc
    elapsed = time.monotonic() - started
    console.print(
        f"delivered {delivered:,} {wl.name} events to {topic} in {elapsed:.1f}s "
        f"({delivered / elapsed if elapsed > 0 else 0:,.0f} ev/s)"
        + (f"; log: {log}" if log else "")
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
