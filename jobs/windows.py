"""Window declarations for merged operators, read like Spark's ``window`` and
``session_window`` (the event-time column is the job's, declared once):

    window("1 hour")                    tumbling
    window("1 minute", "10 seconds")    sliding, stored as 10 s panes
    session_window("30 seconds")        gap-based sessions, merged on the shard

and how a batch's rows are assigned to windows (or panes) in Spark, with Spark's late-data
rule applied per window (``qstate.core.windows`` has the arithmetic and its reasons).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from qstate.core.errors import InvalidRequest
from qstate.core.records.operator import WindowSpec
from qstate.core.windows import ALL_WINDOWS, first_open_start

__all__ = ["END", "KEY", "START", "TAG", "TIME", "Window", "assign", "duration_ms",
           "session_bounds", "session_window", "window"]

_UNITS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000,
          "day": 86_400_000, "week": 604_800_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(millisecond|second|minute|hour|day|week)s?\s*$", re.I)


def duration_ms(text: str | int) -> int:
    """``"10 seconds"`` (Spark's interval words) or milliseconds as an int."""
    if isinstance(text, int):
        return text
    m = _DURATION.match(text)
    if m is None:
        raise InvalidRequest(f"duration {text!r}: write it as Spark does, e.g. '10 seconds', "
                             "'1 minute', '2 hours'")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class Window:
    spec: WindowSpec


def window(size: str | int, slide: str | int | None = None) -> Window:
    size_ms = duration_ms(size)
    if slide is None or duration_ms(slide) == size_ms:
        return Window(WindowSpec("tumbling", size_ms))
    return Window(WindowSpec("sliding", size_ms, duration_ms(slide)))


def session_window(gap: str | int) -> Window:
    return Window(WindowSpec("session", gap_ms=duration_ms(gap)))


# Columns assign() adds; qstate's own names, so they never meet a user's column.
KEY, TIME, START, END, TAG = "_qs_key", "_qs_t", "_qs_start", "_qs_end", "_qs_tag"


def assign(df: DataFrame, w: WindowSpec, t: Column, key: Column, late_ms: int) -> DataFrame:
    """Rows of a batch with their key (as a string, ``KEY``), event time (``TIME``), window
    (or pane) ``START``/``END`` and pane ``TAG``, dropped where Spark would drop them as late:
    a window whose end is at or before ``late_ms`` (batch N-1's watermark) takes no more rows.
    Session windows get their bounds when the batch is grouped (``session_bounds``)."""
    base = df.withColumn(KEY, key.cast("string")).withColumn(TIME, t)
    none = F.lit(None).cast("long")
    if w.kind == "none":
        return base.withColumn(START, none).withColumn(END, none).withColumn(TAG, none)
    tt = F.col(TIME)
    if w.kind == "tumbling":
        start = tt - F.pmod(tt, F.lit(w.size_ms))
        return (base.withColumn(START, start).withColumn(END, F.col(START) + F.lit(w.size_ms))
                .where(F.col(END) > F.lit(late_ms)).withColumn(TAG, none))
    if w.kind == "sliding":
        size, slide, g = w.size_ms, w.slide_ms, w.pane_ms
        pane = tt - F.pmod(tt, F.lit(g))
        older = pane - F.lit(size)
        oldest = older - F.pmod(older, F.lit(slide)) + F.lit(slide)
        newest = pane - F.pmod(pane, F.lit(slide))
        open_from = first_open_start(late_ms, size, slide)
        tag = (F.when(F.lit(open_from) <= oldest, F.lit(ALL_WINDOWS))
               .when(F.lit(open_from) <= newest, F.lit(open_from)))
        return (base.withColumn(START, pane).withColumn(END, pane + F.lit(g))
                .withColumn(TAG, tag.cast("long")).where(F.col(TAG).isNotNull()))
    # session: a row starts as [t, t + gap); late when that ends at or before the watermark
    return base.where(tt + F.lit(w.gap_ms) > F.lit(late_ms))


def session_bounds(w: WindowSpec) -> Column:
    """The session of a row within the batch (Spark's ``session_window``: start is the
    first event, end the last event plus the gap)."""
    return F.session_window(F.timestamp_millis(F.col(TIME)), f"{w.gap_ms} milliseconds")
