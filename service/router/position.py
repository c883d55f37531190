"""Which batch of a job counted a Kafka record (docs/architecture.md §5: read your writes).

Each batch's manifest records where the batch ended in its source (Spark's offset log, each
partition's next offset to read): the batch that counted the record at ``offset`` is the
first whose end is past it. A producer that has the offset of its record from Kafka asks
``GET /v1/jobs/{job}/position``, then reads with ``min_batch`` set to the answer: exact, not
"wait a few seconds". Manifests older than the oldest snapshot are collected; a record older
than every manifest kept is answered with the oldest one's batch, a later batch that
counted it too (a safe ``min_batch``).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from qstate.core.address import check_name
from qstate.core.errors import InvalidRequest, NotFound, Unavailable, UnknownOperator
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.manifest import Offsets, read_manifest
from qstate.core.records.storage import Storage

__all__ = ["TOPIC_PATTERN", "Position", "batch_of_offset", "check_topic"]

# Kafka's own rule for a topic name (also what the OpenAPI document states)
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
_TOPIC = re.compile(TOPIC_PATTERN)


@dataclass(frozen=True, slots=True)
class Position:
    job: str
    topic: str
    partition: int
    offset: int
    batch: int  # the first recorded batch whose end is past ``offset``
    end_offset: int  # where that batch ended in the partition (exclusive)


def check_topic(topic: str) -> str:
    if not _TOPIC.fullmatch(topic):
        raise InvalidRequest(f"topic {topic[:100]!r}: a Kafka topic name is 1 to 249 of "
                             "A-Z a-z 0-9 . _ -")
    return topic


def _ends(storage: Storage, job: str, operator: str, batch: int) -> Offsets | None:
    """Where ``batch`` ended, or None when its manifest was collected meanwhile."""
    try:
        return read_manifest(storage, job, operator, batch).offsets
    except FileNotFoundError:
        return None


def _search(storage: Storage, job: str, operator: str, topic: str, partition: int,
            offset: int, retry_after_s: float) -> Position | None:
    batches = manifest_batches(storage, job, operator)
    if not batches:
        raise Unavailable(f"job {job} has recorded no batch yet", retry_after_s,
                          reason="behind")
    newest = _ends(storage, job, operator, batches[-1])
    if newest is None:
        return None  # collected under us: list again
    if topic not in newest:
        raise NotFound(f"job {job} reads {', '.join(sorted(newest)) or 'no Kafka topic'}, "
                       f"not {topic!r}", job=job)
    if partition not in newest[topic]:
        raise NotFound(f"topic {topic!r} has no partition {partition} that job {job} reads "
                       f"(it reads {len(newest[topic])})", job=job)
    if newest[topic][partition] <= offset:
        raise Unavailable(
            f"job {job} has not read offset {offset} of {topic}/{partition} yet: batch "
            f"{batches[-1]} ends at {newest[topic][partition]}", retry_after_s,
            reason="behind", batch=batches[-1])
    lo, hi = 0, len(batches) - 1  # batches[hi] ends past the offset
    ends = {hi: newest[topic][partition]}
    while lo < hi:
        mid = (lo + hi) // 2
        got = _ends(storage, job, operator, batches[mid])
        if got is None:
            return None
        end = got.get(topic, {}).get(partition, 0)
        if end > offset:
            hi, ends[mid] = mid, end
        else:
            lo = mid + 1
    return Position(job, topic, partition, offset, batches[hi], ends[hi])


async def batch_of_offset(storage: Storage, job: str, operators: list[str], topic: str,
                          partition: int, offset: int, retry_after_s: float) -> Position:
    """The batch of ``job`` that counted the record at ``offset`` of ``topic``/``partition``
    (every operator of a job reads the same batches: the first one's manifests say it).
    NotFound for a topic or partition the job does not read; Unavailable, with the batch it
    has, while the job has not read that far."""
    check_name("job", job)
    check_topic(topic)
    if partition < 0 or offset < 0:
        raise InvalidRequest("partition and offset are 0 or more")
    if not operators:
        raise UnknownOperator(f"unknown job {job!r}", job=job)
    for _ in range(3):  # a manifest collected while it was read: list again
        found = await asyncio.to_thread(_search, storage, job, min(operators), topic,
                                        partition, offset, retry_after_s)
        if found is not None:
            return found
    raise Unavailable(f"the manifests of job {job} changed while read", retry_after_s,
                      reason="behind")
