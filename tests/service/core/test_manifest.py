from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qstate.core.errors import DeltaMismatch
from qstate.core.records import paths
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.manifest import (
    BatchManifest,
    delete_manifests_through,
    read_manifest,
    write_manifest,
)
from qstate.core.records.storage import Storage

FAST = settings(max_examples=15, deadline=None)
manifests = st.builds(
    BatchManifest,
    batch=st.integers(0, 2**63 - 1),  # a Spark batch id is a long
    watermark_ms=st.integers(-(2**63), 2**63 - 1),
    deltas=st.dictionaries(st.integers(0, 4095), st.dictionaries(
        st.integers(0, 1000), st.integers(0, 2**40), min_size=1, max_size=4), max_size=20),
    offsets=st.dictionaries(st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True),
                            st.dictionaries(st.integers(0, 1000), st.integers(0, 2**62),
                                            max_size=4), max_size=3),
)


@FAST
@given(manifests)
def test_write_read_round_trip(m: BatchManifest) -> None:
    with tempfile.TemporaryDirectory() as d:
        s = Storage(d)
        write_manifest(s, "j", "op", m)
        back = read_manifest(s, "j", "op", m.batch)
        assert back == m
        assert all(isinstance(p, int) for p in back.deltas)  # JSON keys come back as ints
        assert manifest_batches(s, "j", "op") == [m.batch]


def test_manifest_file_is_plain_json_at_its_path(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    m = BatchManifest(7, 1000, {3: {0: 10, 2: 4}, 1: {1: 2}}, {"tw": {1: 40, 0: 17}})
    write_manifest(s, "j", "op", m)
    raw = orjson.loads(s.read_bytes(paths.manifest("j", "op", 7)))
    assert raw == {"batch": 7, "watermark_ms": 1000,
                   "deltas": {"1": {"1": 2}, "3": {"0": 10, "2": 4}},
                   "offsets": {"tw": {"0": 17, "1": 40}}}
    assert read_manifest(s, "j", "op", 7) == m
    # one written before offsets were recorded reads as none
    s.write_bytes(paths.manifest("j", "op", 8), orjson.dumps(
        {"batch": 8, "watermark_ms": 1, "deltas": {}}))
    assert read_manifest(s, "j", "op", 8).offsets == {}
    # offsets that are not topic -> partition -> integer: a DeltaMismatch naming the file
    s.write_bytes(paths.manifest("j", "op", 9), orjson.dumps(
        {"batch": 9, "watermark_ms": 1, "deltas": {}, "offsets": {"tw": {"0": "17"}}}))
    with pytest.raises(DeltaMismatch, match="not a batch manifest"):
        read_manifest(s, "j", "op", 9)


def test_rewriting_a_batch_replaces_its_manifest(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    write_manifest(s, "j", "op", BatchManifest(3, 1, {0: {0: 5}}))
    write_manifest(s, "j", "op", BatchManifest(3, 2, {}))  # the batch was re-run
    assert read_manifest(s, "j", "op", 3) == BatchManifest(3, 2, {})
    assert manifest_batches(s, "j", "op") == [3]


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_manifest(Storage(str(tmp_path)), "j", "op", 1)


def test_manifest_batches_sort_numerically(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    for b in (100, 9, 10, 0, 99):
        write_manifest(s, "j", "op", BatchManifest(b, 0, {}))
    assert manifest_batches(s, "j", "op") == [0, 9, 10, 99, 100]
    assert manifest_batches(s, "j", "other") == []
    assert manifest_batches(s, "other", "op") == []


@FAST
@given(st.sets(st.integers(0, 300), max_size=25), st.integers(-1, 310))
def test_delete_manifests_through(batches: set[int], through: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        s = Storage(d)
        for b in batches:
            write_manifest(s, "j", "op", BatchManifest(b, b * 10, {b % 4: {0: 1}}))
        write_manifest(s, "j", "op2", BatchManifest(0, 0, {}))  # another operator: untouched
        deleted = delete_manifests_through(s, "j", "op", through)
        assert deleted == sum(1 for b in batches if b <= through)
        kept = sorted(b for b in batches if b > through)
        assert manifest_batches(s, "j", "op") == kept
        for b in kept:
            assert read_manifest(s, "j", "op", b) == BatchManifest(b, b * 10, {b % 4: {0: 1}})
        assert manifest_batches(s, "j", "op2") == [0]
        assert delete_manifests_through(s, "j", "op", through) == 0  # nothing left to delete
