"""The parameters the HTTP routes share, as the OpenAPI document states them: names and keys
(docs/architecture.md §2), times, ``limit``, ``min_batch``, ``savepoint``, and the batch
reads' bodies. What a value may be is checked where it is used: by the read core for the read
routes (``qstate._engine``), by FastAPI against these for the others; the time pattern is held
to the core's parser by ``tests/vectors/times.json``."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BaseModel, Field

from qstate.core.address import MAX_KEY_BYTES, NAME_PATTERN

__all__ = [
    "TIME_DOC",
    "TIME_PATTERN",
    "AllowStale",
    "BatchGetIn",
    "From",
    "Key",
    "Name",
    "StatesBatchGetIn",
    "To",
    "limit_param",
    "min_batch_param",
    "savepoint_param",
]

# A time in a query: epoch milliseconds (Grafana's ${__from}), relative to now (now, now-1h,
# now+5m; a "+" left unencoded arrives as a space), or an ISO-8601 date or time (naive: UTC).
_ISO = (r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
        r"(?:T(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\.[0-9]{1,6})?)?"
        r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?)?")
_SPACE = r"[ \t\n\x0b\x0c\r]*"  # ASCII whitespace around a time is allowed
TIME_PATTERN = (rf"^{_SPACE}(?:-?[0-9]{{1,19}}|now(?:[-+ ][0-9]{{1,12}}(?:ms|s|m|h|d|w))?|"
                rf"{_ISO}){_SPACE}$")
re.compile(TIME_PATTERN)
TIME_DOC = ("epoch milliseconds (at most 19 digits), an ISO-8601 date or time (naive: UTC), "
            "or relative to now: now, now-1h, now+5m (units ms s m h d w)")

KeyItem = Annotated[str, Field(min_length=1, max_length=MAX_KEY_BYTES)]


class BatchGetIn(BaseModel):
    # the cap is this router's max_batch_keys, stated in the document by ``app.openapi``
    keys: list[KeyItem] = Field(description=f"Each 1 to {MAX_KEY_BYTES} bytes of UTF-8")
    model_config = {"extra": "forbid",
                    "json_schema_extra": {"examples": [{"keys": ["tw-1", "tw-2", "tw-404"]}]}}


class StatesBatchGetIn(BaseModel):
    # keys × states is bounded by this router's max_batch_keys
    keys: list[KeyItem] = Field(description=f"Each 1 to {MAX_KEY_BYTES} bytes of UTF-8")
    states: list[str] = Field(description="States of the operator, each named once; every "
                              "key is answered in each, in this order")
    model_config = {"extra": "forbid", "json_schema_extra": {"examples": [
        {"keys": ["tw-1", "tw-404"], "states": ["impressions", "clicks"]}]}}


Name = Annotated[str, Path(pattern=NAME_PATTERN, description="1 to 64 characters of "
                           "A-Z a-z 0-9 _ . -, not starting with . or -")]
Key = Annotated[str, Path(min_length=1, max_length=MAX_KEY_BYTES,
                          description=f"The grouping key: 1 to {MAX_KEY_BYTES} bytes of UTF-8 "
                          "(URL-encoded; a non-ASCII character counts 2-4 bytes)")]
From = Annotated[str | None, Query(alias="from", description=f"Windows starting at or after: "
                                   f"{TIME_DOC}. With neither from nor to: the latest window",
                                   examples=["2026-01-01T10:00:00Z"],
                                   json_schema_extra={"pattern": TIME_PATTERN})]
To = Annotated[str | None, Query(description=f"Windows starting before (exclusive): "
                                 f"{TIME_DOC}; must be after from", examples=["now"],
                                 json_schema_extra={"pattern": TIME_PATTERN})]

# the read core parses it (engine/core/src/http/mod.rs, `flag`) as pydantic reads a bool
AllowStale = Annotated[bool, Query(description="When a partition's owner cannot answer "
                                   "(down, restoring, moving), a follower of it (an operator "
                                   "with replicas) may, as of its own batch: the answer's "
                                   "batch says which. Unset: that read is 503 + Retry-After "
                                   "until the owner, or its successor, answers")]


def limit_param(most: int) -> Any:
    """``limit`` under this router's max_windows (a default, not an Annotated alias: it states
    the bound this router enforces)."""
    return Query(None, ge=1, le=most, description=f"Most windows per key in a range answer "
                 f"(default and most: {most}, QSTATE_MAX_WINDOWS). An answer cut short carries "
                 "next_from: ask again with from=next_from for the next page")


def min_batch_param(wait_s: float) -> Any:
    return Query(None, ge=0, description="Read your writes: answer as of this batch or a "
                 f"later one, waiting up to {wait_s:g} s (QSTATE_MIN_BATCH_WAIT_S) for the "
                 "partitions read to have it; then 503 + Retry-After naming the batch they "
                 "have. Every answer carries the batch it reflects")


def savepoint_param() -> Any:
    return Query(None, pattern=NAME_PATTERN, description="Answer as of this savepoint of the "
                 "job (`qstate savepoint create`), its batch in the answer; the first read of a "
                 "partition opens it on its shard server and answers 503 + Retry-After "
                 "meanwhile. Not with min_batch")
