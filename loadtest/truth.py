"""Ground truth for window aggregates, computed with pandas from a delivery log.

Deliberately shares no code with qstate (nor with ``loadtest.workloads``): a bug in the
pipeline's window logic must not be reproduced here. Window semantics follow Spark's
``window()`` with no ``startTime`` and ``session_window()``; times are epoch milliseconds and
windows are half-open ``[start, end)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import orjson
import pandas as pd

PathLike: TypeAlias = str | os.PathLike[str]
Where: TypeAlias = str | Mapping[str, Any] | Callable[[pd.DataFrame], Any] | pd.Series | None


def load_events(path: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """Reads JSON-lines event logs (one or several files) into one DataFrame.

    Parsed with orjson rather than ``pd.read_json``, which would turn ``event_time`` (a name
    ending in ``_time``) into datetimes and may coerce id strings.
    """
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    records: list[dict[str, Any]] = []
    for p in paths:
        with open(p, "rb") as f:
            records.extend(orjson.loads(line) for line in f if line.strip())
    return pd.DataFrame.from_records(records)


def _select(df: pd.DataFrame, where: Where) -> pd.DataFrame:
    if where is None:
        return df
    if isinstance(where, str):
        return df.query(where)
    if isinstance(where, Mapping):
        mask = pd.Series(True, index=df.index)
        for col, want in where.items():
            if isinstance(want, list | tuple | set | frozenset):
                mask &= df[col].isin(list(want))
            else:
                mask &= df[col] == want
        return df[mask]
    mask = where(df) if callable(where) else where
    return df[np.asarray(mask, dtype=bool)]


def _key_list(key: str | Sequence[str]) -> list[str]:
    return [key] if isinstance(key, str) else list(key)


def _empty(keys: list[str], df: pd.DataFrame) -> pd.DataFrame:
    cols = {k: df[k].iloc[:0] if k in df else pd.Series(dtype=object) for k in keys}
    cols.update({c: pd.Series(dtype="int64") for c in ("start", "end", "count")})
    return pd.DataFrame(cols)


def window_counts(
    df: pd.DataFrame,
    key: str | Sequence[str],
    time: str,
    size_ms: int,
    slide_ms: int | None = None,
    where: Where = None,
) -> pd.DataFrame:
    """Event counts per key and time window: columns ``*key, start, end, count`` (int64),
    sorted by key then start; only windows holding at least one event appear.

    ``slide_ms`` None means tumbling. Otherwise an event at ``t`` counts in every window
    ``[s, s + size)`` with ``s % slide == 0`` and ``s <= t < s + size`` (``size`` need not be
    a multiple of ``slide``). ``where`` filters events first: a ``DataFrame.query`` string, a
    ``{column: value or list of values}`` mapping, a boolean mask or a callable returning one.
    Events with a missing time or key are dropped.
    """
    if size_ms <= 0 or (slide_ms is not None and slide_ms <= 0):
        raise ValueError("size_ms and slide_ms must be > 0")
    keys = _key_list(key)
    events = _select(df, where)
    if not events.empty:
        events = events.dropna(subset=[*keys, time])
    if events.empty:
        return _empty(keys, df)
    t = events[time].to_numpy(dtype=np.int64)
    slide = slide_ms or size_ms
    # Floor modulo: the newest window start at or before t, also for times before 1970.
    newest_start = t - np.mod(t, slide)
    overlapping = -(-size_ms // slide)
    parts = []
    for k in range(overlapping):
        start = newest_start - k * slide
        inside = start + size_ms > t
        part = events.loc[inside, keys].copy()
        part["start"] = start[inside]
        parts.append(part)
    assigned = pd.concat(parts, ignore_index=True)
    counts = assigned.groupby([*keys, "start"], sort=True).size().reset_index(name="count")
    counts["start"] = counts["start"].astype("int64")
    counts.insert(len(keys) + 1, "end", counts["start"] + size_ms)
    counts["count"] = counts["count"].astype("int64")
    return counts.reset_index(drop=True)


def sessions(
    df: pd.DataFrame,
    key: str | Sequence[str],
    time: str,
    gap_ms: int,
    where: Where = None,
) -> pd.DataFrame:
    """Session windows per key, like Spark's ``session_window(time, gap)``: columns
    ``*key, start, end, count`` where ``start`` is the first event time, ``end`` the last
    one plus ``gap_ms``.

    Each event opens ``[t, t + gap)``; Spark merges a window into the session when its start
    is ``<=`` the session's end, so events exactly ``gap_ms`` apart share a session.
    """
    if gap_ms <= 0:
        raise ValueError("gap_ms must be > 0")
    keys = _key_list(key)
    events = _select(df, where)
    if not events.empty:
        events = events.dropna(subset=[*keys, time])
    if events.empty:
        return _empty(keys, df)
    ordered = events[[*keys, time]].sort_values([*keys, time], kind="stable")
    t = ordered[time].to_numpy(dtype=np.int64)
    # Row i opens a session when its key differs from row i-1's or it lies over a gap after it.
    opens = np.ones(len(ordered), dtype=bool)
    same_key = np.ones(len(ordered) - 1, dtype=bool)
    for k in keys:
        v = ordered[k].to_numpy()
        same_key &= v[1:] == v[:-1]
    opens[1:] = ~same_key | ((t[1:] - t[:-1]) > gap_ms)
    session_id = np.cumsum(opens)
    grouped = ordered.assign(_sid=session_id).groupby("_sid", sort=True)
    out = grouped[keys].first()
    out["start"] = grouped[time].min().astype("int64")
    out["end"] = grouped[time].max().astype("int64") + gap_ms
    out["count"] = grouped.size().astype("int64")
    return out.sort_values([*keys, "start"]).reset_index(drop=True)


def ads_campaign_views(
    df: pd.DataFrame, mapping: Mapping[str, str] | PathLike, size_ms: int = 10_000
) -> pd.DataFrame:
    """The Yahoo Streaming Benchmark query: views per campaign per tumbling window.

    Keeps ``event_type == "view"``, maps ``ad_id`` to ``campaign_id`` (ads missing from the
    mapping are dropped, as YSB's join drops them) and counts by ``event_time``. Columns
    ``campaign_id, start, end, count``. ``mapping`` is a dict or the JSON file
    ``qstate generate ads`` writes.
    """
    if not isinstance(mapping, Mapping):
        mapping = orjson.loads(Path(mapping).read_bytes())
    views = _select(df, {"event_type": "view"}) if not df.empty else df
    if views.empty:
        return _empty(["campaign_id"], pd.DataFrame({"campaign_id": pd.Series(dtype=object)}))
    joined = views.assign(campaign_id=views["ad_id"].map(mapping)).dropna(subset=["campaign_id"])
    return window_counts(joined, "campaign_id", "event_time", size_ms)
