"""The `qstate` command line.

Every option that is a setting defaults to its effective value (flag > QSTATE_* environment
> QSTATE_CONFIG file > default, see ``qstate.core.config``), and ``--help`` shows it.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import qstate.core.process.forks  # noqa: F401  (first: before anything imports gRPC)
from qstate.cli_options import S, given, option
from qstate.exit_codes import HELP as EXIT_CODES

if TYPE_CHECKING:  # imported by the commands that use them: `qstate --help` stays quick
    from qstate.core.errors import QStateError
    from qstate.core.records.storage import Storage

__all__ = ["app", "main"]

app = typer.Typer(
    help="qstate: queryable state for Spark Structured Streaming.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root() -> None:
    """Settings come from flags, QSTATE_* environment variables or the QSTATE_CONFIG file."""


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"{flag} {item!r}: expected KEY=VALUE")
        out[k] = v
    return out


def _arm_fault() -> None:
    """QSTATE_FAULT (chaos tests, ``qstate.core.process.faults``): parsed as the process starts, so
    a typo fails here and not silently at batch N."""
    from qstate.core.errors import InvalidRequest
    from qstate.core.process import faults

    try:
        faults.arm(S.fault)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message, param_hint="QSTATE_FAULT") from None


def _refused_start(exc: Exception) -> typer.Exit:
    """A server that may not start as configured (``StartFailed``): one line, exit 2."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@app.command()
def shard(
    host: Annotated[str, option("shard_host", "--host")] = S.shard_host,
    port: Annotated[int, option("shard_port", "--port")] = S.shard_port,
    metrics_port: Annotated[int, option("shard_metrics_port", "--metrics-port")
                            ] = S.shard_metrics_port,
    reader_port: Annotated[int, option("shard_reader_port", "--reader-port")
                           ] = S.shard_reader_port,
    server_id: Annotated[str, option("shard_id", "--id")] = S.shard_id,
    advertise: Annotated[str, option("shard_advertise", "--advertise")] = S.shard_advertise,
    data_dir: Annotated[Path, option("shard_data_dir", "--data-dir")] = Path(S.shard_data),
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
) -> None:
    """Run a shard server: RocksDB partitions behind the internal gRPC API.

    Exit codes: 0 stopped by SIGTERM/Ctrl-C; 2 a setting does not allow starting (e.g. a
    non-loopback --host without TLS and QSTATE_CLUSTER_TOKEN).
    """
    from qstate.core.errors import StartFailed
    from qstate.shard.main import ShardOptions, run

    _arm_fault()
    try:
        run(ShardOptions(host, port, data_dir, storage, server_id, metrics_port, advertise, S,
                         reader_port))
    except StartFailed as exc:
        raise _refused_start(exc) from None


def _working_directory_first() -> None:
    """The user's job module is found as ``python -m`` finds one: the working directory
    first, here and in Spark's Python workers (which a job's functions run in)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [cwd, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])


@app.command()
def job(
    cli: typer.Context,
    names: Annotated[list[str], typer.Argument(
        help="Jobs to run: MODULE:FUNCTION, a function build(spark, ctx) that returns a "
             "qstate.jobs.QueryableJob (ctx: qstate.jobs.JobContext; "
             "docs/own-job.md), found as `python -m` finds modules "
             "(the working directory first); or an example: tweets, ads.")],
    bootstrap: Annotated[str, option("kafka_bootstrap", "--bootstrap")] = S.kafka_bootstrap,
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
    checkpoints: Annotated[Path, option("checkpoints", "--checkpoints")
                           ] = Path(S.checkpoints_dir),
    shards: Annotated[str | None, typer.Option(
        help="Comma-separated shard addresses (default: servers registered in storage).")
    ] = None,
    partitions: Annotated[int, option(
        "partitions", "--partitions", more="A job begun from a savepoint (--from-savepoint) "
        "takes the savepoint's count unless one is set here, in QSTATE_PARTITIONS or the "
        "config file.")] = S.partitions,
    trigger: Annotated[str, option("trigger_interval", "--trigger")] = S.trigger_interval,
    max_rows_per_trigger: Annotated[int, option(
        "max_rows_per_trigger", "--max-rows-per-trigger")] = S.max_rows_per_trigger,
    master: Annotated[str, option("spark_master", "--master")] = S.spark_master,
    driver_host: Annotated[str, option("driver_host", "--driver-host")] = S.driver_host,
    metrics_port: Annotated[int, option("job_metrics_port", "--metrics-port")
                            ] = S.job_metrics_port,
    starting_offsets: Annotated[str, typer.Option(
        help="Where a new job starts reading its topic: earliest, latest, or JSON of "
             'offsets per partition, e.g. {"tweets": {"0": 42}}. A job that has a '
             "checkpoint goes on from it.")] = "earliest",
    live: Annotated[bool, typer.Option(help="Show a live status line.")] = True,
    options: Annotated[list[str] | None, typer.Option(
        "--option", help="A job's own setting KEY=VALUE (repeatable), e.g. "
                         "mapping=PATH for the ads example.")] = None,
    conf: Annotated[list[str] | None, typer.Option(
        help="Extra Spark setting KEY=VALUE (repeatable).")] = None,
    name: Annotated[str | None, typer.Option(
        help="Serve the one job under this name (and keep its checkpoint under it) instead "
             "of the module's own, e.g. a second version beside the first.")] = None,
    from_savepoint: Annotated[str | None, typer.Option(
        help="Begin from a savepoint, JOB@NAME: another job's forks it (give --name), the "
             "job's own (or NAME alone) rolls the job back to it; its state, source "
             "offsets and (unless --partitions) partition count are the savepoint's "
             "(docs/upgrading.md). A job that already began "
             "from it goes on from its checkpoint.")] = None,
) -> None:
    """Run jobs with the queryable sink until Ctrl-C or SIGTERM.

    Exit codes: 0 stopped by SIGTERM/Ctrl-C; 1 every job failed, or no such savepoint; 2 a
    bad argument, or a job that cannot begin from --from-savepoint (the message says why);
    3 the savepoint is incomplete.
    """
    from qstate.core.address import check_name
    from qstate.core.errors import InvalidRequest, QStateError
    from qstate.core.records.savepoint import read_savepoint
    from qstate.jobs.job import JobContext
    from qstate.jobs.runtime.launch import check_starting_offsets, load_builder
    from qstate.jobs.runtime.origin import savepoint_partitions, split_savepoint
    from qstate.jobs.runtime.supervise import checkpoint_names, run_jobs
    from qstate.shard.seed import seed

    _working_directory_first()
    try:
        for builder in names:
            load_builder(builder)
        checkpoint_names(names)
        check_starting_offsets(starting_offsets)
        if (name or from_savepoint) and len(names) != 1:
            raise InvalidRequest("--name and --from-savepoint take one job")
        if name:
            check_name("job", name)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message) from None
    if from_savepoint:  # said before Spark starts
        owner, saved = split_savepoint(from_savepoint, name or checkpoint_names(names)[0])
        try:
            sp = read_savepoint(_existing_storage(storage), owner, saved)
        except QStateError as exc:
            raise _failed(exc) from None
        if not given(cli, "partitions"):  # its state has the savepoint's partitions
            partitions = savepoint_partitions(sp) or partitions
    _arm_fault()
    ctx = JobContext(bootstrap, storage, checkpoints, partitions, trigger,
                     max_rows_per_trigger or None, starting_offsets,
                     shards=shards.split(",") if shards else None,
                     options=_pairs(options, "--option"), job=name,
                     from_savepoint=from_savepoint)
    try:
        run_jobs(names, ctx, metrics_port, master, live=live,
                 spark_conf=_pairs(conf, "--conf"), metrics_host=S.metrics_host,
                 driver_host=driver_host, seed=seed)
    except QStateError as exc:
        raise _failed(exc) from None


@app.command()
def coordinator(
    jobs: Annotated[list[str], typer.Argument(help="Jobs to stand by for, by name.")],
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
    metrics_port: Annotated[int, option("coordinator_metrics_port", "--metrics-port")
                            ] = S.coordinator_metrics_port,
) -> None:
    """Stand by for jobs' drivers: while a job's driver is down (its lease in storage
    unchanged for QSTATE_LEASE_S), move a dead shard server's partitions to live ones, so
    that serving does not wait for the job. Never commits; steps aside when the driver beats
    again.

    Exit codes: 0 stopped by SIGTERM/Ctrl-C.
    """
    from qstate.control.standby import run_standby

    run_standby(storage, jobs, S, metrics_port)


@app.command()
def router(
    host: Annotated[str, option("router_host", "--host")] = S.router_host,
    http_port: Annotated[int, option("http_port", "--http-port")] = S.http_port,
    grpc_port: Annotated[int, option("grpc_port", "--grpc-port")] = S.grpc_port,
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
    local_reads: Annotated[bool, option("local_reads", "--local-reads/--no-local-reads")
                           ] = S.local_reads,
    workers: Annotated[int, option("router_workers", "--workers")] = S.router_workers,
    worker_http_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run a router: HTTP and gRPC queries, routed to the shard owning each key.

    Exit codes: 0 stopped by SIGTERM/Ctrl-C; 1 a worker died (--workers); 2 a setting does
    not allow starting (e.g. a non-loopback --host without TLS, client tokens and
    QSTATE_CLUSTER_TOKEN), or a port is held.
    """
    from qstate.core.errors import StartFailed
    from qstate.router.main import RouterOptions, run

    try:
        if workers > 1 and worker_http_fd is None:
            from qstate.embedded.router_workers import serve_workers

            raise typer.Exit(serve_workers(workers, host, http_port, grpc_port, [
                "--host", host, "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                "--storage", storage, "--local-reads" if local_reads else "--no-local-reads",
                "--workers", "1"]))
        run(RouterOptions(host, http_port, grpc_port, storage, local_reads, S,
                          worker_http_fd))
    except StartFailed as exc:
        raise _refused_start(exc) from None


def _failed(exc: QStateError) -> typer.Exit:
    """The error said on stderr, and the exit with its code of ``qstate.exit_codes``."""
    from qstate.exit_codes import exit_code

    typer.echo(f"error: {exc.message}", err=True)
    return typer.Exit(exit_code(exc))


def _ask(url: str, ca: str, token: str, token_file: str, question: Any,
         direct: bool = False, allow_stale: bool = False) -> Any:
    """``question(client)`` of the router at ``url`` (``direct``: of the routers its
    cluster map names, for keys); a failure leaves with its code of ``qstate.exit_codes``,
    the same as the Node client's."""
    import httpx

    from qstate.client import Client
    from qstate.core.errors import QStateError
    from qstate.exit_codes import Exit

    try:
        with Client(url, ca=ca or None, token=token or None, token_file=token_file or None,
                    insecure_token=S.allow_insecure, direct=direct,
                    allow_stale=allow_stale) as c:
            return question(c)
    except QStateError as exc:
        raise _failed(exc) from None
    except httpx.TransportError as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__  # one line; a timeout has no text
        typer.echo(f"error: the router at {url} cannot be reached: {why}", err=True)
        raise typer.Exit(Exit.UNREACHABLE) from None


@app.command()
def get(
    job: str, operator: str, state: str, key: str,
    from_: Annotated[str | None, typer.Option("--from", help="Epoch ms or ISO-8601.")] = None,
    to: Annotated[str | None, typer.Option(help="Epoch ms or ISO-8601 (exclusive).")] = None,
    savepoint: Annotated[str | None, typer.Option(
        help="As of this savepoint of the job (qstate savepoint create).",
        show_default=False)] = None,
    url: Annotated[str, option("router_url", "--url")] = S.router_url,
    ca: Annotated[str, option("tls_ca", "--ca")] = S.tls_ca,
    token: Annotated[str, option("token", "--token", show_default=False)] = S.token,
    token_file: Annotated[str, option("token_file", "--token-file")] = S.token_file,
    direct: Annotated[bool, option("client_direct", "--direct/--no-direct")] = S.client_direct,
    allow_stale: Annotated[bool, option(
        "client_allow_stale", "--allow-stale/--no-allow-stale")] = S.client_allow_stale,
) -> None:
    """Print one key's latest window (or windows in --from/--to) as JSON, live or as of a
    --savepoint.

    {exit_codes}
    """
    v = _ask(url, ca, token, token_file,
             lambda c: c.get(job, operator, state, key, from_=from_, to=to,
                             savepoint=savepoint), direct, allow_stale)
    typer.echo(v.model_dump_json(indent=2))


@app.command()
def top(
    job: str, operator: str, state: str,
    n: Annotated[int, typer.Option("-n", "--n", help="How many keys.")] = 10,
    asc: Annotated[bool, typer.Option("--asc", help="Smallest values first.")] = False,
    window: Annotated[str | None, typer.Option(
        help="A time in the window to rank: epoch ms, ISO-8601 or now-1h. Default: the "
             "current one, the oldest window still open at the watermark.")] = None,
    url: Annotated[str, option("router_url", "--url")] = S.router_url,
    ca: Annotated[str, option("tls_ca", "--ca")] = S.tls_ca,
    token: Annotated[str, option("token", "--token", show_default=False)] = S.token,
    token_file: Annotated[str, option("token_file", "--token-file")] = S.token_file,
    allow_stale: Annotated[bool, option(
        "client_allow_stale", "--allow-stale/--no-allow-stale")] = S.client_allow_stale,
) -> None:
    """Print the N keys with the largest (--asc: smallest) value of a state in one window,
    across every partition, ties by key, as JSON.

    An empty window is an answer (exit 0). Bad requests include n out of bounds, session
    windows and a state that does not order. {exit_codes}
    """
    board = _ask(url, ca, token, token_file, lambda c: c.top(
        job, operator, state, n, descending=not asc, window=window), allow_stale=allow_stale)
    typer.echo(board.model_dump_json(indent=2))


@app.command()
def watch(
    job: str, operator: str, state: str,
    keys: Annotated[list[str] | None, typer.Argument(
        help="Keys to watch (or --top).", show_default=False)] = None,
    top: Annotated[int | None, typer.Option(
        help="Watch the current window's top N instead of keys.", show_default=False)] = None,
    asc: Annotated[bool, typer.Option("--asc", help="With --top: smallest first.")] = False,
    from_batch: Annotated[int | None, typer.Option(
        help="Resume after this batch (an event's batch).", show_default=False)] = None,
    max_events: Annotated[int | None, typer.Option(
        help="Stop after this many events. Default: until Ctrl-C.", show_default=False)
    ] = None,
    max_reconnects: Annotated[int | None, typer.Option(
        help="Give up after this many failed reconnections in a row. Default: never.",
        show_default=False)] = None,
    url: Annotated[str, option("router_url", "--url")] = S.router_url,
    ca: Annotated[str, option("tls_ca", "--ca")] = S.tls_ca,
    token: Annotated[str, option("token", "--token", show_default=False)] = S.token,
    token_file: Annotated[str, option("token_file", "--token-file")] = S.token_file,
) -> None:
    """Print pushed changes as JSON lines, one per event: after each committed batch, the
    watched keys whose value changed, or the top-N board when it changed. The first event
    holds every value (snapshot); a dropped connection or a restarted router is resumed
    from the last event's batch.

    It exits 0 once --max-events are printed or on Ctrl-C, 4 when the router stays out
    of reach for --max-reconnects. Bad requests include keys and --top both or neither,
    and too many keys. {exit_codes}
    """

    def follow(c: Any) -> None:
        events = c.watch(job, operator, state, keys or (), top=top, descending=not asc,
                         from_batch=from_batch, max_reconnects=max_reconnects)
        for i, ev in enumerate(events, 1):
            typer.echo(ev.model_dump_json())
            if max_events is not None and i >= max_events:
                return

    try:
        _ask(url, ca, token, token_file, follow)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
def certs(
    out: Annotated[Path, typer.Option(help="Folder for ca.pem, server.pem, server-key.pem.")
                   ] = Path(S.home) / "certs",
    host: Annotated[list[str] | None, typer.Option(
        help="A name or address the server certificate is valid for, besides 127.0.0.1, "
             "::1 and localhost (repeatable).")] = None,
    days: Annotated[int, typer.Option(help="Validity.")] = 365,
) -> None:
    """Make a development CA and a server certificate it signs; print the settings to use.

    Keys are written mode 0600. Production certificates come from your own CA.
    """
    from qstate.embedded.certs import make_certs

    typer.echo(make_certs(out, host or [], days).env_lines())


@app.command()
def run(
    bootstrap: Annotated[str, option("kafka_bootstrap", "--bootstrap")] = S.kafka_bootstrap,
    embedded_broker: Annotated[bool, typer.Option(
        help="Start the embedded broker at --bootstrap; off: use a running Kafka.")
    ] = True,
    tweets_rate: Annotated[int, typer.Option(help="Tweet events/s to generate.")] = 5000,
    tweet_keys: Annotated[int, typer.Option(help="Distinct tweet ids.")] = 100_000,
    ads_rate: Annotated[int, typer.Option(help="Ad events/s to generate.")] = 1000,
    partitions: Annotated[int, typer.Option(help="Partitions per operator.")] = 16,
    duration: Annotated[float | None, typer.Option(help="Stop after N seconds.")] = None,
    event_log: Annotated[Path | None, typer.Option(
        help="Folder where the generators append every event the broker acknowledged "
             "(tweets.jsonl, ads.jsonl): ground truth to check the counts against.")] = None,
) -> None:
    """The demo: broker, generators, both example jobs, 2 shard servers and the router.

    Ctrl-C or SIGTERM stops every process it started; if it is killed outright (kill -9, the
    OOM killer) they die with it.

    Exit codes: 0 stopped by Ctrl-C/SIGTERM or --duration over; 1 a process it started died
    (its log named); 2 a port it needs is held by another process (each named with its PID).
    """
    from qstate.core.cpus import usable_cpus
    from qstate.embedded.demo import Demo, DemoConfig

    code = Demo(DemoConfig(
        home=Path(S.home), bootstrap=bootstrap, storage=S.storage_uri,
        embedded_broker=embedded_broker, http_port=S.http_port, grpc_port=S.grpc_port,
        shard_base_port=S.shard_port, shard_metrics_base_port=S.shard_metrics_port,
        tweets_rate=tweets_rate, tweet_keys=tweet_keys,
        ads_rate=ads_rate, partitions=partitions, duration_s=duration,
        # half the cores, unless QSTATE_ROUTER_WORKERS says: the rest run Spark and Kafka
        router_workers=S.router_workers if "router_workers" in S.model_fields_set
        else max(1, usable_cpus() // 2),
        job_metrics_port=S.job_metrics_port, event_log=event_log)).run()
    raise typer.Exit(code)


token_app = typer.Typer(help="Client tokens of the router (stored hashed).",
                        no_args_is_help=True)
app.add_typer(token_app, name="token")
_TOKENS_FILE = S.tokens_file or str(Path(S.home) / "tokens.json")


@token_app.command("add")
def token_add(
    name: Annotated[str, typer.Argument(help="Who holds it, e.g. grafana.")],
    scope: Annotated[list[str], typer.Option(
        help="JOB, JOB/OPERATOR or * (repeatable): what the token may read.")],
    file: Annotated[Path, typer.Option(
        help="Tokens file (QSTATE_TOKENS_FILE of the router).")] = Path(_TOKENS_FILE),
) -> None:
    """Make a token: its hash goes to the file (mode 0600), the token to stdout, once.

    Exit codes: 0 made; 2 a bad scope or name, or the name exists.
    """
    from pydantic import ValidationError

    from qstate.core.errors import InvalidRequest
    from qstate.core.transport.tokens import add_token

    try:
        token = add_token(file, name, scope)
    except (InvalidRequest, ValidationError) as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(token)
    typer.echo(f"token {name!r} added to {file}; the router reads it with "
               f"QSTATE_TOKENS_FILE={file}. It is shown only now.", err=True)


@token_app.command("list")
def token_list(
    file: Annotated[Path, typer.Option(help="Tokens file.")] = Path(_TOKENS_FILE),
) -> None:
    """Names and scopes of the tokens in the file (never their hashes)."""
    from qstate.core.errors import StartFailed
    from qstate.core.transport.tokens import TokenFile

    try:
        entries = TokenFile.model_validate_json(file.read_bytes()).tokens
    except (OSError, ValueError) as exc:
        raise _refused_start(StartFailed(f"tokens file {file}: {exc}")) from None
    for e in entries:
        typer.echo(f"{e.name}\t{' '.join(e.scopes)}")


state_app = typer.Typer(help="Inspect served state; change a job's partition count.",
                        no_args_is_help=True)
app.add_typer(state_app, name="state")


def _existing_storage(storage: str) -> Storage:
    """The checkpoint storage at ``storage`` to read, or exit 1 saying where it looked (a
    tool that only reads makes no folder)."""
    from qstate.core.records.storage import Storage

    st = Storage(storage, make_root=False)
    if not st.root_exists():
        typer.echo(f"error: no checkpoint storage at {st.root} (--storage, QSTATE_STORAGE; "
                   f"default <home>/storage, QSTATE_HOME): point it at your deployment's",
                   err=True)
        raise typer.Exit(1)
    return st


@state_app.command("inspect")
def state_inspect(
    job: Annotated[str | None, typer.Argument(help="Only this job.")] = None,
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")
                        ] = False,
) -> None:
    """Per operator and partition: owner, state, last batch, watermark, snapshot, deltas,
    followers.

    Exit code 1 when a partition is down, restoring or unassigned, or its shard refused
    this tool (no or the wrong cluster token: QSTATE_CLUSTER_TOKEN or _FILE), or when there
    is no storage or no operator in it to inspect; 2 when the cluster token file cannot be
    read. It only reads: it makes no folder.
    """
    from dataclasses import asdict

    import orjson
    from rich.console import Console
    from rich.table import Table

    from qstate.core.errors import StartFailed
    from qstate.inspect import inspect

    st = _existing_storage(storage)
    try:
        rows, summary = inspect(st, job)
    except StartFailed as exc:  # e.g. an unreadable cluster token file
        raise _refused_start(exc) from None
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
                      "watermark", "snapshot", "deltas", "followers")
        for r in rows:
            style = None if r.state == "ready" else "red"
            table.add_row(r.job, r.operator, str(r.partition), r.owner, r.state,
                          str(r.last_batch if r.last_batch is not None else "-"),
                          str(r.watermark_ms if r.watermark_ms is not None else "-"),
                          str(r.snapshot_batch if r.snapshot_batch is not None else "-"),
                          str(r.delta_files), " ".join(r.followers) or "-", style=style)
        console.print(table)
    if not rows:
        typer.echo(f"no queryable operator{f' of job {job!r}' if job else ''} in checkpoint "
                   f"storage at {st.root}: a job registers its operators there when it "
                   "starts (`qstate job`, `make run`)", err=True)
        raise typer.Exit(1)
    if any(r.state == "refused" for r in rows):
        typer.echo("a shard refused this tool: set QSTATE_CLUSTER_TOKEN or "
                   "QSTATE_CLUSTER_TOKEN_FILE, or QSTATE_HOME to the shards' home (a shard "
                   "on loopback and `make run` keep the host's token in <home>/cluster-token)",
                   err=True)
    raise typer.Exit(1 if any(r.state != "ready" for r in rows) else 0)


savepoint_app = typer.Typer(
    help="Savepoints: a whole job at one committed batch, kept until deleted.",
    no_args_is_help=True)
app.add_typer(savepoint_app, name="savepoint")


@savepoint_app.command("create")
def savepoint_create(
    job: Annotated[str, typer.Argument(help="The job, running or stopped.")],
    name: Annotated[str | None, typer.Option(
        "--name", help="Its name. Default: the time, UTC (20261126T101500Z).",
        show_default=False)] = None,
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
) -> None:
    """Keep JOB as of its newest batch committed for every operator: each partition's
    snapshot and the deltas after it, and where the batch ended in the source. Nothing is
    copied and the job does not pause; retention keeps those files until the savepoint is
    deleted.

    Prints the name, the batch and the source offsets. Exit codes: 0 made; 1 no such job
    (or no storage); 2 a bad or taken name; 3 no batch committed yet, or retention pruned
    what it needed three times while it was made (try again).
    """
    from qstate.core.errors import QStateError
    from qstate.core.records import savepoint

    _arm_fault()
    st = _existing_storage(storage)
    try:
        sp = savepoint.create(st, job, name)
    except QStateError as exc:
        raise _failed(exc) from None
    offsets = " ".join(f"{t}:{','.join(f'{p}={o}' for p, o in sorted(ps.items()))}"
                       for t, ps in sorted(sp.offsets.items()))
    typer.echo(f"savepoint {sp.job}@{sp.name} at batch {sp.batch} "
               f"({len(sp.operators)} operators, offsets {offsets or 'none'})")


@savepoint_app.command("list")
def savepoint_list(
    job: Annotated[str, typer.Argument(help="The job.")],
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
) -> None:
    """The savepoints of JOB, oldest batch first: name, batch, when made, and whether it is
    complete (one whose making was interrupted is not a savepoint: delete it).

    Exit codes: 0 listed (none is an empty list); 1 no storage; 6 a record in storage is
    not a savepoint (it names the file).
    """
    from qstate.core.errors import QStateError
    from qstate.core.records import savepoint

    st = _existing_storage(storage)
    try:
        records = savepoint.list_savepoints(st, job)
    except QStateError as exc:
        raise _failed(exc) from None
    for sp in records:
        made = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(sp.created_ms / 1000))
        state = "complete" if sp.complete else "incomplete (its making was interrupted)"
        typer.echo(f"{sp.name}\tbatch {sp.batch}\t{made}\t{state}")


@savepoint_app.command("delete")
def savepoint_delete(
    job: Annotated[str, typer.Argument(help="The job.")],
    name: Annotated[str, typer.Argument(help="The savepoint.")],
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
) -> None:
    """Delete a savepoint (or its interrupted making); what only it kept goes at the next
    pruning. Exit codes: 0 deleted; 1 no such savepoint (or no storage); 2 a bad name."""
    from qstate.core.errors import QStateError
    from qstate.core.records import savepoint

    st = _existing_storage(storage)
    try:
        found = savepoint.delete(st, job, name)
    except QStateError as exc:
        raise _failed(exc) from None
    if not found:
        typer.echo(f"error: job {job!r} has no savepoint {name!r} (qstate savepoint list "
                   f"{job})", err=True)
        raise typer.Exit(1)
    typer.echo(f"deleted savepoint {job}@{name}")


@state_app.command("rescale")
def state_rescale(
    job: Annotated[str, typer.Argument(help="The job, stopped.")],
    partitions: Annotated[int, typer.Option(
        "--partitions", help="The new partition count: a larger multiple of the current one "
        "(twice: each partition splits in two).")],
    storage: Annotated[str, option("storage", "--storage")] = S.storage_uri,
    lease_s: Annotated[float, option("lease_s", "--lease-s")] = S.lease_s,
) -> None:
    """Change a stopped job's partition count; its state stays queryable throughout.

    Waits --lease-s to see that the job's driver beats no lease, splits each partition's
    state into the new partitions (snapshotted to checkpoint storage), has the live shard
    servers serve them, then switches the operators' specs, so routers route by the new
    count. Then restart the job with --partitions N; it goes on from its checkpoint.

    Exit codes: 0 done; 1 refused or failed (the job runs, N is not a multiple, no shard
    server answers, a new partition did not come up): readers notice nothing and running it
    again is safe; 2 bad arguments or an unreadable cluster token file.
    """
    from rich.console import Console
    from rich.progress import Progress

    from qstate.control.rescale import Rescale, job_is_down
    from qstate.core.errors import QStateError, StartFailed
    from qstate.core.records.storage import Storage

    console = Console(stderr=True)
    store = Storage(storage)
    try:
        r = Rescale(store, job, partitions)
        specs = r.specs()  # checked before the wait
        with console.status(f"checking that {job}'s driver is down ({lease_s:g}s)"):
            if not job_is_down(store, job, lease_s):
                console.print(f"[red]error:[/red] job {job!r} is running (its driver's lease "
                              "changed): stop it first")
                raise typer.Exit(1)
        with Progress(console=console, transient=True) as progress:
            tasks: dict[str, Any] = {}

            def step(what: str, done: int, total: int) -> None:
                if what not in tasks:
                    tasks[what] = progress.add_task(what, total=total)
                progress.update(tasks[what], completed=done, total=total)

            r.step = step
            rescaled = r.run()
    except StartFailed as exc:
        raise _refused_start(exc) from None
    except QStateError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None
    before = {s.operator: s.partitions for s in specs}
    for s in rescaled:
        console.print(f"{s.job}/{s.operator}: {before[s.operator]} → {s.partitions} "
                      "partitions, every one serving")
    console.print(f"restart the job with --partitions {partitions}")


# What the server install (`pip install 'qstate[server]'`) adds, by import name: a command
# that needs one of them says so on a client-only install (`pip install qstate`), where
# --help, get, top and watch work (docs/architecture.md §10).
SERVER_MODULES = frozenset({
    "orjson", "pyspark", "pyarrow", "pandas", "numpy", "confluent_kafka", "rocksdict",
    "fastapi", "starlette", "sse_starlette", "uvicorn", "grpc_tools", "prometheus_client",
    "datasketches", "cryptography", "psutil", "grpc_health", "grpc_reflection", "qstate_engine"})
NEEDS_SERVER = 2  # the exit code of a command the install lacks (qstate.exit_codes)


def _needs_server(exc: ModuleNotFoundError) -> bool:
    return (exc.name or "").split(".")[0] in SERVER_MODULES


def _say_needs_server(command: str, exc: ModuleNotFoundError) -> typer.Exit:
    typer.echo(f"error: `qstate {command}` needs the server install: pip install "
               f"'qstate[server]' (this one lacks {exc.name})", err=True)
    return typer.Exit(NEEDS_SERVER)


def _mount_generate() -> None:
    try:
        from qstate.embedded.generate import generate
    except ModuleNotFoundError as exc:
        if not _needs_server(exc):
            raise
        missing = exc

        @app.command("generate", context_settings={"allow_extra_args": True,
                                                   "ignore_unknown_options": True})
        def generate_missing() -> None:
            """Produce the demo's events into Kafka (needs the server install)."""
            raise _say_needs_server("generate", missing)
        return
    app.command("generate", no_args_is_help=True)(generate)


_mount_generate()


def _one_line_paragraphs(doc: str) -> str:
    """A docstring with each paragraph of prose on one line: typer's --help keeps the line
    breaks of every paragraph after the first, and then wraps those lines again. Paragraphs
    with an indented or bulleted line are left as they are."""
    out = []
    for para in inspect.cleandoc(doc).split("\n\n"):
        lines = para.split("\n")
        prose = not any(ln[:1] in (" ", "-", "*", "$", "\b") for ln in lines)
        out.append(" ".join(lines) if prose else para)
    return "\n\n".join(out)


def _commands(t: typer.Typer) -> list[Any]:
    return [c.callback for c in t.registered_commands if c.callback is not None] + \
        [cb for g in t.registered_groups if g.typer_instance is not None
         for cb in _commands(g.typer_instance)]


# the commands that ask a router share one table of exit codes (qstate.exit_codes)
for _cmd in _commands(app):
    _cmd.__doc__ = _one_line_paragraphs((_cmd.__doc__ or "").replace("{exit_codes}",
                                                                      EXIT_CODES))


def main() -> None:
    try:
        app()
    except ModuleNotFoundError as exc:  # a command of the server install on a client-only one
        if not _needs_server(exc):
            raise
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
        sys.exit(_say_needs_server(command, exc).exit_code)


if __name__ == "__main__":
    main()
