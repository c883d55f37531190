"""Addresses and partitioning, shared by the job, the shards and the router
(docs/architecture.md §2). The router's read engine has the same rules
(``engine/core/src/address.rs``): ``tests/vectors/address.json`` pins both to the same
partitions, names, keys and messages.

A piece of state is addressed ``/{job}/{operator}/{state}/{key}``. Names are
``[A-Za-z0-9_.-]{1,64}`` not starting with a dot or a dash (they name folders on storage:
``..`` must never be one); a key is any non-empty UTF-8 string of at most 1 KiB. A key lives in
partition ``pmod(xxhash64(utf8(key), seed=42), P)`` of its operator: exactly Spark SQL's
``pmod(xxhash64(key), P)`` for a string column, so the job computes it in the JVM and
everyone else here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import xxhash

from qstate.core.errors import InvalidAddress

__all__ = ["MAX_KEY_BYTES", "NAME_PATTERN", "SEED", "PartitionId", "check_key", "check_name",
           "partition_of", "quoted"]

SEED = 42
MAX_KEY_BYTES = 1024
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def partition_of(key: str, partitions: int) -> int:
    """``pmod(xxhash64(utf8(key), seed=42), partitions)`` on the signed 64-bit hash."""
    h = xxhash.xxh64_intdigest(key.encode("utf-8"), seed=SEED)
    if h >= 1 << 63:
        h -= 1 << 64
    return h % partitions  # Python's % is already non-negative for a positive modulus


def quoted(value: str, n: int) -> str:
    """``value`` shown in a message: its first ``n`` characters as a JSON string (the read
    engine quotes the same way: ``tests/vectors/address.json``)."""
    return json.dumps(value[:n], ensure_ascii=False)


def check_name(kind: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise InvalidAddress(
            f"invalid {kind} {quoted(value, 80)}: use 1-64 characters from A-Z a-z 0-9 _ . - "
            "(not starting with . or -)"
        )
    return value


def check_key(key: str) -> str:
    if not key:
        raise InvalidAddress(f"empty key: a key is 1 to {MAX_KEY_BYTES} bytes of UTF-8")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, e.g. "\ud800" in a JSON body
        raise InvalidAddress("key is not valid Unicode (a lone UTF-16 surrogate): send it as "
                             "UTF-8") from None
    if size > MAX_KEY_BYTES:
        raise InvalidAddress(f"key is {size} bytes of UTF-8; at most {MAX_KEY_BYTES} are allowed")
    return key


@dataclass(frozen=True, order=True)
class PartitionId:
    """One partition of one operator: the unit that is owned, committed, snapshotted, moved."""

    job: str
    operator: str
    partition: int

    def __str__(self) -> str:
        return f"{self.job}/{self.operator}/{self.partition}"
