"""The `qstate` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.config import settings

app = typer.Typer(
    help="qstate: queryable state for Spark Structured Streaming.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root() -> None:
    """Settings come from flags, QSTATE_* environment variables or the QSTATE_CONFIG file."""


@app.command()
def shard(
    host: Annotated[str, typer.Option(envvar="QSTATE_SHARD_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="QSTATE_SHARD_PORT",
                                      help="Internal gRPC port (0: any free port).")] = 7100,
    metrics_port: Annotated[int, typer.Option(envvar="QSTATE_SHARD_METRICS_PORT",
                                              help="HTTP /metrics /healthz port (0: any).")] = 0,
    server_id: Annotated[str, typer.Option("--id", envvar="QSTATE_SHARD_ID",
                                           help="Stable server id (default host-port).")] = "",
    advertise: Annotated[str, typer.Option(
        envvar="QSTATE_SHARD_ADVERTISE",
        help="host:port that jobs and routers use to reach this server (default: bind address).")
    ] = "",
    data_dir: Annotated[Path | None, typer.Option(help="RocksDB data (default <home>/shards).")
                        ] = None,
    storage: Annotated[str | None, typer.Option(help="Checkpoint storage path or URI.")] = None,
) -> None:
    """Run a shard server: RocksDB partitions behind the internal gRPC API."""
    from service.shard.main import run

    cfg = settings()
    run(host, port, data_dir or Path(cfg.home) / "shards", storage or cfg.storage_uri,
        server_id, metrics_port, advertise, cfg.snapshot_every)


@app.command()
def job(
    names: Annotated[list[str], typer.Argument(help="Example jobs to run: tweets, ads.")],
    bootstrap: Annotated[str | None, typer.Option(envvar="QSTATE_KAFKA_BOOTSTRAP",
                                                  help="Kafka bootstrap servers.")] = None,
    storage: Annotated[str | None, typer.Option(help="Checkpoint storage path or URI.")] = None,
    checkpoints: Annotated[Path | None, typer.Option(
        help="Spark checkpoint root (default <home>/checkpoints).")] = None,
    shards: Annotated[str | None, typer.Option(
        help="Comma-separated shard addresses (default: servers registered in storage).")
    ] = None,
    partitions: Annotated[int | None, typer.Option(help="Partitions per operator.")] = None,
    trigger: Annotated[str, typer.Option(help="Trigger interval.")] = "1 second",
    max_rows_per_trigger: Annotated[int | None, typer.Option(
        help="Cap rows read per batch (per query).")] = None,
    mapping: Annotated[Path | None, typer.Option(
        help="ads: ad_id -> campaign_id JSON (written by `qstate generate ads`).")] = None,
    master: Annotated[str, typer.Option(
        help="Spark master; local[2,4] retries a failed task up to 4 times.")] = "local[2,4]",
    metrics_port: Annotated[int, typer.Option(help="Prometheus port (0: off).")] = 0,
    live: Annotated[bool, typer.Option(help="Show a live status line.")] = True,
    conf: Annotated[list[str] | None, typer.Option(
        help="Extra Spark setting KEY=VALUE (repeatable).")] = None,
) -> None:
    """Run example jobs (tweets, ads) with the queryable sink until Ctrl-C or SIGTERM."""
    from jobs.main import run_jobs
    from jobs.runner import JOBS, JobConfig

    cfg = settings()
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        raise typer.BadParameter(f"unknown job(s) {unknown}: choose from {sorted(JOBS)}")
    root = checkpoints or Path(cfg.home) / "checkpoints"
    configs = [JobConfig(
        n, bootstrap or cfg.kafka_bootstrap, root / n, storage or cfg.storage_uri,
        shards=shards.split(",") if shards else None, partitions=partitions or cfg.partitions,
        trigger_interval=trigger, max_rows_per_trigger=max_rows_per_trigger,
        mapping=mapping or Path(cfg.home) / "ads-campaigns.json") for n in names]
    extra = {}
    for item in conf or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--conf {item!r}: expected KEY=VALUE")
        extra[k] = v
    run_jobs(configs, metrics_port, master, live=live, spark_conf=extra,
             metrics_host=cfg.metrics_host)


@app.command()
def router(
    host: Annotated[str | None, typer.Option(envvar="QSTATE_ROUTER_HOST")] = None,
    http_port: Annotated[int | None, typer.Option(envvar="QSTATE_HTTP_PORT")] = None,
    grpc_port: Annotated[int | None, typer.Option(envvar="QSTATE_GRPC_PORT")] = None,
    storage: Annotated[str | None, typer.Option(help="Checkpoint storage path or URI.")] = None,
    local_reads: Annotated[bool | None, typer.Option(
        envvar="QSTATE_LOCAL_READS",
        help="Read co-located shards in-process instead of over gRPC.")] = None,
) -> None:
    """Run a router: HTTP and gRPC queries, routed to the shard owning each key."""
    from service.router.main import run

    cfg = settings()
    run(host or cfg.router_host, http_port or cfg.http_port, grpc_port or cfg.grpc_port,
        storage or cfg.storage_uri, cfg.shard_timeout_s, cfg.retry_after_s,
        cfg.local_reads if local_reads is None else local_reads)


@app.command()
def get(
    job: str, operator: str, state: str, key: str,
    from_: Annotated[str | None, typer.Option("--from", help="Epoch ms or ISO-8601.")] = None,
    to: Annotated[str | None, typer.Option(help="Epoch ms or ISO-8601 (exclusive).")] = None,
    url: Annotated[str | None, typer.Option(envvar="QSTATE_ROUTER_URL")] = None,
) -> None:
    """Print one key's latest window (or windows in --from/--to) as JSON.

    Exit codes: 0 found, 1 no data for the key, 2 bad request, 3 unavailable.
    """
    import orjson

    from service.client import Client, QStateError

    try:
        with Client(url or settings().router_url) as c:
            v = c.get(job, operator, state, key, from_=from_, to=to)
    except QStateError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit({404: 1, 400: 2}.get(exc.status, 3)) from None
    typer.echo(orjson.dumps(v.as_dict(), option=orjson.OPT_INDENT_2).decode())


@app.command()
def run(
    bootstrap: Annotated[str | None, typer.Option(envvar="QSTATE_KAFKA_BOOTSTRAP")] = None,
    embedded_broker: Annotated[bool, typer.Option(
        help="Start the dev broker (noida-db) at --bootstrap; off: use a running Kafka.")
    ] = True,
    tweets_rate: Annotated[int, typer.Option(help="Tweet events/s to generate.")] = 5000,
    tweet_keys: Annotated[int, typer.Option(help="Distinct tweet ids.")] = 100_000,
    ads_rate: Annotated[int, typer.Option(help="Ad events/s to generate.")] = 1000,
    partitions: Annotated[int, typer.Option(help="Partitions per operator.")] = 16,
    duration: Annotated[float | None, typer.Option(help="Stop after N seconds.")] = None,
) -> None:
    """The demo: broker, generators, both example jobs, 2 shard servers and the router.

    Ctrl-C or SIGTERM stops every process it started.
    """
    from service.demo import Demo, DemoConfig

    cfg = settings()
    code = Demo(DemoConfig(
        home=Path(cfg.home), bootstrap=bootstrap or cfg.kafka_bootstrap,
        storage=cfg.storage_uri, embedded_broker=embedded_broker, http_port=cfg.http_port,
        grpc_port=cfg.grpc_port, shard_base_port=cfg.shard_port, tweets_rate=tweets_rate,
        tweet_keys=tweet_keys,
        ads_rate=ads_rate, partitions=partitions, duration_s=duration)).run()
    raise typer.Exit(code)


state_app = typer.Typer(help="Inspect served state.", no_args_is_help=True)
app.add_typer(state_app, name="state")


@state_app.command("inspect")
def state_inspect(
    job: Annotated[str | None, typer.Argument(help="Only this job.")] = None,
    storage: Annotated[str | None, typer.Option(help="Checkpoint storage path or URI.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")
                        ] = False,
) -> None:
    """Per operator and partition: owner, state, last batch, watermark, snapshot, deltas.

    Exit code 1 when a partition is down, restoring or unassigned.
    """
    from dataclasses import asdict

    import orjson
    from rich.console import Console
    from rich.table import Table

    from service.inspect import inspect
    from service.storage import Storage

    rows, summary = inspect(Storage(storage or settings().storage_uri), job)
    if json_out:
        for r in rows:
            typer.echo(orjson.dumps(asdict(r)).decode())
    else:
        console = Console()
        for name, s in summary.items():
            console.print(f"[bold]{name}[/bold] epoch {s['epoch']}, {s['partitions']} "
                          f"partitions, newest batch {s['newest_batch']}, "
                          f"{s['manifests']} batch manifests kept")
        table = Table("job", "operator", "partition", "owner", "state", "last batch",
                      "watermark", "snapshot", "deltas")
        for r in rows:
            style = None if r.state == "ready" else "red"
            table.add_row(r.job, r.operator, str(r.partition), r.owner, r.state,
                          str(r.last_batch if r.last_batch is not None else "-"),
                          str(r.watermark_ms if r.watermark_ms is not None else "-"),
                          str(r.snapshot_batch if r.snapshot_batch is not None else "-"),
                          str(r.delta_files), style=style)
        console.print(table)
    if not rows:
        typer.echo("no queryable operators in storage", err=True)
    raise typer.Exit(1 if any(r.state != "ready" for r in rows) else 0)


def _mount_generate() -> None:
    from loadtest.generate import generate

    app.command("generate", no_args_is_help=True)(generate)


_mount_generate()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
