from __future__ import annotations

import string
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qstate.core.address import PartitionId
from qstate.partition.files import (
    MARKER,
    partition_dir,
    read_marker,
    remove_marker,
    write_marker,
)


def test_partition_dir_layout(tmp_path: Path) -> None:
    d = partition_dir(tmp_path / "s0", PartitionId("ads", "per_campaign", 7))
    assert d == tmp_path / "s0" / "ads" / "per_campaign" / "p00007"
    names = [partition_dir(tmp_path, PartitionId("j", "o", p)).name for p in (100, 9, 10)]
    assert sorted(names) == [names[1], names[2], names[0]]  # sorts as the numbers do


def test_write_read_remove(tmp_path: Path) -> None:
    write_marker(tmp_path, "a1b2c3", 41)
    assert read_marker(tmp_path) == ("a1b2c3", 41)
    write_marker(tmp_path, "a1b2c3", 42)  # after every commit
    assert read_marker(tmp_path) == ("a1b2c3", 42)
    write_marker(tmp_path, "ffff00", 7)  # a new incarnation (restored), older batch
    assert read_marker(tmp_path) == ("ffff00", 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER]  # no temporary file left
    remove_marker(tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        read_marker(tmp_path)
    remove_marker(tmp_path)  # already gone: fine


def test_read_without_marker_or_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_marker(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_marker(tmp_path / "moved-away")


tokens = st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=1, max_size=32)


@settings(max_examples=25, deadline=None)
@given(tokens, st.integers(-1, 2**63 - 1))
def test_marker_round_trip(token: str, batch: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        write_marker(Path(d), token, batch)
        assert read_marker(Path(d)) == (token, batch)

