from __future__ import annotations

from collections import Counter, defaultdict

import orjson
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.truth import ads_campaign_views, load_events, sessions, window_counts

KEYS = st.sampled_from(["a", "b", "c"])
TIMES = st.integers(-150_000, 400_000)
EVENTS = st.lists(st.tuples(KEYS, TIMES), max_size=60)


def frame(events: list[tuple[str, int]]) -> pd.DataFrame:
    return pd.DataFrame({"k": [k for k, _ in events], "t": [t for _, t in events]})


def brute_windows(events, size: int, slide: int) -> Counter:
    """Straight from the definition: every multiple of slide s with s <= t < s + size."""
    out: Counter = Counter()
    for k, t in events:
        s = (t - size) // slide * slide  # a multiple of slide at or below t - size
        while s <= t:
            if s <= t < s + size:
                out[(k, s, s + size)] += 1
            s += slide
    return out


def as_counter(df: pd.DataFrame, key: str = "k") -> Counter:
    return Counter({(r[key], r["start"], r["end"]): r["count"] for r in df.to_dict("records")})


def check_frame(df: pd.DataFrame, key: str = "k") -> None:
    assert list(df.columns) == [key, "start", "end", "count"]
    assert all(df[c].dtype == "int64" for c in ("start", "end", "count"))
    assert (df["count"] > 0).all()
    assert df.equals(df.sort_values([key, "start"]).reset_index(drop=True))


@settings(max_examples=150, deadline=None)
@given(events=EVENTS, size=st.integers(1, 90_000), slide=st.integers(1, 90_000))
def test_sliding_windows_match_brute_force(events, size: int, slide: int) -> None:
    # Keep the brute force cheap: at most ~200 candidate windows per event.
    slide = max(slide, size // 200 + 1)
    got = window_counts(frame(events), "k", "t", size, slide)
    check_frame(got)
    assert as_counter(got) == brute_windows(events, size, slide)


@settings(max_examples=100, deadline=None)
@given(events=EVENTS)
def test_sliding_60s_every_10s(events) -> None:
    got = window_counts(frame(events), "k", "t", 60_000, 10_000)
    check_frame(got)
    assert as_counter(got) == brute_windows(events, 60_000, 10_000)
    # Each event lies in exactly six of them.
    assert got["count"].sum() == 6 * len(events)


@settings(max_examples=100, deadline=None)
@given(events=EVENTS, size=st.integers(1, 100_000))
def test_tumbling_windows_match_brute_force(events, size: int) -> None:
    got = window_counts(frame(events), "k", "t", size)
    check_frame(got)
    assert as_counter(got) == brute_windows(events, size, size)
    assert got["count"].sum() == len(events)
    assert got.equals(window_counts(frame(events), "k", "t", size, size))


def test_window_boundaries_are_half_open() -> None:
    got = window_counts(frame([("a", 9_999), ("a", 10_000), ("a", -1)]), "k", "t", 10_000)
    assert got.values.tolist() == [
        ["a", -10_000, 0, 1],
        ["a", 0, 10_000, 1],
        ["a", 10_000, 20_000, 1],
    ]


def test_where_forms_agree() -> None:
    df = pd.DataFrame(
        {
            "tweet_id": ["x", "x", "y", "y", "x"],
            "event": ["impression", "url-click", "url-click", "impression", "url-click"],
            "time": [1_000, 2_000, 3_000, 4_000, 12_000],
        }
    )
    expected = [["x", 0, 10_000, 1], ["x", 10_000, 20_000, 1], ["y", 0, 10_000, 1]]
    for where in (
        "event == 'url-click'",
        {"event": "url-click"},
        {"event": ["url-click"]},
        lambda d: d["event"] == "url-click",
        (df["event"] == "url-click").to_numpy(),
    ):
        got = window_counts(df, "tweet_id", "time", 10_000, where=where)
        assert got.values.tolist() == expected, where


def test_multiple_keys_and_empty_results() -> None:
    df = pd.DataFrame({"k": ["a", "a", "b"], "e": [1, 2, 1], "t": [5, 6, 7]})
    got = window_counts(df, ["k", "e"], "t", 10)
    assert got.values.tolist() == [["a", 1, 0, 10, 1], ["a", 2, 0, 10, 1], ["b", 1, 0, 10, 1]]
    empty = window_counts(df, "k", "t", 10, where={"k": "zzz"})
    assert list(empty.columns) == ["k", "start", "end", "count"] and empty.empty
    assert empty["count"].dtype == "int64"
    with pytest.raises(ValueError):
        window_counts(df, "k", "t", 0)


def brute_sessions(events, gap: int) -> Counter:
    by_key = defaultdict(list)
    for k, t in events:
        by_key[k].append(t)
    out: Counter = Counter()
    for k, times in by_key.items():
        # Merge each event's [t, t + gap) into an overlapping or touching session (Spark's
        # "start <= end"), repeating until nothing merges, independent of order.
        spans = [[t, t + gap, 1] for t in times]
        merged = True
        while merged:
            merged = False
            for i in range(len(spans)):
                for j in range(i + 1, len(spans)):
                    a, b = spans[i], spans[j]
                    if a[0] <= b[1] and b[0] <= a[1]:
                        spans[i] = [min(a[0], b[0]), max(a[1], b[1]), a[2] + b[2]]
                        del spans[j]
                        merged = True
                        break
                if merged:
                    break
        for start, end, n in spans:
            out[(k, start, end)] += n
    return out


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(st.tuples(KEYS, st.integers(0, 100_000)), max_size=40),
    gap=st.integers(1, 30_000),
)
def test_sessions_match_brute_force(events, gap: int) -> None:
    got = sessions(frame(events), "k", "t", gap)
    check_frame(got)
    assert as_counter(got) == brute_sessions(events, gap)


def test_sessions_exact_gap_merges() -> None:
    got = sessions(frame([("a", 0), ("a", 5_000), ("a", 10_001), ("b", 1)]), "k", "t", 5_000)
    assert got.values.tolist() == [
        ["a", 0, 10_000, 2],
        ["a", 10_001, 15_001, 1],
        ["b", 1, 5_001, 1],
    ]


def test_load_events_keeps_types(tmp_path) -> None:
    rows = [
        {"user_id": "u1", "ad_id": "0001", "event_type": "view", "event_time": 1_700_000_000_123},
        {"user_id": "u2", "ad_id": "0002", "event_type": "click", "event_time": 1_700_000_000_456},
    ]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(orjson.dumps(rows[0]) + b"\n")
    b.write_bytes(orjson.dumps(rows[1]) + b"\n\n")
    df = load_events(a)
    assert df["event_time"].dtype == "int64" and df["ad_id"].tolist() == ["0001"]
    both = load_events([a, b])
    assert both.to_dict("records") == rows


def test_ads_campaign_views(tmp_path) -> None:
    mapping = {"ad1": "c1", "ad2": "c1", "ad3": "c2"}
    df = pd.DataFrame(
        {
            "ad_id": ["ad1", "ad2", "ad3", "ad3", "ad1", "unmapped", "ad3"],
            "event_type": ["view", "view", "view", "click", "view", "view", "purchase"],
            "event_time": [1_000, 9_999, 5_000, 5_000, 10_000, 1_000, 2_000],
        }
    )
    expected = [["c1", 0, 10_000, 2], ["c1", 10_000, 20_000, 1], ["c2", 0, 10_000, 1]]
    assert ads_campaign_views(df, mapping).values.tolist() == expected
    path = tmp_path / "m.json"
    path.write_bytes(orjson.dumps(mapping))
    assert ads_campaign_views(df, path).values.tolist() == expected
    none = ads_campaign_views(df[df.event_type != "view"], mapping)
    assert none.empty and list(none.columns) == ["campaign_id", "start", "end", "count"]
