"""A window's value in a protobuf message (``proto/shard.proto`` and ``proto/qstate.proto``
both carry it in a ``value`` oneof of ``int_value``/``double_value``). The value is typed once,
by its aggregate's declared type (``Aggregate.typed``); these two functions only carry it."""

from __future__ import annotations

from typing import Any

__all__ = ["set_value", "value_of"]


def set_value(window: Any, value: int | float | None) -> None:
    """Put a typed value into a message's oneof; None (no value yet) leaves it unset."""
    if isinstance(value, int):
        window.int_value = value
    elif value is not None:
        window.double_value = value


def value_of(window: Any) -> int | float | None:
    kind = window.WhichOneof("value")
    if kind == "int_value":
        return int(window.int_value)
    if kind == "double_value":
        return float(window.double_value)
    return None
