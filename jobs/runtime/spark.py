"""The SparkSession qstate jobs run in: Spark's Kafka connector on ``spark.jars`` (fetched by
`make setup`), the RocksDB state store for spark-state operators (docs/architecture.md §3)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from qstate.core.config import settings
from qstate.core.errors import InvalidRequest
from qstate.core.process.jvm import java

__all__ = ["STATE_CONF", "connector_jars", "spark_session"]

STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def connector_jars(folder: str | None = None) -> list[str]:
    """The jars of Spark's Kafka connector; a clear error when `make setup` has not run."""
    path = Path(folder or settings().spark_jars_dir)
    jars = sorted(str(p) for p in path.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise InvalidRequest(
            f"Spark's Kafka connector is not in {path}: run `make setup` (it fetches the jars "
            "from Maven Central), or point QSTATE_SPARK_JARS at a folder holding "
            "spark-sql-kafka-0-10, spark-token-provider-kafka-0-10, kafka-clients and "
            "commons-pool2")
    return jars


def spark_session(app: str = "qstate", master: str = "local[2]", shuffle_partitions: int = 4,
                  extra: dict[str, str] | None = None, driver_host: str = "127.0.0.1"
                  ) -> SparkSession:
    java()  # a clear error, not a Py4J one, when there is no Java
    # Python workers must run this interpreter (the venv that has pyarrow, confluent-kafka)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .master(master)
        .config("spark.jars", ",".join(connector_jars()))
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", driver_host)
        .config("spark.driver.host", driver_host)
        .config("spark.sql.session.timeZone", "UTC")
        # a stop during a batch can overflow the stream thread's stack
        # (docs/architecture.md §8)
        .config("spark.driver.extraJavaOptions", "-Xss16m")
        .config("spark.python.worker.reuse", "true")
        # bigger Arrow batches to and from Python workers: fewer round trips per batch
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50000")
    )
    for k, v in {**STATE_CONF, **(extra or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
