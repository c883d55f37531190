"""Addresses and partitioning, shared by the job, the shards and the router (DESIGN §2)."""

from __future__ import annotations

import re

import xxhash

SEED = 42
MAX_KEY_BYTES = 1024
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class InvalidAddress(ValueError):
    """A name or key that DESIGN §2 does not allow; the message says what is allowed."""


def partition_of(key: str, partitions: int) -> int:
    """``pmod(xxhash64(utf8(key), seed=42), partitions)`` on the signed 64-bit hash.

    Identical to Spark SQL ``pmod(xxhash64(key), partitions)`` for string keys, which is
    what the job computes in the JVM; the router computes it here.
    """
    h = xxhash.xxh64_intdigest(key.encode("utf-8"), seed=SEED)
    if h >= 1 << 63:
        h -= 1 << 64
    return h % partitions  # Python's % is already non-negative for a positive modulus


def check_name(kind: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise InvalidAddress(
            f"invalid {kind} {value[:80]!r}: use 1-64 characters from A-Z a-z 0-9 _ . -"
        )
    return value


def check_key(key: str) -> str:
    size = len(key.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise InvalidAddress(f"key is {size} bytes of UTF-8; at most {MAX_KEY_BYTES} are allowed")
    return key
