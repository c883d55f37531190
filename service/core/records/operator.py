"""What a queryable operator is: its address, partitions, window and aggregates.

The job writes this spec to checkpoint storage when it starts; shards and routers read it,
so none of them needs the driver to answer.

Two modes (docs/architecture.md §3). In **merge** mode (the default) the shard is the operator's
state:
each batch brings per-batch partial aggregates, and the shard combines them with what it
holds (count/sum add, min/max, avg as sum and count, approx_count_distinct as a mergeable
HyperLogLog sketch). In **spark-state** mode Spark's stateful aggregation keeps the state and
each batch's updated rows replace the served values (``value`` aggregates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Literal

import orjson

from qstate.core.address import check_name
from qstate.core.config import DEFAULTS
from qstate.core.errors import InvalidRequest
from qstate.core.records import paths
from qstate.core.records.storage import Storage
from qstate.core.windows import pane_ms

__all__ = ["MAX_REPLICAS", "MERGEABLE", "AggKind", "Aggregate", "Mode", "OperatorSpec", "StateType",
           "WindowKind", "WindowSpec", "list_specs", "load_spec", "save_spec", "state_changes"]

StateType = Literal["long", "double"]
WindowKind = Literal["tumbling", "sliding", "session", "none"]
AggKind = Literal["count", "sum", "min", "max", "avg", "approx_count_distinct", "value"]
Mode = Literal["merge", "spark-state"]
MERGEABLE: frozenset[str] = frozenset(
    {"count", "sum", "min", "max", "avg", "approx_count_distinct"})
_KINDS = (*sorted(MERGEABLE), "value")
_TYPES = ("long", "double")
MAX_REPLICAS = 3


@dataclass(frozen=True)
class Aggregate:
    """One named aggregate of an operator; ``type`` is the type of its answers."""

    kind: AggKind
    type: StateType
    lg_k: int = 0  # approx_count_distinct: the sketch has 2**lg_k registers

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidRequest(f"aggregate kind {self.kind!r}: use one of {', '.join(_KINDS)}")
        if self.type not in _TYPES:
            raise InvalidRequest(f"aggregate type must be 'long' or 'double', not {self.type!r}")
        if self.kind == "approx_count_distinct" and not 4 <= self.lg_k <= 21:
            raise InvalidRequest("approx_count_distinct needs lg_k between 4 and 21")

    def typed(self, value: float | None) -> int | float | None:
        """``value`` as the answer's declared type: whether a client reads a long or a double.
        A long answer of a double (a long average) truncates toward zero and saturates at the
        int64 bounds, NaN is no value: as the read engine types it (``tests/vectors``)."""
        if value is None:
            return None
        if self.type != "long":
            return float(value)
        if value != value:  # NaN
            return None
        if value >= _TWO_63:
            return _TWO_63 - 1
        if value < -_TWO_63:
            return -_TWO_63
        return int(value)


_TWO_63 = 1 << 63


@dataclass(frozen=True)
class WindowSpec:
    kind: WindowKind = "none"
    size_ms: int = 0
    slide_ms: int = 0
    gap_ms: int = 0

    def __post_init__(self) -> None:
        if self.kind == "tumbling" and self.size_ms <= 0:
            raise InvalidRequest("a tumbling window needs size_ms > 0")
        if self.kind == "sliding" and not 0 < self.slide_ms <= self.size_ms:
            raise InvalidRequest("a sliding window needs 0 < slide_ms <= size_ms")
        if self.kind == "session" and self.gap_ms <= 0:
            raise InvalidRequest("a session window needs gap_ms > 0")
        if self.kind not in ("tumbling", "sliding", "session", "none"):
            raise InvalidRequest(f"window kind {self.kind!r}: use tumbling, sliding, session "
                                 "or none")

    @property
    def slide(self) -> int:
        """The distance between window starts (a tumbling window slides by its size)."""
        return self.slide_ms if self.kind == "sliding" else self.size_ms

    @property
    def pane_ms(self) -> int:
        """How finely a sliding window is stored (tumbling: the window itself)."""
        return pane_ms(self.size_ms, self.slide) if self.kind == "sliding" else self.size_ms


@dataclass(frozen=True, init=False)
class OperatorSpec:
    job: str
    operator: str
    key: str
    states: dict[str, Aggregate]
    partitions: int
    window: WindowSpec
    retention_ms: int
    replicas: int

    def __init__(self, job: str, operator: str, key: str,
                 states: Mapping[str, Aggregate | StateType],
                 partitions: int = DEFAULTS.partitions, window: WindowSpec | None = None,
                 retention_ms: int = DEFAULTS.retention_ms, replicas: int = 1) -> None:
        """``states`` maps each aggregate's name to its Aggregate, or to "long"/"double" for
        a Spark-state value. ``replicas``: copies of each partition on distinct shard servers
        (the owner and ``replicas - 1`` followers that apply the same batches and answer
        reads when the owner dies), as many as there are live servers."""
        check_name("job", job)
        check_name("operator", operator)
        if not states:
            raise InvalidRequest("an operator needs at least one aggregate")
        normal: dict[str, Aggregate] = {}
        for name, agg in states.items():
            check_name("state", name)
            normal[name] = agg if isinstance(agg, Aggregate) else Aggregate("value", agg)
        if len({a.kind == "value" for a in normal.values()}) > 1:
            raise InvalidRequest(f"{job}/{operator}: merged aggregates and Spark-state values "
                                 "cannot be mixed in one operator")
        if not 1 <= partitions <= 4096:
            raise InvalidRequest("partitions must be between 1 and 4096")
        if not 1 <= replicas <= MAX_REPLICAS:
            raise InvalidRequest(f"replicas must be between 1 and {MAX_REPLICAS}")
        for name, value in (("job", job), ("operator", operator), ("key", key),
                            ("states", normal), ("partitions", partitions),
                            ("window", window or WindowSpec()), ("retention_ms", retention_ms),
                            ("replicas", replicas)):
            object.__setattr__(self, name, value)

    # derived from frozen fields, asked on every read: computed once per spec
    @cached_property
    def mode(self) -> Mode:
        return "spark-state" if next(iter(self.states.values())).kind == "value" else "merge"

    @cached_property
    def panes(self) -> bool:
        """A merged sliding window is stored as panes; Spark-state rows are whole windows."""
        return self.mode == "merge" and self.window.kind == "sliding"

    @property
    def windowed(self) -> bool:
        return self.window.kind != "none"

    @property
    def state_names(self) -> list[str]:
        return list(self.states)

    @cached_property
    def state_index(self) -> dict[str, int]:
        """Each state's position among the operator's aggregates (a stored row's order)."""
        return {name: i for i, name in enumerate(self.states)}

    @property
    def types(self) -> dict[str, StateType]:
        return {name: a.type for name, a in self.states.items()}

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> OperatorSpec:
        raw: dict[str, Any] = orjson.loads(data)
        raw["window"] = WindowSpec(**raw.get("window", {}))
        raw["states"] = {n: Aggregate(**a) for n, a in raw["states"].items()}
        return cls(**raw)


def save_spec(storage: Storage, spec: OperatorSpec, rescale: bool = False) -> None:
    """Write the operator's spec; a different partition count only from ``rescale``
    (`qstate state rescale`, service/control/rescale.py), which has split the state first."""
    path = paths.spec(spec.job, spec.operator)
    if storage.exists(path):
        old = OperatorSpec.from_json(storage.read_bytes(path))
        if old.partitions != spec.partitions and not rescale:
            raise InvalidRequest(
                f"{spec.job}/{spec.operator} has {old.partitions} partitions in storage; "
                f"changing to {spec.partitions} needs `qstate state rescale {spec.job} "
                f"--partitions {spec.partitions}` while the job is stopped (a multiple of "
                f"{old.partitions})")
        changed = state_changes(old, spec)
        if changed:
            raise InvalidRequest(
                f"{spec.job}/{spec.operator} cannot keep its state: {'; '.join(changed)}. Its "
                "stored values would not mean what the job declares now. Serve the change "
                "under a new operator name beside this one (it fills from the job's current "
                f"position), and keep this one's state readable with a savepoint (`qstate "
                f"savepoint create {spec.job}`); or run the new code as a fork beside the "
                f"job, from that savepoint (`qstate job ... --name {spec.job}_v2 "
                f"--from-savepoint {spec.job}@NAME`, the changed operator under a new name): "
                "docs/upgrading.md")
    storage.write_bytes(path, spec.to_json())


def _window_text(w: WindowSpec) -> str:
    if w.kind == "none":
        return "no window"
    if w.kind == "session":
        return f"session, gap {w.gap_ms} ms"
    if w.kind == "sliding":
        return f"sliding {w.size_ms} ms every {w.slide_ms} ms"
    return f"tumbling {w.size_ms} ms"


def _aggregate_text(a: Aggregate) -> str:
    return a.kind + (f" (lg_k {a.lg_k})" if a.lg_k else "") + f" as {a.type}"


def state_changes(old: OperatorSpec, new: OperatorSpec) -> list[str]:
    """What ``new`` changes of ``old`` that its stored state cannot follow: the key, the
    window, an aggregate's kind or type, an aggregate removed, or added other than after
    the existing ones (docs/upgrading.md); [] when the state carries over. Aggregates
    declared after every existing one begin empty: a value stored before has the existing
    ones' fields first and none of theirs (``qstate.partition.codec``), except where the
    operator has an approx_count_distinct, whose sketch ends a stored value."""
    out = []
    if old.key != new.key:
        out.append(f"its key changed ({old.key} -> {new.key})")
    if old.window != new.window:
        out.append(f"its window changed ({_window_text(old.window)} -> "
                   f"{_window_text(new.window)})")
    kept = list(new.states)[:len(old.states)] == list(old.states)
    sketched = any(a.kind == "approx_count_distinct" for a in old.states.values())
    for name in sorted(old.states.keys() | new.states.keys()):
        before, after = old.states.get(name), new.states.get(name)
        if before is None:
            if not kept:
                out.append(f"aggregate {name!r} added, not after all of "
                           f"{', '.join(old.states)} (declare added aggregates last)")
            elif sketched:
                out.append(f"aggregate {name!r} added to an operator with an "
                           "approx_count_distinct (its stored sketches end each value)")
        elif after is None:
            out.append(f"aggregate {name!r} removed")
        elif before != after:
            out.append(f"aggregate {name!r} changed ({_aggregate_text(before)} -> "
                       f"{_aggregate_text(after)})")
    if not out and list(old.states) != list(new.states)[:len(old.states)]:
        # a stored row holds its values in the declared order (state_index)
        out.append(f"its aggregates are declared in another order ({', '.join(old.states)} "
                   f"-> {', '.join(new.states)}): declare them in the stored order")
    return out


def load_spec(storage: Storage, job: str, operator: str) -> OperatorSpec | None:
    path = paths.spec(job, operator)
    if not storage.exists(path):
        return None
    return OperatorSpec.from_json(storage.read_bytes(path))


def list_specs(storage: Storage) -> list[OperatorSpec]:
    specs = []
    for job in storage.list_dirs(paths.jobs_dir()):
        for op in storage.list_dirs(f"{paths.jobs_dir()}/{job}"):
            spec = load_spec(storage, job, op)
            if spec is not None:
                specs.append(spec)
    return specs
