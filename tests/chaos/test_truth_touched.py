"""The chaos harness's incremental ground truth (no Spark): counts add up over reads, and
``take_touched`` names exactly the keys and the oldest window start the new lines changed,
per state, which is what a scenario's check compares."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.chaos.harness import BOUNDARY, HOUR, STATES, _Truth

H1, CLK, M1 = STATES


def append(log: Path, *events: tuple[str, str, int]) -> None:
    with open(log, "ab") as f:
        for key, kind, t in events:
            f.write(orjson.dumps({"tweet_id": key, "event": kind, "time": t}) + b"\n")


def test_touched_names_the_new_lines_windows_only(tmp_path: Path) -> None:
    log, t0 = tmp_path / "events.jsonl", BOUNDARY + 5 * HOUR
    truth = _Truth()
    append(log, ("a", "impression", t0 + 1000), ("b", "url-click", t0 + 2000))
    truth.read(log)
    first = truth.take_touched()
    assert first[H1].keys == {"a"} and first[H1].since == t0
    assert first[CLK].keys == {"b"} and first[CLK].since == t0
    # sliding minute windows of 10 s panes: the oldest containing t0 + 1000 starts 50 s
    # before its pane
    assert first[M1].keys == {"a"} and first[M1].since == t0 - 50_000
    # an hour later, one more impression of b: only b, only from that hour on
    append(log, ("b", "impression", t0 + HOUR + 30_000))
    truth.read(log)
    second = truth.take_touched()
    assert second[H1].keys == {"b"} and second[H1].since == t0 + HOUR
    assert second[CLK].keys == set() and second[CLK].since is None
    assert second[M1].since == t0 + HOUR + 30_000 - 50_000
    # the totals are the whole log's
    assert truth.states[H1] == {("a", t0): 1, ("b", t0 + HOUR): 1}
    assert truth.states[CLK] == {("b", t0): 1}
    assert truth.take_touched()[H1].keys == set()  # nothing new since


def test_late_events_touch_nothing(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    truth = _Truth()
    append(log, ("a", "impression", BOUNDARY - 10 * 60_000))
    truth.read(log)
    assert all(not t.keys for t in truth.take_touched().values())
    assert truth.keys == {"a"}
