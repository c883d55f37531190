"""``batch_of_offset`` over manifests in real storage, against the batches that wrote them,
and ``batch_log`` over a Spark offset log as Spark writes it (end to end with a real
job: tests/jobs/test_position.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qstate.core.errors import InvalidRequest, NotFound, Unavailable, UnknownOperator
from qstate.core.records.manifest import BatchManifest, delete_manifests_through, write_manifest
from qstate.core.records.storage import Storage
from qstate.jobs.runtime.sinks import batch_log
from qstate.router.position import batch_of_offset

TOPIC = "tweets"


def record(storage: Storage, ends: list[dict[int, int]]) -> None:
    """Batch b ended at ``ends[b]`` (partition -> next offset), as the sink records it."""
    for b, end in enumerate(ends):
        write_manifest(storage, "j", "op", BatchManifest(b, 0, {}, {TOPIC: end}))


def ask(storage: Storage, partition: int, offset: int, ops: tuple[str, ...] = ("op",)
        ) -> tuple[int, int]:
    p = asyncio.run(batch_of_offset(storage, "j", list(ops), TOPIC, partition, offset, 1.0))
    return p.batch, p.end_offset


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=12),
       st.integers(0, 40))
def test_the_batch_is_the_first_that_read_past_the_offset(steps: list[tuple[int, int]],
                                                          offset: int) -> None:
    import tempfile

    ends, a, b = [], 0, 0
    for da, db in steps:  # each batch reads on from where the last one ended
        a, b = a + da, b + db
        ends.append({0: a, 1: b})
    with tempfile.TemporaryDirectory() as d:
        s = Storage(d)
        record(s, ends)
        for partition in (0, 1):
            want = next((i for i, e in enumerate(ends) if e[partition] > offset), None)
            if want is None:
                with pytest.raises(Unavailable, match="has not read offset"):
                    ask(s, partition, offset)
            else:
                assert ask(s, partition, offset) == (want, ends[want][partition])


def test_older_than_the_manifests_kept_answers_the_oldest_kept(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    record(s, [{0: 10}, {0: 20}, {0: 30}, {0: 40}])
    assert ask(s, 0, 5) == (0, 10)
    delete_manifests_through(s, "j", "op", 1)  # collected: 0 and 1 are gone
    assert ask(s, 0, 5) == (2, 30)  # a later batch, which counted it too
    assert ask(s, 0, 25) == (2, 30)
    assert ask(s, 0, 30) == (3, 40)


def test_what_the_job_does_not_read_is_a_404_and_bad_input_a_400(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    with pytest.raises(Unavailable, match="no batch yet"):
        ask(s, 0, 0)
    record(s, [{0: 10, 1: 3}])
    with pytest.raises(NotFound, match="reads tweets, not 'other'"):
        asyncio.run(batch_of_offset(s, "j", ["op"], "other", 0, 0, 1.0))
    with pytest.raises(NotFound, match="no partition 7"):
        ask(s, 7, 0)
    with pytest.raises(UnknownOperator):
        ask(s, 0, 0, ops=())
    for topic, partition, offset in (("a b", 0, 0), ("t" * 250, 0, 0), (TOPIC, -1, 0),
                                     (TOPIC, 0, -5)):
        with pytest.raises(InvalidRequest):
            asyncio.run(batch_of_offset(s, "j", ["op"], topic, partition, offset, 1.0))


def test_batch_log_reads_the_watermark_and_kafka_lines_of_sparks_offset_log(
        tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_bytes(b"\n".join([
        b"v1",
        orjson.dumps({"batchWatermarkMs": 5, "batchTimestampMs": 6, "conf": {}}),
        orjson.dumps({"tweets": {"1": 250, "0": 240}}),
        b'"not a kafka source"',
        b"{not json",
    ]))
    assert batch_log(str(tmp_path), 4) == (5, {"tweets": {0: 240, 1: 250}})
