"""The soak's memory-vs-state record (issue 29 item 5): each shard's folder on disk is
measured and trended beside its resident memory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from loadtest.soak import MARKER_EVENTS, DemoRun, Sample, Soak, marker_ok, newest_end, summarize


def _sample(minute: float, rss: float, disk: float) -> Sample:
    return Sample(minute=minute, watermark_age_s={}, batches={}, behind=0, reassignments=0,
                  read_p50_ms=1, read_p99_ms=2, bad_answers=0, marker_visible_s=1.0,
                  markers_exact=1, markers_total=1, rss_mb={"shard-0": rss},
                  disk_mb={"shard-0": disk})


def test_disk_is_each_shard_folder_in_mib(tmp_path: Path) -> None:
    shards = tmp_path / "home" / "shards"
    (shards / "shard-0" / "p3").mkdir(parents=True)
    (shards / "shard-0" / "p3" / "000012.sst").write_bytes(b"x" * (3 << 20))
    (shards / "shard-0" / "p3" / "MANIFEST").write_bytes(b"x" * (1 << 19))
    (shards / "shard-1").mkdir()
    # a snapshot being taken: hard links to the live files, and a link inside the state
    (shards / "shard-0" / ".scratch" / "s1").mkdir(parents=True)
    os.link(shards / "shard-0" / "p3" / "000012.sst", shards / "shard-0" / ".scratch" / "s1" / "a")
    os.link(shards / "shard-0" / "p3" / "000012.sst", shards / "shard-0" / "p3" / "000013.sst")
    assert DemoRun(tmp_path).disk() == {"shard-0": 3.5, "shard-1": 0.0}
    assert DemoRun(tmp_path / "nothing yet").disk() == {}


def test_disk_and_memory_trends_are_apart_and_after_warmup() -> None:
    # memory level after warm-up while the state grows 2 MiB a minute; the warm-up's
    # samples (memory rising fast) are left out of both trends
    samples = [_sample(m, rss=100 + 50 * m if m < 5 else 400, disk=10 + 2 * m)
               for m in range(0, 20)]
    summary = summarize(samples, warmup_min=5)
    assert summary.rss_slope_mb_per_min == {"shard-0": 0.0}
    assert abs(summary.disk_slope_mb_per_min["shard-0"] - 2.0) < 1e-9


def test_a_marker_is_right_exact_or_gone_only_once_retention_dropped_its_windows() -> None:
    hour = {"kind": "tumbling", "size_ms": 3_600_000, "slide_ms": 0, "gap_ms": 0}
    minute = {"kind": "sliding", "size_ms": 60_000, "slide_ms": 10_000, "gap_ms": 0}
    t = 7_200_000 + 1_234_567  # 02:20:34.567
    assert newest_end(t, hour) == 10_800_000  # its hour ends at 03:00
    assert newest_end(t, minute) == 7_200_000 + 1_230_000 + 60_000  # 02:20:30 + 1 min
    assert newest_end(t, {"kind": "session", "size_ms": 0, "slide_ms": 0, "gap_ms": 5}) > t
    end = newest_end(t, hour)
    assert marker_ok(MARKER_EVENTS, end, None) and marker_ok(MARKER_EVENTS, end, end + 1)
    # gone: lost, unless the operator's watermark minus its retention passed its window
    assert not marker_ok(0, end, None)
    assert not marker_ok(0, end, end - 1)
    assert marker_ok(0, end, end)
    # a count neither exact nor absent is lost in part or counted twice, expired or not
    for wrong in (1, MARKER_EVENTS - 1, MARKER_EVENTS + 1, 2 * MARKER_EVENTS):
        assert not marker_ok(wrong, end, None) and not marker_ok(wrong, end, end + 1)


def test_a_marker_read_wrong_stays_wrong_when_retention_could_later_excuse_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    soak = Soak(DemoRun(tmp_path), marker_deadline_s=0)
    hour = {"kind": "tumbling", "size_ms": 3_600_000, "slide_ms": 0, "gap_ms": 0}
    produced = 7_200_000 + 5_000  # in the hour that ends at 10,800,000
    state: dict[str, Any] = {"watermark": 7_300_000, "read": {"m0": MARKER_EVENTS, "m1": 0}}

    def produce() -> str:
        key = f"m{len(soak.markers)}"
        soak.markers.append(key)
        soak.produced[key] = produced
        return key

    monkeypatch.setattr(soak, "produce_marker", produce)
    monkeypatch.setattr(soak, "marker_values", lambda keys: {
        "per_tweet_1h": {k: state["read"].get(k, MARKER_EVENTS) for k in keys}})
    monkeypatch.setattr(soak, "operators", lambda: {"tweets/per_tweet_1h": {
        "window": hour, "retention_ms": 600_000, "watermark": state["watermark"]}})
    try:
        produce()
        assert soak.marker() == (None, 1)  # m1 reads 0 while its hour is open: lost
        state["watermark"] = 10_800_000 + 600_000  # now retention may drop its hour
        state["read"]["m0"] = 0
        assert soak.marker() == (None, 2) and soak.expired == 1  # m0 expired; m1 still lost
    finally:
        soak.close()
