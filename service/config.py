"""The one place qstate reads its configuration from.

Every setting can be given as an environment variable with the ``QSTATE_`` prefix
(``QSTATE_KAFKA_BOOTSTRAP=broker:9092``), in a ``.env``-style file named by
``QSTATE_CONFIG`` (default ``qstate.env`` in the working directory), or as a CLI flag,
which wins over both.
"""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="QSTATE_",
        env_file=os.environ.get("QSTATE_CONFIG", "qstate.env"),
        extra="ignore",
    )

    kafka_bootstrap: str = Field(
        "127.0.0.1:9092", description="Kafka bootstrap servers (any Kafka-protocol broker)."
    )
    home: str = Field(
        ".qstate", description="Local working directory: dev broker data, shard RocksDB data."
    )
    storage: str = Field(
        "",
        description=(
            "Checkpoint storage for delta files, snapshots and the assignment: a local path "
            "or a pyarrow filesystem URI (s3://bucket/prefix, hdfs://...). "
            "Empty means <home>/storage."
        ),
    )
    partitions: int = Field(64, ge=1, le=4096, description="Partitions per operator (P).")
    retention_ms: int = Field(
        24 * 3600 * 1000, ge=0, description="How long closed windows are kept after the watermark."
    )
    commit_timeout_s: float = Field(
        30.0, gt=0, description="How long the sink waits for every shard to acknowledge a batch."
    )
    shard_host: str = Field("127.0.0.1", description="Address a shard server binds to.")
    shard_port: int = Field(
        7100, description="Internal gRPC port of a shard server (0: any); `qstate run` uses it "
        "and the next one for its two shards."
    )
    shard_metrics_port: int = Field(0, description="HTTP /metrics port of a shard (0: any).")
    shard_id: str = Field("", description="Stable id of a shard server; empty: host-port.")
    shard_advertise: str = Field(
        "", description="host:port others use to reach a shard (default: its bind address)."
    )
    snapshot_every: int = Field(
        10, ge=1, description="A shard snapshots a partition to checkpoint storage every N batches."
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Address of the /metrics endpoint of jobs (0.0.0.0 in pods)."
    )

    router_host: str = Field("127.0.0.1", description="Address the router binds to.")
    http_port: int = Field(8000, description="Router HTTP port.")
    grpc_port: int = Field(50051, description="Router public gRPC port.")
    shard_timeout_s: float = Field(
        1.0, gt=0, description="Router: deadline of a shard lookup before answering 503."
    )
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After sent with a 503.")
    local_reads: bool = Field(
        True, description="Router: read partitions of shards on the same host in-process "
        "(RocksDB secondary instances) instead of over gRPC."
    )
    router_url: str = Field("http://127.0.0.1:8000", description="Where `qstate get` asks.")

    @property
    def storage_uri(self) -> str:
        return self.storage or os.path.join(self.home, "storage")


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings()  # type: ignore[call-arg]  # every field has a default
