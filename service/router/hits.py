"""What one key's read gives the query core, whichever path read it (the engine's local
read, a shard's answer over gRPC): its rows, as of one batch (docs/architecture.md §5)."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Hit", "Row"]


class Row(NamedTuple):
    """One window of one state, as read: what an answer's ``Window`` is made of (a tuple,
    made per window on the hot path; the model only where a model is answered)."""

    start: int | None
    end: int | None
    value: int | float | None


class Hit(NamedTuple):
    found: bool
    batch: int
    watermark_ms: int
    windows: list[Row]
    next_from: int | None = None  # a range cut at its limit: where the next page starts
