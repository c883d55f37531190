from __future__ import annotations

import itertools
import re
from collections import Counter

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qstate.jobs.examples.workloads import (
    AD_EVENT_TYPES,
    AD_FIELDS,
    AD_TYPES,
    TWEET_FIELDS,
    Ads,
    Tweets,
    campaign_mapping,
    events_over_span,
    late_events,
    live_events,
    load_mapping,
    make_workload,
    max_disorder,
    span_times,
    with_late,
    write_mapping,
)

T0 = 1_700_000_000_000
UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def tweets(n: int, seed: int = 7, **kw) -> list[dict]:
    return list(events_over_span(Tweets(1000, seed=seed, **kw), n, t0_ms=T0, span_ms=60_000))


def ads(n: int, seed: int = 7, **kw) -> list[dict]:
    return list(events_over_span(Ads(20, seed=seed, **kw), n, t0_ms=T0, span_ms=60_000))


def test_tweets_are_deterministic_with_exact_fields() -> None:
    a, b = tweets(5000), tweets(5000)
    assert a == b
    assert a != tweets(5000, seed=8)
    for e in a:
        assert tuple(e) == TWEET_FIELDS
        assert re.fullmatch(r"tw-\d+", e["tweet_id"]) and 0 <= int(e["tweet_id"][3:]) < 1000
        assert e["event"] in ("impression", "url-click")
        assert type(e["time"]) is int
        assert orjson.loads(orjson.dumps(e)) == e
    clicks = sum(e["event"] == "url-click" for e in a) / len(a)
    assert 0.08 < clicks < 0.12


def test_ads_are_deterministic_with_exact_fields_and_mapped_ads() -> None:
    a, b = ads(6000), ads(6000)
    assert a == b
    assert a != ads(6000, seed=8)
    mapping = Ads(20, seed=7).mapping
    assert len(mapping) == 200 and len(set(mapping.values())) == 20
    assert all(Counter(mapping.values())[c] == 10 for c in mapping.values())
    for e in a:
        assert tuple(e) == AD_FIELDS
        assert e["ad_id"] in mapping
        assert UUID4.match(e["user_id"]) and UUID4.match(e["page_id"]) and UUID4.match(e["ad_id"])
        assert e["ad_type"] in AD_TYPES
        assert e["event_type"] in AD_EVENT_TYPES
        assert type(e["event_time"]) is int
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", e["ip_address"])
    kinds = Counter(e["event_type"] for e in a)
    assert all(1700 < kinds[k] < 2300 for k in AD_EVENT_TYPES)
    assert len({e["ad_id"] for e in a}) == 200  # every ad shows up


def test_campaign_mapping_depends_only_on_its_arguments(tmp_path) -> None:
    m = campaign_mapping(5, seed=3, ads_per_campaign=4)
    assert m == campaign_mapping(5, seed=3, ads_per_campaign=4)
    assert m == Ads(5, seed=3, ads_per_campaign=4).mapping
    assert m != campaign_mapping(5, seed=4, ads_per_campaign=4)
    path = write_mapping(m, tmp_path / "sub" / "map.json")
    assert load_mapping(path) == m
    assert list(tmp_path.joinpath("sub").iterdir()) == [path]  # no temp file left behind


def test_zipf_skews_keys() -> None:
    uniform = Counter(e["tweet_id"] for e in tweets(20_000))
    zipf = Counter(e["tweet_id"] for e in tweets(20_000, distribution="zipf"))
    assert zipf.most_common(1)[0][0] == "tw-0"
    assert zipf.most_common(1)[0][1] > 5 * uniform.most_common(1)[0][1]
    mapping = Ads(20, seed=1).mapping
    by_campaign = Counter(mapping[e["ad_id"]] for e in ads(10_000, distribution="zipf", seed=1))
    assert by_campaign.most_common(1)[0][1] > 0.2 * 10_000  # uniform would give 5%


def test_make_workload() -> None:
    assert isinstance(make_workload("tweets", 5), Tweets)
    w = make_workload("ads", 3, seed=2)
    assert isinstance(w, Ads) and len(w.mapping) == 30
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("clicks")


def test_span_without_disorder_is_sorted_and_in_range() -> None:
    times = list(span_times(1000, t0_ms=T0, span_ms=10_000))
    assert times == sorted(times)
    assert times[0] == T0 and times[-1] < T0 + 10_000


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 400),
    span=st.integers(1, 100_000),
    disorder=st.integers(0, 50_000),
    seed=st.integers(0, 2**32),
)
def test_span_respects_disorder_bound(n: int, span: int, disorder: int, seed: int) -> None:
    events = list(
        events_over_span(
            Tweets(10, seed=seed), n, t0_ms=T0, span_ms=span, disorder_ms=disorder, seed=seed
        )
    )
    assert len(events) == n
    assert all(T0 <= e["time"] < T0 + span for e in events)
    assert max_disorder(events, "time") <= disorder


def test_disorder_actually_reorders() -> None:
    events = list(
        events_over_span(Ads(5), 2000, t0_ms=T0, span_ms=20_000, disorder_ms=3000, seed=1)
    )
    assert 2000 < max_disorder(events, "event_time") <= 3000


def test_with_late_moves_a_fraction_exactly_late_by_behind() -> None:
    source = tweets(4000)
    copy = [dict(e) for e in source]
    out = list(with_late(source, Tweets(1), fraction=0.1, late_by_ms=60_000, seed=3))
    assert source == copy  # input not mutated
    assert len(out) == len(source)
    newest = None
    late = 0
    for original, e in zip(source, out, strict=True):
        assert tuple(e) == TWEET_FIELDS
        if e["time"] != original["time"]:
            late += 1
            assert newest is not None and e["time"] == newest - 60_000
            assert {k: v for k, v in e.items() if k != "time"} == {
                k: v for k, v in original.items() if k != "time"
            }
        else:
            newest = e["time"] if newest is None else max(newest, e["time"])
    assert 300 < late < 500


def test_late_events() -> None:
    evs = late_events(Ads(3), 50, ref_ms=T0, late_by_ms=5000)
    assert [e["event_time"] for e in evs] == [T0 - 5000] * 50
    assert all(tuple(e) == AD_FIELDS for e in evs)
    spread = late_events(Tweets(3), 500, ref_ms=T0, late_by_ms=5000, spread_ms=1000, seed=2)
    times = [e["time"] for e in spread]
    assert min(times) >= T0 - 6000 and max(times) <= T0 - 5000 and len(set(times)) > 100


def test_live_events_use_the_clock_and_stop() -> None:
    ticks = itertools.count(T0, 3)  # ms; the clock returns seconds
    clock_now = [0.0]

    def clock() -> float:
        clock_now[0] = next(ticks) / 1000
        return clock_now[0]

    produced = 0

    def stop() -> bool:
        return produced >= 1000

    out = []
    for e in live_events(Tweets(10), disorder_ms=500, clock=clock, stop=stop):
        assert clock_now[0] * 1000 - 500 <= e["time"] <= clock_now[0] * 1000 + 1
        out.append(e)
        produced += 1
    assert len(out) == 1000
    assert 0 < max_disorder(out, "time") <= 500


def test_live_events_late_fraction() -> None:
    out = list(
        itertools.islice(
            live_events(Tweets(10), late_fraction=0.2, late_by_ms=60_000, seed=1), 2000
        )
    )
    lateness = max_disorder(out, "time")
    assert 60_000 <= lateness < 61_000
    assert all(tuple(e) == TWEET_FIELDS for e in out)


def test_bad_arguments_fail_at_the_call() -> None:
    with pytest.raises(ValueError):
        span_times(10, t0_ms=T0, span_ms=0)
    with pytest.raises(ValueError):
        events_over_span(Tweets(1), 10, t0_ms=T0, span_ms=10, disorder_ms=-1)
    with pytest.raises(ValueError):
        with_late([], Tweets(1), fraction=1.5, late_by_ms=10)
    with pytest.raises(ValueError):
        live_events(Tweets(1), disorder_ms=-5)
    with pytest.raises(ValueError):
        Tweets(0)
