"""Window arithmetic shared by the job (which assigns events) and the shard (which answers
windows): Spark's ``window(time, size, slide)`` with no start offset, on epoch milliseconds,
windows half-open ``[start, start + size)``.

An event at ``t`` is in every window ``[s, s + size)`` with ``s % slide == 0`` and
``s <= t < s + size``. A sliding window is stored as *panes* (Li et al., "No pane, no gain"):
slices of ``gcd(size, slide)`` ms, so an event is written once, into its pane, and a window
is the combination of the panes it covers. Every event of a pane belongs to the same set of
windows, which is what makes a pane a unit.

Lateness (Spark's rule, docs/architecture.md §3): batch N drops an event from each of its windows
whose end
is at or before the watermark of batch N-1. For a sliding window an event can be late for
its older windows and on time for its newer ones; such an event is stored in a *sub-pane*
tagged with the first window start it still counts in (``pane_tag``), so the windows that
had already closed never change.
"""

from __future__ import annotations

from math import gcd

__all__ = ["ALL_WINDOWS", "first_open_start", "first_window_of", "last_window_of", "pane_ms",
           "pane_tag", "window_starts"]

# The tag of a (sub-)pane whose events count in every window that covers it.
ALL_WINDOWS = -(1 << 63)


def floor_to(t: int, step: int) -> int:
    """The largest multiple of ``step`` at or below ``t`` (also for negative ``t``)."""
    return t - t % step


def pane_ms(size_ms: int, slide_ms: int) -> int:
    return gcd(size_ms, slide_ms)


def first_window_of(t: int, size_ms: int, slide_ms: int) -> int:
    """Start of the oldest window that contains ``t``: the smallest aligned start after
    ``t - size``."""
    return floor_to(t - size_ms, slide_ms) + slide_ms


def last_window_of(t: int, slide_ms: int) -> int:
    """Start of the newest window that contains ``t``."""
    return floor_to(t, slide_ms)


def window_starts(t: int, size_ms: int, slide_ms: int) -> list[int]:
    """Starts of every window containing ``t``, oldest first."""
    return list(range(first_window_of(t, size_ms, slide_ms), last_window_of(t, slide_ms) + 1,
                      slide_ms))


def first_open_start(late_watermark_ms: int, size_ms: int, slide_ms: int) -> int:
    """Start of the oldest window still open: its end is after the watermark."""
    return first_window_of(late_watermark_ms, size_ms, slide_ms)


def pane_tag(pane_start: int, size_ms: int, slide_ms: int, late_watermark_ms: int) -> int | None:
    """Where the events of a pane go in a batch whose late-data watermark is given:
    ``ALL_WINDOWS`` (every window covering the pane is open), the first window start they
    still count in (some closed), or None (every window closed: the events are dropped)."""
    oldest = first_window_of(pane_start, size_ms, slide_ms)
    newest = last_window_of(pane_start, slide_ms)
    open_from = first_open_start(late_watermark_ms, size_ms, slide_ms)
    if open_from <= oldest:
        return ALL_WINDOWS
    return open_from if open_from <= newest else None
