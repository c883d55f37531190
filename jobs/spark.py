"""SparkSession with the state-store settings qstate relies on (DESIGN §3.2)."""

from __future__ import annotations

import os
import shutil
import sys

from pyspark.sql import SparkSession

__all__ = ["STATE_CONF", "require_java", "spark_session"]

STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def require_java() -> None:
    if shutil.which("java") is None:
        sys.exit(
            "qstate needs Java 17 for Spark and none was found on PATH.\n"
            "Install it, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME."
        )


def spark_session(
    app: str = "qstate",
    master: str = "local[2]",
    shuffle_partitions: int = 4,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    require_java()
    # Python workers must run this interpreter (the venv that has pyarrow, confluent-kafka)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .master(master)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        # a stop during a batch can overflow the stream thread's stack (FACTS: -Xss)
        .config("spark.driver.extraJavaOptions", "-Xss16m")
        .config("spark.python.worker.reuse", "true")
    )
    for k, v in {**STATE_CONF, **(extra or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
