"""The answer bytes written without models equal the models' bytes (``qstate.core.answer``),
which the OpenAPI document states and the clients parse: a key's answer as the read core
writes it (``qstate._engine.answer_json``, every read's), a watch event as the router's
Python writes it around those (``qstate.router.wire``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qstate._engine import answer_json
from qstate.core.answer import (
    StateAnswer,
    TopAnswer,
    TopEntry,
    WatchEvent,
    Window,
    WindowSpan,
)
from qstate.partition.ranking import Ranked
from qstate.router.hits import Hit, Row
from qstate.router.top import TopResult
from qstate.router.watch import Push
from qstate.router.wire import watch_event_json
from tests.shop import SPEC

_int64 = st.integers(-(2**63), 2**63 - 1)
_values = st.one_of(st.none(), _int64, st.floats(allow_nan=True, allow_infinity=True))
_windows = st.lists(st.builds(lambda s, e, v: Window.model_construct(start=s, end=e, value=v),
                              st.one_of(st.none(), _int64), st.one_of(st.none(), _int64),
                              _values), max_size=5)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40), st.booleans(), _int64, _int64, _windows,
       st.one_of(st.none(), _int64))
def test_the_read_cores_bytes_are_the_models_bytes(job: str, key: str, found: bool,
                                                   batch: int, watermark: int,
                                                   windows: list[Window],
                                                   next_from: int | None) -> None:
    """Every read answers a key in the read core's bytes; the OpenAPI document names the
    model: the same bytes for any key (any text), value and window."""
    model = StateAnswer.model_construct(job=job, operator="op", state="st", key=key,
                                        found=found, batch=batch, watermark=watermark,
                                        windows=windows, next_from=next_from)
    rows = [(w.start, w.end, w.value) for w in windows]
    assert answer_json(job, "op", "st", key, found, batch, watermark, rows,
                       next_from) == model.model_dump_json().encode()


_ranked = st.lists(st.builds(Ranked, st.text(max_size=10), st.one_of(_int64, st.floats())),
                   max_size=4)
_rows = st.lists(st.builds(Row, st.one_of(st.none(), _int64), st.one_of(st.none(), _int64),
                           _values), max_size=3)
_hits = st.builds(Hit, st.booleans(), _int64, _int64, _rows, st.one_of(st.none(), _int64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=20), _hits), max_size=4), _int64, _int64,
       st.integers(0, 2**62), st.booleans(), st.booleans(),
       st.one_of(st.none(), st.tuples(st.one_of(st.none(), _int64), _ranked)), st.booleans())
def test_a_watch_event_is_the_models_bytes(changes: list[tuple[str, Hit]], batch: int,
                                           watermark: int, committed: int, coalesced: bool,
                                           snapshot: bool,
                                           top: tuple[int | None, list[Ranked]] | None,
                                           descending: bool) -> None:
    """Each SSE event's data is ``watch_event_json``; the OpenAPI document names WatchEvent."""
    board = None if top is None else TopResult(SPEC, "views", top[0],
                                               None if top[0] is None else top[0] + 1, batch,
                                               watermark, top[1])
    p = Push(SPEC, "views", batch, watermark, committed, coalesced, snapshot, changes, board,
             descending)
    model = WatchEvent.model_construct(
        job=SPEC.job, operator=SPEC.operator, state="views", batch=batch, watermark=watermark,
        committed_at=committed or None, coalesced=coalesced, snapshot=snapshot,
        changes=[StateAnswer.model_construct(
            job=SPEC.job, operator=SPEC.operator, state="views", key=k, found=h.found,
            batch=h.batch, watermark=h.watermark_ms,
            windows=[Window.model_construct(start=w.start, end=w.end, value=w.value)
                     for w in h.windows], next_from=h.next_from) for k, h in changes],
        top=None if board is None else TopAnswer.model_construct(
            job=SPEC.job, operator=SPEC.operator, state="views",
            window=None if board.start is None or board.end is None
            else WindowSpan.model_construct(start=board.start, end=board.end),
            order="desc" if descending else "asc", batch=batch, watermark=watermark,
            entries=[TopEntry.model_construct(key=k, value=v) for k, v in board.entries]))
    assert watch_event_json(p) == model.model_dump_json().encode()
