"""One Feast read as qstate reads (docs/feast.md, one batch a call): the states of every
feature view asked, one batch read of several states per operator and window (chunked by the
caller at the router's batch-key cap), and every answer of one operator in one call at the
same batch, so a feature vector never mixes two batches of an operator (the router answers
a key's states as of one batch; keys of other partitions may be at others). Per operator,
not per job: a job in spark-state mode runs each operator as a query of its own, whose
batches are numbered apart.

The rounds are written without I/O (``rounds`` yields the reads to make and is sent their
answers): the store drives them over the wire, a test with answers of its own making. A
round's answers that name more than one batch of an operator are read again with ``min_batch``
set to the newest of them (the router waits until every partition has it:
docs/architecture.md §5); a partition committing meanwhile costs one more round, at most
``max_rounds``. A closed window is placed by the watermark: the watermark last seen for its
operator (or the operator's, from ``GET /v1/jobs/{job}``), checked against the answers' own:
if the answers' watermark places it elsewhere, it is read again there.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.value_type import ValueType

from qstate.core.answer import OperatorInfo, StateValues
from qstate.core.errors import Unavailable, UnknownOperator
from qstate.feast.config import WindowChoice
from qstate.feast.mapping import closed_start, event_time, is_stale, value_proto

__all__ = ["Ask", "Marks", "Row", "ViewRead", "rounds"]

Row = tuple[datetime | None, dict[str, ValueProto] | None]


@dataclass(frozen=True)
class ViewRead:
    """One feature view's part of a read: its keys (qstate keys, in Feast's order) and the
    features asked, each with its state and declared type."""

    job: str
    operator: str
    window: WindowChoice
    features: tuple[tuple[str, str, ValueType], ...]  # (feature, state, declared type)
    keys: tuple[str, ...]
    ttl: timedelta | None = None


@dataclass(frozen=True)
class Ask:
    """One batch read: ``keys`` in each of ``states`` of one operator, their latest windows
    (``start`` None) or the window starting at ``start``, as of ``min_batch`` or later; its
    answers come key by key, each key's states in order."""

    job: str
    operator: str
    states: tuple[str, ...]
    keys: tuple[str, ...]
    start: int | None
    min_batch: int | None


@dataclass
class Marks:
    """What the store learned of each operator, kept across calls: its window (described
    once) and the (batch, watermark) of the newest answer seen."""

    operators: dict[tuple[str, str], OperatorInfo] = field(default_factory=dict)
    seen: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    def watermark(self, job: str, operator: str) -> int:
        got = self.seen.get((job, operator))
        if got is not None:
            return got[1]
        return self.operators[(job, operator)].watermark

    def note(self, job: str, operator: str, batch: int, watermark: int) -> None:
        if batch >= self.seen.get((job, operator), (-2, 0))[0]:
            self.seen[(job, operator)] = (batch, watermark)


def _start(v: ViewRead, marks: Marks, placed: dict[tuple[str, str], int]) -> int | None:
    if v.window == "latest":
        return None
    op = marks.operators.get((v.job, v.operator))
    if op is None:  # the job, described, has no such operator
        raise UnknownOperator(f"job {v.job!r} has no operator {v.operator!r}: the router "
                              f"serves {sorted(o for j, o in marks.operators if j == v.job)}")
    return placed.setdefault((v.job, v.operator),
                             closed_start(marks.watermark(v.job, v.operator), op))


def plan(views: Sequence[ViewRead], marks: Marks, placed: dict[tuple[str, str], int],
         floor: dict[tuple[str, str], int]) -> list[Ask]:
    """The reads of one round: one per operator and window whatever the views asking it, their
    states and keys merged in order."""
    states: dict[tuple[str, str, int | None], dict[str, None]] = {}
    keys: dict[tuple[str, str, int | None], dict[str, None]] = {}
    for v in views:
        if not v.keys:
            continue
        start = _start(v, marks, placed)
        states.setdefault((v.job, v.operator, start), {}).update(
            dict.fromkeys(state for _, state, _ in v.features))
        keys.setdefault((v.job, v.operator, start), {}).update(dict.fromkeys(v.keys))
    return [Ask(job, op, tuple(states[(job, op, start)]), tuple(ks), start,
                floor.get((job, op))) for (job, op, start), ks in keys.items()]


def rounds(views: Sequence[ViewRead], marks: Marks, max_rounds: int, now: datetime
           ) -> Generator[list[Ask], list[list[StateValues]], list[list[Row]]]:
    """Yields each round's reads, is sent their answers (one list per ask, one answer per key
    and state, key by key, each key's states in the ask's order), and returns each view's rows
    (one per key: Feast's online_read answer)."""
    placed: dict[tuple[str, str], int] = {}
    floor: dict[tuple[str, str], int] = {}
    batches: dict[tuple[str, str], set[int]] = {}
    for _ in range(max_rounds):
        asks = plan(views, marks, placed, floor)
        answers = yield asks
        got: dict[tuple[str, str, int | None], tuple[Ask, list[StateValues]]] = {}
        newest: dict[tuple[str, str], tuple[int, int]] = {}  # operator -> (batch, watermark)
        batches = {}
        for a, said in zip(asks, answers, strict=True):
            got[(a.job, a.operator, a.start)] = (a, said)
            op = (a.job, a.operator)
            seen = batches.setdefault(op, set())
            top = newest.get(op, (-2, 0))
            for ans in said:
                seen.add(ans["batch"])
                if ans["batch"] >= top[0]:
                    top = (ans["batch"], ans["watermark"])
            if said:
                newest[op] = top
        for (job, op_name), (batch, watermark) in newest.items():
            marks.note(job, op_name, batch, watermark)
        # a closed window placed by another watermark than the newest answer's: read again
        moved = {op: s for op, start in placed.items() if op in newest
                 and (s := closed_start(newest[op][1], marks.operators[op])) != start}
        if all(len(b) == 1 for b in batches.values()) and not moved:
            return [_rows(v, got, placed, now) for v in views]
        floor = {op: max(b) for op, b in batches.items()}
        placed.update(moved)
    mixed = {"/".join(op): sorted(b) for op, b in batches.items() if len(b) > 1}
    raise Unavailable(
        f"could not read one batch of {sorted(mixed) or sorted('/'.join(p) for p in placed)} "
        f"in {max_rounds} rounds (answers at batches {mixed}): the job commits faster than a "
        "read goes round; retry, or raise max_rounds", reason="behind")


def _rows(v: ViewRead, got: dict[tuple[str, str, int | None], tuple[Ask, list[StateValues]]],
          placed: dict[tuple[str, str], int], now: datetime) -> list[Row]:
    start = placed.get((v.job, v.operator)) if v.window == "closed" else None
    ask, said = got[(v.job, v.operator, start)]
    # where each of the view's answers is in its ask's: key by key, states in the ask's order
    width = len(ask.states)
    column = {state: j for j, state in enumerate(ask.states)}
    features = [(feature, column[state], kind) for feature, state, kind in v.features]
    rows: Sequence[int]
    if ask.keys == v.keys:  # a view read alone asks its own keys in its order: the usual call
        rows = range(0, width * len(v.keys), width)
    else:
        first = {key: i * width for i, key in enumerate(ask.keys)}
        rows = [first[key] for key in v.keys]
    out: list[Row] = []
    for row in rows:
        # the states of one operator share a record: a key has a window in all or in none
        found = [(feature, kind, a) for feature, j, kind in features
                 if (a := said[row + j])["found"] and a["windows"]]
        if not found:
            out.append((None, None))
            continue
        at = event_time(found[0][2]["windows"][-1], found[0][2]["watermark"])
        if is_stale(at, v.ttl, now):
            out.append((at, None))
            continue
        out.append((at, {f: value_proto(a["windows"][-1]["value"], kind)
                         for f, kind, a in found}))
    return out
