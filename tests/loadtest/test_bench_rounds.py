"""``bench_ingest --rounds``: the sinks' order alternates, and one sink's rounds read as one."""

from __future__ import annotations

import pytest

from loadtest.bench_ingest import Run, combine, ordered


def test_each_round_reverses_the_order() -> None:
    assert list(ordered(["noop", "qstate", "redis"], 3)) == [
        (0, "noop"), (0, "qstate"), (0, "redis"),
        (1, "redis"), (1, "qstate"), (1, "noop"),
        (2, "noop"), (2, "qstate"), (2, "redis")]


def test_rounds_combine_into_events_over_time() -> None:
    a = Run("qstate", 2_000_000, 20.0, 95_000.0, 9, {"batch_s": 2.0, "note": "x"})
    b = Run("qstate", 2_000_000, 10.0, 205_000.0, 9, {"batch_s": 1.0})
    both = combine([a, b])
    # 4M events over 30 s, not the mean of 100K and 200K
    assert both.events_per_s == pytest.approx(133_333.3, rel=1e-4)
    assert both.steady_events_per_s == pytest.approx(150_000)
    assert both.detail == {"batch_s": 1.5} and both.batches == 9
    failed = Run("qstate", 2_000_000, 0.0, 0.0, 0, {"failed": "boom"})
    assert combine([a, failed]) is failed
    assert combine([a]) is a
