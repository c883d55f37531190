"""Ground truth (``loadtest.truth``) against Spark's own batch ``window()`` and
``session_window()`` on small generated frames: tumbling and sliding windows (sizes that are
not a multiple of the slide), times before 1970 and around the epoch, sessions whose events
sit exactly one gap apart. Every exactness test trusts truth.py; this checks truth.py."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from loadtest.truth import sessions, window_counts

# the benchmarks' truth against Spark's own windows, ~12 s: `make soak`, which CI runs (§9)
pytestmark = pytest.mark.long

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# around the epoch (negative times included) and around an ordinary instant
times = st.one_of(st.integers(-50_000, 50_000),
                  st.integers(1_767_225_600_000 - 50_000, 1_767_225_600_000 + 50_000))
frames = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), times), min_size=1,
                  max_size=40)


def _spark_frame(spark: SparkSession, rows: list[tuple[str, int]]):
    return spark.createDataFrame(rows, "k string, t long").withColumn(
        "ts", F.timestamp_millis("t"))


def _as_map(df: pd.DataFrame) -> dict[tuple[str, int, int], int]:
    return {(k, int(s), int(e)): int(n) for k, s, e, n in
            zip(df["k"], df["start"], df["end"], df["count"], strict=True)}


def _spark_counts(frame, window_col) -> dict[tuple[str, int, int], int]:
    rows = frame.groupBy(window_col.alias("w"), "k").count().select(
        "k", F.unix_millis("w.start").alias("start"), F.unix_millis("w.end").alias("end"),
        "count").collect()
    return {(r["k"], r["start"], r["end"]): r["count"] for r in rows}


@SETTINGS
@given(rows=frames, size=st.integers(1, 30), slide=st.integers(1, 30) | st.none())
def test_windows_equal_spark_window(spark, rows, size, slide) -> None:
    size_ms = size * 1000
    slide_ms = None if slide is None or slide >= size else slide * 1000
    spark_window = F.window("ts", f"{size_ms} milliseconds",
                            f"{slide_ms or size_ms} milliseconds")
    got = _spark_counts(_spark_frame(spark, rows), spark_window)
    want = _as_map(window_counts(pd.DataFrame(rows, columns=["k", "t"]), "k", "t", size_ms,
                                 slide_ms))
    assert got == want


@SETTINGS
@given(rows=frames, gap=st.integers(1, 20))
def test_sessions_equal_spark_session_window(spark, rows, gap) -> None:
    gap_ms = gap * 1000
    # events exactly one gap apart share a session in both
    rows = rows + [(k, t + gap_ms) for k, t in rows[:3]]
    got = _spark_counts(_spark_frame(spark, rows), F.session_window("ts", f"{gap_ms} milliseconds"))
    want = _as_map(sessions(pd.DataFrame(rows, columns=["k", "t"]), "k", "t", gap_ms))
    assert got == want
