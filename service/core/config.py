"""The one place qstate reads its configuration from.

Every setting is, in order of precedence: a CLI flag of the command that uses it; an
environment variable ``QSTATE_<NAME>`` (``QSTATE_KAFKA_BOOTSTRAP=broker:9092``); a line
``QSTATE_<NAME>=...`` in the file named by ``QSTATE_CONFIG`` (default ``qstate.env`` in the
working directory); the default below. ``qstate COMMAND --help`` shows each option with its
effective default, README's table lists them all (a test keeps it in step with this file).
"""

from __future__ import annotations

import os
import socket
import sys
from functools import lru_cache
from typing import Any, Final

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULTS", "ENGINE_SETTINGS", "Settings", "engine_settings", "node_name",
           "settings", "settings_table"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="QSTATE_",
        env_file=os.environ.get("QSTATE_CONFIG", "qstate.env"),
        extra="ignore",
    )

    # ---- everywhere -------------------------------------------------------------------
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers.")
    kafka_properties: str = Field(
        "", description="A file of Kafka client properties (key=value lines, librdkafka's "
        "names: security.protocol, sasl.mechanism, sasl.username, sasl.password, "
        "ssl.ca.location, ...) for a cluster with SASL or SSL: every client qstate makes "
        "uses them (dead letters, topics, lag, the generator), and Spark's Kafka source gets "
        "them in Java's names (sasl.jaas.config, a PEM trust store); `java.`-prefixed keys go "
        "to Spark alone. Its values are never logged. Empty: plain text, no authentication.")
    home: str = Field(
        ".qstate", description="Local working directory: broker data, shard RocksDB data, "
        "Spark checkpoints, logs.")
    storage: str = Field(
        "", description="Checkpoint storage for delta files, snapshots and the assignment: a "
        "local path or a pyarrow filesystem URI (s3://bucket/prefix, hdfs://...). Empty: "
        "<home>/storage.")
    kafka_jars: str = Field(
        "", description="Folder of the Kafka broker's jars (`qstate run`, tests). Empty: "
        "<venv>/jars/kafka, where `make setup` puts them.")
    kafka_heap: str = Field("512m", description="Java heap of the embedded Kafka broker.")
    spark_jars: str = Field(
        "", description="Folder of Spark's Kafka connector jars, put on spark.jars. Empty: "
        "<venv>/jars/spark, where `make setup` puts them.")
    metrics_host: str = Field(
        "127.0.0.1", description="Address of the /metrics endpoints of jobs and shards "
        "(0.0.0.0 in pods).")
    node: str = Field(
        "", description="The host this process runs on, as the cluster names it: a router "
        "reads the partitions of shards on its node in-process, and the cluster map sends a "
        "partition's keys to a router on its owner's node (deploy/k8s passes the node's name "
        "from the downward API: a pod's hostname is its own). Empty: the hostname.")

    # ---- operators (set when a job starts) -------------------------------------------
    partitions: int = Field(64, ge=1, le=4096, description="Partitions per operator (P).")
    retention_ms: int = Field(
        24 * 3600 * 1000, ge=0, description="How long closed windows are kept after the "
        "watermark passed them.")

    # ---- jobs -------------------------------------------------------------------------
    checkpoints: str = Field("", description="Spark checkpoint root. Empty: <home>/checkpoints.")
    spark_master: str = Field(
        "local[2,4]", description="Spark master of `qstate job`; local[N,M] retries a failed "
        "task up to M times.")
    driver_host: str = Field(
        "127.0.0.1", description="Address the Spark driver of `qstate job` binds and "
        "advertises to executors: 127.0.0.1 for a local master, the driver host's address "
        "when executors run on other hosts (a standalone or Kubernetes master).")
    trigger_interval: str = Field("1 second", description="Micro-batch trigger interval.")
    max_rows_per_trigger: int = Field(
        100_000, ge=0, description="Cap on the records a micro-batch reads "
        "(maxOffsetsPerTrigger; 0: no cap). Bounded batches drain a backlog in steps of a few "
        "seconds each here instead of one batch that takes minutes.")
    max_future_ms: int = Field(
        300_000, ge=0, description="An event whose time is more than this many ms ahead of "
        "its Kafka record's timestamp is dead-lettered `future_time`, so one clock gone wrong "
        "cannot move the watermark and turn every later event late (docs/architecture.md "
        "§3). The record's timestamp, not the job's wall clock: a replay decides the same.")
    job_metrics_port: int = Field(
        9464, ge=0, description="HTTP /metrics port of `qstate job` (and of `qstate run`'s "
        "jobs); 0: any free port. The job prints its /metrics address when it starts; "
        "docs/metrics.md lists every series.")
    commit_timeout_s: float = Field(
        300.0, gt=0, description="How long the sink keeps trying (with backoff) to commit a "
        "batch on every owning shard before the query fails; longer than a restore "
        "(restore_timeout_s), so a shard that is restoring makes the batch wait, not fail.")
    lease_s: float = Field(
        30.0, gt=0, description="Coordinator: a shard server that has not answered a "
        "heartbeat for this long is dead and its partitions move. Generous: a busy server "
        "(saturated cores, a long restore) still answers heartbeats, only slower.")
    heartbeat_s: float = Field(0.5, gt=0, description="Coordinator: heartbeat interval.")
    heartbeat_timeout_s: float = Field(
        5.0, gt=0, description="Coordinator: deadline of one heartbeat call (a late answer "
        "is a missed beat, not a death).")
    coordinator_metrics_port: int = Field(
        9467, ge=0, description="HTTP /metrics port of `qstate coordinator`, the standby that "
        "moves partitions while a job's driver is down; 0: any free port (printed at start).")
    manifest_gc_every: int = Field(
        20, ge=1, description="Coordinator: batches between collections of old manifests.")

    # ---- shard servers ----------------------------------------------------------------
    shard_host: str = Field("127.0.0.1", description="Address a shard server binds to.")
    shard_port: int = Field(
        7100, ge=0, description="Internal gRPC port of a shard server (0: any free port); "
        "`qstate run` uses it and the next one for its two shards.")
    shard_metrics_port: int = Field(
        9465, ge=0, description="HTTP /metrics /healthz /readyz port of a shard server; 0: "
        "any free port (printed at start and registered in storage). `qstate run` uses it "
        "and the next one for its two shards.")
    shard_reader: bool = Field(
        True, description="Shard: answer other hosts' routers' reads of its partitions natively "
        "(the read engine's reader, on its own port, registered in storage) instead of through "
        "the server's Python MultiGet (docs/architecture.md §5, cluster reads). False: for "
        "comparison, and as a way out.")
    shard_reader_port: int = Field(
        0, ge=0, description="Shard: the reader's gRPC port (0: any free port; registered in "
        "storage, where routers find it). Deployments that open ports name one "
        "(deploy/k8s uses 7101).")
    shard_reader_cache_mb: int = Field(
        64, ge=8, description="Shard: the block cache in MiB of the RocksDB secondaries its "
        "reader reads the server's partitions with (besides QSTATE_SHARD_MEMORY_MB).")
    shard_id: str = Field("", description="Stable id of a shard server. Empty: host-port.")
    shard_advertise: str = Field(
        "", description="host:port others use to reach a shard server. Empty: its bind address.")
    shard_data_dir: str = Field(
        "", description="Where a shard server keeps its RocksDB partitions. Empty: "
        "<home>/shards.")
    shard_memory_mb: int = Field(
        256, ge=16, description="Shard: RocksDB memory of the whole server in MiB: one block "
        "cache (data, index and filter blocks) that every partition it holds shares, with "
        "their memtables charged to it (at most half of it; the largest is flushed first). "
        "Process memory beyond it: Python, gRPC, the Top cache, allocator slack.")
    snapshot_every: int = Field(
        10, ge=1, description="A shard snapshots a partition to checkpoint storage every N "
        "batches.")
    snapshots_kept: int = Field(
        2, ge=1, description="Snapshots kept per partition; older snapshots, and once N "
        "exist the deltas before the oldest kept one, are deleted.")
    assignment_poll_s: float = Field(
        0.5, gt=0, description="Shard: how often it reads the assignment from storage.")
    restore_timeout_s: float = Field(
        120.0, gt=0, description="Shard: how long a commit waits for a partition that is "
        "being restored.")
    restore_retry_s: float = Field(
        1.0, gt=0, description="Shard: pause before retrying a failed restore.")
    drain_timeout_s: float = Field(
        120.0, ge=0, description="Shard: on SIGTERM, how long it keeps serving while the "
        "coordinator moves its partitions to other servers, make-before-break (each new "
        "owner catches up before the hand-over, so no read answers 503). It stops sooner "
        "once it holds nothing (after 2 x routing_refresh_s, so routers have moved on), or "
        "when no coordinator has asked about it for 10 x heartbeat_s (the job is down). "
        "SIGINT, a second signal, or 0 here: stop at once.")
    commit_workers: int = Field(
        4, ge=1, description="Shard: partitions of one commit applied in parallel.")
    rank_index: bool = Field(
        True, description="Shard: keep each partition's rank index, which answers top-N of "
        "tumbling windows and unwindowed state (GET /v1/top). Off: a commit writes less and "
        "such a top-N is refused; turned on again, a partition is indexed when it opens.")

    # ---- routers ----------------------------------------------------------------------
    router_host: str = Field("127.0.0.1", description="Address the router binds to.")
    router_advertise: str = Field(
        "", description="Router: the host clients reach it at, as the cluster map names it "
        "(with its HTTP and gRPC ports). Empty: its bind address, or the node's name when it "
        "binds every address.")
    http_port: int = Field(
        8000, ge=0, description="Router HTTP port: the API, /docs, /metrics, /healthz.")
    grpc_port: int = Field(50051, ge=0, description="Router public gRPC port.")
    shard_timeout_s: float = Field(
        1.0, gt=0, description="Router: deadline of a shard lookup before answering 503.")
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After sent with a 503.")
    router_workers: int = Field(
        1, ge=1, le=64, description="Router: processes serving its HTTP and gRPC ports, each "
        "a whole router (event loop, local readers, shard channels, watches) on a core of "
        "its own; /metrics sums them. `qstate run` uses half the cores.")
    local_reads: bool = Field(
        True, description="Router: read partitions of shards on the same host in-process "
        "(RocksDB secondary instances) instead of over gRPC.")
    native_front: bool = Field(
        True, description="Router: the read engine's native front (Rust) holds the HTTP port "
        "and answers point and batch reads of partitions on this host without Python; every "
        "other request goes to the Python app behind it. False: the Python app (uvicorn) "
        "holds the port and answers everything, reading co-located partitions through the "
        "engine (for comparison, and as a way out).")
    router_cache_mb: int = Field(
        64, ge=8, description="Router: the block cache in MiB of the RocksDB secondaries it "
        "reads co-located partitions with (one, shared).")
    router_follow_ms: int = Field(
        20, ge=0, description="Router: how often in ms the read engine looks at the commit "
        "markers of co-located partitions read in the last 10 s and catches up those whose "
        "shard committed, so that reads need not (docs/architecture.md §5). 0: no follower, "
        "the first read after a commit catches its partition up.")
    routing_refresh_s: float = Field(
        1.0, gt=0, description="Router: how often it re-reads assignments and specs.")
    routing_min_interval_s: float = Field(
        0.1, gt=0, description="Router: least time between two on-demand routing refreshes.")
    local_ready_poll_s: float = Field(
        0.25, gt=0, description="Router: how often it asks co-located shards which "
        "partitions are ready for in-process reads.")
    max_batch_keys: int = Field(1000, ge=1, description="Router: keys per batch request.")
    max_windows: int = Field(
        10_000, ge=1, description="Most windows per key in one time-range answer, and the "
        "default `limit`; an answer cut short says where to go on (`next_from`).")
    max_request_windows: int = Field(
        100_000, ge=1, description="Router: the work one request may ask for, keys × "
        "`limit` windows of a time-range read. A batch range read without a `limit` gets "
        "limit = min(max_windows, this ÷ keys); one that asks more is refused with a 400 "
        "naming this budget.")
    max_top_n: int = Field(
        1000, ge=1, description="Router: most keys a top-N answer holds (`n`).")
    max_top_scan_keys: int = Field(
        5_000, ge=1, description="Shard: most keys one partition reads for "
        "a top-N of a merged sliding window, which has no rank index (its windows are "
        "folded from panes at read time); a window holding more is a 413 naming this.")
    min_batch_wait_s: float = Field(
        5.0, ge=0, description="Router: longest a read with `min_batch` waits for its "
        "partitions to have that batch; then 503 + Retry-After naming the batch they have.")
    max_watchers: int = Field(
        2000, ge=0, description="Router: watches (SSE and gRPC streams) open at once; "
        "beyond it a new one is refused with 429 (RESOURCE_EXHAUSTED) and Retry-After. "
        "Watches do not count in max_concurrent_requests.")
    max_watch_keys: int = Field(
        100, ge=1, description="Router: keys one watch may name.")
    watch_ping_s: float = Field(
        15.0, gt=0, description="Router: a watch stream quiet this long gets a comment line "
        "(SSE) so proxies keep it open and a client that is gone is found; lower it behind "
        "a proxy that closes idle connections sooner.")
    watch_poll_s: float = Field(
        0.05, gt=0, description="Router, while anything is watched: how often it asks the "
        "watched operators' shards for their partitions' batches; a new batch is read and "
        "its changes pushed (half of it is the mean delay it adds).")
    router_url: str = Field("http://127.0.0.1:8000", description="Where `qstate get`, "
                            "`qstate top`, `qstate watch` and the Python client ask.")
    client_direct: bool = Field(
        False, description="Python client, `qstate get --direct` and the Feast store: ask "
        "each key (each batch split by owner) at a router on its owner's node, which the "
        "job's cluster map names (GET /v1/cluster/{job}, cached), instead of at router_url, "
        "which forwards it (a hop on a cluster). A stale map costs a hop, never a wrong "
        "answer.")
    client_allow_stale: bool = Field(
        False, description="Python client, `qstate get`/`top` and the Feast store: when a "
        "partition's owner cannot answer (down, restoring, moving), let a follower of it (an "
        "operator with replicas) answer as of its own batch (allow_stale=true on each read; "
        "the answer's batch says which) instead of 503 until the owner, or its successor, "
        "answers.")
    client_map_ttl_s: float = Field(
        30.0, gt=0, description="Python client and Feast store with client_direct: the "
        "longest they keep a job's cluster map (it is re-read sooner when an answer names "
        "another owner).")

    # ---- security ---------------------------------------------------------------------
    tls_cert: str = Field(
        "", description="PEM certificate (chain) a router serves HTTPS and gRPC with and a "
        "shard server its internal API with; `qstate certs` makes one for development. "
        "Empty: plain text, which only a loopback address allows (see allow_insecure).")
    tls_key: str = Field("", description="PEM private key of tls_cert.")
    tls_ca: str = Field(
        "", description="PEM CA bundle that callers verify servers with: routers, jobs and "
        "tools verify shard servers, `qstate get` and the clients verify the router. Set it "
        "wherever servers use tls_cert.")
    tls_server_name: str = Field(
        "", description="Name that callers check a shard server's certificate against, "
        "instead of the address they dial: shards register addresses (pod IPs) no shared "
        "certificate names; make the certificate for this name (`qstate certs --host NAME`). "
        "Empty: the address dialled.")
    cluster_token: str = Field(
        "", repr=False, description="Shared secret of the internal shard API: a shard "
        "server answers Commit, MultiGet and Describe only to callers that send it (gRPC metadata "
        "`authorization: Bearer ...`), and every job, router and tool sends it. Empty: "
        "cluster_token_file, else the host's token in <home>/cluster-token, which a shard on "
        "loopback makes (mode 0600) when there is none; a shard on another address refuses to "
        "start without one unless allow_insecure. Set it (or the file) on every process of a "
        "deployment that spans hosts.")
    cluster_token_file: str = Field(
        "", description="File holding the cluster token (e.g. a mounted secret), read when "
        "cluster_token is empty. Empty: <home>/cluster-token if it exists (a shard on "
        "loopback or `qstate run` writes it).")
    tokens_file: str = Field(
        "", description="Router: JSON file of client tokens, stored hashed and each scoped "
        "to jobs (and operators); `qstate token add` writes it. Re-read within a second of "
        "a change: removing a line revokes a token without a restart. Empty: no token is "
        "asked, which only a loopback address allows.")
    metrics_public: bool = Field(
        True, description="Router: /metrics answers without a token (false: any valid token).")
    allow_insecure: bool = Field(
        False, description="Let a router or shard server on a non-loopback address run "
        "without TLS, tokens or a cluster token (e.g. behind a service mesh that encrypts and "
        "authenticates), and let `qstate get` and the Node client send a token there in plain "
        "text. Off: such a server refuses to start and says what is missing, such a client "
        "refuses to send.")
    token: str = Field(
        "", repr=False, description="Client token `qstate get`, the Python client (given "
        "no token) and the Node client send (never logged). Never sent in plain text off "
        "loopback unless allow_insecure.")
    token_file: str = Field(
        "", description="File holding the client token (e.g. a mounted secret), read when "
        "token is empty, by the Python client too.")

    # ---- limits -----------------------------------------------------------------------
    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="Router: largest request body accepted (413 beyond).")
    max_concurrent_requests: int = Field(
        5000, ge=1, description="Router: requests (HTTP and gRPC each) served at once; "
        "beyond it HTTP answers 429 with Retry-After, gRPC RESOURCE_EXHAUSTED (grpc's own "
        "limit: no retry hint, not counted in qstate_router_refused_total).")
    max_shard_queue: int = Field(
        20_000, ge=1, description="Router: keys waiting for one shard beyond the calls in "
        "flight; beyond it 429 with Retry-After.")

    # ---- tests ------------------------------------------------------------------------
    fault: str = Field(
        "", description="Fault injection for chaos tests (service/core/process/faults.py): "
        "POINT@BATCH[:OPERATOR] makes `qstate shard`, `qstate job` or `qstate savepoint "
        "create` kill itself with SIGKILL at that step of that batch; POINT is "
        "shard.received, shard.after-write, shard.after-ack, driver.after-deltas, "
        "driver.after-record, driver.after-commit or savepoint.after-pending. "
        "router.read-panic@N[:OPERATOR] and router.accept-panic@N plant a panic in a "
        "router's read engine instead (a read at batch N; the Nth connection): caught, "
        "answered 500, counted. Empty: off.")

    @property
    def storage_uri(self) -> str:
        return self.storage or os.path.join(self.home, "storage")

    @property
    def checkpoints_dir(self) -> str:
        return self.checkpoints or os.path.join(self.home, "checkpoints")

    @property
    def shard_data(self) -> str:
        return self.shard_data_dir or os.path.join(self.home, "shards")

    @property
    def kafka_jars_dir(self) -> str:
        return self.kafka_jars or os.path.join(sys.prefix, "jars", "kafka")

    @property
    def spark_jars_dir(self) -> str:
        return self.spark_jars or os.path.join(sys.prefix, "jars", "spark")


# The documented defaults, unaffected by environment and config file: what library code
# falls back to when a caller passes nothing.
DEFAULTS: Final[Settings] = Settings.model_construct()


# the settings the read engine answers under (a router's, a shard's reader), by their names
# here: the engine has no defaults of its own (engine/core/src/settings.rs)
ENGINE_SETTINGS = ("max_batch_keys", "max_windows", "max_request_windows", "min_batch_wait_s",
                   "retry_after_s", "max_body_bytes", "max_concurrent_requests",
                   "metrics_public", "shard_timeout_s", "max_shard_queue", "fault")


def engine_settings(cfg: Settings) -> dict[str, Any]:
    """What the engine reads of ``cfg``: every setting it uses, by name."""
    return {name: getattr(cfg, name) for name in ENGINE_SETTINGS}


def node_name(cfg: Settings) -> str:
    """The node this process runs on (QSTATE_NODE, else the hostname): what shards register
    and routers match them by (docs/architecture.md §5, cluster map)."""
    return cfg.node or socket.gethostname()


def settings_table() -> str:
    """README's table of every setting (``python -m qstate.core.config`` prints it)."""
    rows = ["| setting | default | what |", "| --- | --- | --- |"]
    for name, f in Settings.model_fields.items():
        d = f.default
        shown = "(empty)" if d == "" else str(d).lower() if isinstance(d, bool) else str(d)
        rows.append(f"| `QSTATE_{name.upper()}` | `{shown}` | {f.description} |")
    return "\n".join(rows)


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The effective settings of this process (environment and config file read once)."""
    return Settings()


if __name__ == "__main__":
    print(settings_table())
