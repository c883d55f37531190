"""The read engine (docs/architecture.md §5): Rust, in the crate engine/, installed by its own
distribution ``qstate-engine`` (which ``qstate[server]`` requires) as the extension module
``qstate_engine``. qstate imports it from here, as ``qstate._engine``; its types are in
``_engine.pyi`` beside this file.

A read that must wait (for a shard, a catch-up, ``min_batch``) settles an asyncio future from
an engine thread: ``answer`` awaits it. Every failure is a ``qstate.errors`` class, a panic in
the engine included (``EngineFailed``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from qstate_engine import (
    LATENCY_BUCKETS,
    LOOKUP_BUCKETS,
    MIN_BATCH_POLL_S,
    Engine,
    Principal,
    answer_json,
    decode_value,
    parse_time,
    read_partition,
    read_route,
    state_value,
)

__all__ = ["LATENCY_BUCKETS", "LOOKUP_BUCKETS", "MIN_BATCH_POLL_S", "Engine", "Principal",
           "answer", "answer_json", "decode_value", "parse_time", "read_partition", "read_route",
           "state_value"]

T = TypeVar("T")


async def answer(call: Callable[[Any, Any], T | None]) -> T:
    """``call(loop, future)``: the engine's answer now, or None and ``future`` settled with it
    from an engine thread (a result, or the qstate error it raised)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    now = call(loop, fut)
    if now is not None:
        return now
    return await fut
