"""What a Feast feature view means in qstate, and back (docs/feast.md): an entity key is a
qstate key, a feature a state of one operator, a value a ``ValueProto`` of the feature's
declared type, a row's event timestamp its window's end. Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from feast.feature_view import FeatureView
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.value_type import ValueType

from qstate.core.answer import JobInfo, OperatorInfo, WindowValue
from qstate.core.errors import InvalidRequest
from qstate.feast.config import ViewSource

__all__ = ["KEY_TYPES", "STATE_TYPES", "closed_start", "event_time", "key_of", "problems",
           "value_proto"]

# a state's type (GET /v1/jobs/{job}) -> the one Feast dtype that holds it exactly
STATE_TYPES = {"long": ValueType.INT64, "double": ValueType.DOUBLE}
# an entity's value type -> how its value becomes a qstate key (docs/architecture.md §2: a
# key is a UTF-8 string): a string as is, an int64 as its decimal string, never Feast's
# serialize_entity_key (qstate keys are what the job grouped by, not Feast's bytes)
KEY_TYPES = {ValueType.STRING: "string_val", ValueType.INT64: "int64_val"}


def key_of(entity_key: EntityKeyProto) -> str:
    """The qstate key of a one-join-key entity key."""
    if len(entity_key.entity_values) != 1:
        raise InvalidRequest(f"an entity key of {len(entity_key.entity_values)} join keys "
                             f"({list(entity_key.join_keys)}): a qstate key is one value")
    v = entity_key.entity_values[0]
    kind = v.WhichOneof("val")
    if kind == "string_val":
        return v.string_val
    if kind == "int64_val":
        return str(v.int64_val)
    raise InvalidRequest(f"join key {entity_key.join_keys[0]!r} holds a {kind or 'null'}: a "
                         "qstate key is a string (string_val) or an int64 (its decimal digits)")


def value_proto(value: int | float | None, kind: ValueType) -> ValueProto:
    """A state's value as the feature's declared type; no value (an empty aggregate: a min of
    nothing, an average of no rows): an empty ValueProto."""
    if value is None:
        return ValueProto()
    if kind == ValueType.INT64:
        return ValueProto(int64_val=int(value))
    return ValueProto(double_val=float(value))


def event_time(window: WindowValue | None, watermark: int) -> datetime:
    """A row's event timestamp: its window's end. A window's value counts the events before its
    end; from then on nothing can be added to it, so its age (what a feature view's ``ttl``
    bounds) runs from there. The start would age a window by its whole size before it even
    closed: an hourly window with a one-hour ttl would be stale the moment it is final. A
    state without windows: the watermark its value is as of."""
    end = window["end"] if window is not None else None
    return _utc(end if end is not None else watermark)


@lru_cache(maxsize=4096)
def _utc(ms: int) -> datetime:
    # a call's keys share a few window ends: a datetime made once each (datetimes are
    # immutable), not once a key
    return datetime.fromtimestamp(ms / 1000, UTC)


def is_stale(at: datetime, ttl: timedelta | None, now: datetime) -> bool:
    """Older than the feature view's ``ttl`` (None or 0: never). Feast 0.67 applies no ttl to
    online reads itself, so the store does."""
    return bool(ttl) and at < now - ttl  # type: ignore[operator]


def closed_start(watermark: int, op: OperatorInfo) -> int:
    """The start of the newest window of ``op``'s grid whose end is at or before
    ``watermark``: the last closed window (Spark's windows start at multiples of the slide)."""
    size = op.window.size_ms
    slide = op.window.slide_ms or size
    return (watermark - size) // slide * slide


def problems(table: FeatureView, source: ViewSource | None, jobs: set[str],
             job: JobInfo | None) -> list[str]:
    """What stops qstate from serving ``table`` as ``source`` maps it, each said with what to
    change; [] when it can. ``jobs``: the jobs the router serves; ``job``: the mapped one,
    described (None: not served)."""
    name = table.name
    if source is None:
        return [f"feature view {name!r} is not mapped: add online_store.feature_views.{name} "
                "(job, operator) to feature_store.yaml"]
    out = _key_problems(table)
    if job is None:
        return [*out, f"feature view {name!r}: job {source.job!r} is not served by the router "
                      f"(it serves {sorted(jobs)})"]
    op = next((o for o in job.operators if o.name == source.operator), None)
    if op is None:
        return [*out, f"feature view {name!r}: job {source.job!r} has no operator "
                      f"{source.operator!r} (it has {sorted(o.name for o in job.operators)})"]
    if source.window == "closed" and op.window.kind not in ("tumbling", "sliding"):
        out.append(f"feature view {name!r}: window 'closed' needs a tumbling or sliding "
                   f"window; {source.job}/{source.operator} is {op.window.kind!r} (use "
                   "window: latest)")
    types = {s.name: s.type for s in op.states}
    for f in table.features:
        state = source.state_of(f.name)
        if state not in types:
            out.append(f"feature view {name!r}: feature {f.name!r} reads state {state!r}, "
                       f"which {source.job}/{source.operator} does not have (it has "
                       f"{sorted(types)})")
            continue
        want = STATE_TYPES.get(types[state])
        if f.dtype.to_value_type() != want:
            out.append(f"feature view {name!r}: feature {f.name!r} is declared "
                       f"{f.dtype}, but state {state!r} is {types[state]}: declare it "
                       f"{_dtype_name(want)}")
    return out


def _key_problems(table: FeatureView) -> list[str]:
    keys: Sequence[Any] = table.entity_columns
    if len(keys) != 1:
        return [f"feature view {table.name!r} has {len(keys)} join keys "
                f"({[k.name for k in keys]}): a qstate key is one value, so a feature view "
                "over qstate has exactly one"]
    kind = keys[0].dtype.to_value_type()
    if kind not in KEY_TYPES:
        return [f"feature view {table.name!r}: join key {keys[0].name!r} is {keys[0].dtype}; "
                "a qstate key is a String or an Int64 (its decimal digits)"]
    return []


def _dtype_name(kind: ValueType | None) -> str:
    return {ValueType.INT64: "Int64", ValueType.DOUBLE: "Float64"}.get(kind, str(kind))  # type: ignore[arg-type]
