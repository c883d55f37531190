"""Spark-state mode end to end on a file source: Spark's stateful aggregation -> delta files
-> shard servers; a re-run batch changes nothing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import functions as F

from qstate.control.coordinator import release
from qstate.core.records.operator import WindowSpec
from qstate.jobs.runtime.reports import Reports
from qstate.jobs.runtime.spark_state import serve
from tests.helpers import read_all_windows

pytestmark = pytest.mark.spark
P = 8


def write_events(d: Path, n_files: int, per_file: int, seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    t = 1_700_000_000_000
    for f in range(n_files):
        chunk = []
        for _ in range(per_file):
            t += rng.randint(0, 40)
            chunk.append({"k": f"key-{rng.randint(0, 299)}", "t": t - rng.randint(0, 3000)})
        (d / f"{f:04d}.json").write_text("\n".join(json.dumps(r) for r in chunk))
        rows += chunk
    return pd.DataFrame(rows)


def start(spark, src: Path, ckpt: Path, storage_uri: str, shards, job: str,
          reports: Reports | None = None):
    events = (spark.readStream.schema("k string, t long").option("maxFilesPerTrigger", 1)
              .json(str(src))
              .withColumn("ts", F.timestamp_millis("t"))
              .withWatermark("ts", "10 seconds"))
    counts = events.groupBy(F.window("ts", "10 seconds"), F.col("k")).agg(F.count("*").alias("n"))
    return serve(counts, job=job, operator="per_key_10s", key="k", states=["n"],
                 window=WindowSpec("tumbling", 10_000), partitions=P,
                 checkpoint=str(ckpt), storage=storage_uri,
                 shards=[s.address for s in shards], trigger_interval="0 seconds",
                 reports=reports)


def truth(df: pd.DataFrame) -> dict[tuple[str, int], int]:
    start = df["t"] // 10_000 * 10_000
    return {(k, int(s)): int(n) for (k, s), n in df.groupby([df["k"], start]).size().items()}


def test_sink_is_exact_and_rerun_batch_changes_nothing(spark, tmp_path, storage_uri, shards):
    df = write_events(tmp_path / "src", n_files=4, per_file=2500, seed=7)
    q = start(spark, tmp_path / "src", tmp_path / "ckpt", storage_uri, shards, "sinktest")
    q.processAllAvailable()
    q.stop()
    keys = sorted(df["k"].unique())
    got, _batches = read_all_windows(storage_uri, "sinktest", "per_key_10s", "n", keys, P)
    assert got == truth(df)
    # Crash after the sink ran but before Spark's commit log: the batch runs again.
    commits = sorted((tmp_path / "ckpt" / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    rerun = Reports()
    q = start(spark, tmp_path / "src", tmp_path / "ckpt", storage_uri, shards, "sinktest", rerun)
    q.processAllAvailable()
    q.stop()
    [report] = [r for r in rerun.batches if r.batch == int(last.name)]
    done = report.operators["per_key_10s"]
    assert (done.applied, done.skipped) == (0, P)  # every shard saw it before
    again, _ = read_all_windows(storage_uri, "sinktest", "per_key_10s", "n", keys, P)
    assert again == got
    assert (tmp_path / "ckpt" / "commits" / last.name).exists()
    release(storage_uri, "sinktest")
