from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from qstate.core.records.storage import Storage


def all_files(root: Path) -> list[str]:
    """Every file under ``root``, hidden ones included, relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_root_is_created_and_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Storage("rel/store")
    assert s.root == str(tmp_path / "rel" / "store")
    assert (tmp_path / "rel" / "store").is_dir()
    assert Storage(f"{tmp_path}/other/").root == f"{tmp_path}/other"  # trailing slash dropped


def test_full_joins_relative_paths_under_the_root(tmp_path: Path) -> None:
    s = Storage(str(tmp_path / "s"))
    assert s.full("") == str(tmp_path / "s")
    assert s.full("a/b.json") == str(tmp_path / "s" / "a" / "b.json")


def test_relative_paths_resolve_under_root(tmp_path: Path) -> None:
    s = Storage(str(tmp_path / "s"))
    s.write_bytes("jobs/j/op/batches/1.json", b"payload")
    assert (tmp_path / "s" / "jobs" / "j" / "op" / "batches" / "1.json").read_bytes() == b"payload"
    (tmp_path / "s" / "made-outside.bin").write_bytes(b"\x00\x01")
    assert s.read_bytes("made-outside.bin") == b"\x00\x01"


def test_write_read_round_trip_and_overwrite(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    data = bytes(range(256)) * 1000
    s.write_bytes("d/x.bin", data)
    assert s.read_bytes("d/x.bin") == data
    s.write_bytes("d/x.bin", b"short")  # a shorter file must not keep the old tail
    assert s.read_bytes("d/x.bin") == b"short"
    s.write_bytes("d/empty", b"")
    assert s.read_bytes("d/empty") == b""
    assert all_files(tmp_path) == ["d/empty", "d/x.bin"]  # no temporary files left behind


def test_a_write_that_fails_before_the_move_leaves_the_old_file(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    s.write_bytes("f.json", b"old")

    class NoMove:
        def __init__(self, fs: pafs.FileSystem) -> None:
            self.fs = fs

        def __getattr__(self, name: str) -> Any:
            return getattr(self.fs, name)

        def move(self, src: str, dst: str) -> None:
            raise OSError("crash before the rename")

    s.fs = NoMove(s.fs)  # type: ignore[assignment]
    with pytest.raises(OSError, match="crash"):
        s.write_bytes("f.json", b"new content that never lands")
    assert (tmp_path / "f.json").read_bytes() == b"old"
    assert s.list_names("") == ["f.json"]  # the orphaned temporary name stays hidden


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    versions = [b"a" * 300_000, b"b" * 200_000]
    s.write_bytes("hot.bin", versions[0])
    seen: set[bytes] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(s.read_bytes("hot.bin"))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(60):
            s.write_bytes("hot.bin", versions[i % 2])
    finally:
        stop.set()
        reader.join()
    assert seen <= set(versions)
    assert all_files(tmp_path) == ["hot.bin"]


def test_missing_files_raise_file_not_found(tmp_path: Path) -> None:
    # callers (assignment.list_servers, delta.read_delta) rely on exactly this exception
    s = Storage(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        s.read_bytes("nope.json")
    with pytest.raises(FileNotFoundError):
        s.open_file("nope.arrow")


def test_open_file_allows_random_access(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    s.write_bytes("f.bin", b"0123456789")
    with s.open_file("f.bin") as f:
        assert f.size() == 10
        f.seek(7)
        assert f.read(3) == b"789"


def test_exists(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    assert not s.exists("a/b.json")
    s.write_bytes("a/b.json", b"{}")
    assert s.exists("a/b.json")
    assert s.exists("a")  # a directory exists too
    assert not s.exists("a/c.json")


def test_list_names_files_only_hidden_excluded_sorted(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    for n in ["b.json", "a.json", "10.json", "9.json", ".tmp-123", ".hidden.json"]:
        s.write_bytes(f"d/{n}", b"x")
    s.write_bytes("d/sub/inner.json", b"x")
    s.write_bytes("d/.hdir/inner.json", b"x")
    assert s.list_names("d") == sorted(["b.json", "a.json", "10.json", "9.json"])
    assert s.list_names("d/sub") == ["inner.json"]
    assert s.list_names("missing") == []


def test_list_dirs_dirs_only_hidden_excluded_sorted(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    for d in ["zeta", "alpha", "m", ".hidden"]:
        s.write_bytes(f"jobs/{d}/f", b"x")
    s.write_bytes("jobs/file.json", b"x")
    assert s.list_dirs("jobs") == ["alpha", "m", "zeta"]
    assert s.list_dirs("jobs/alpha") == []
    assert s.list_dirs("missing") == []


def test_delete(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    s.write_bytes("d/a", b"1")
    s.write_bytes("d/b", b"2")
    s.delete("d/a")
    assert not s.exists("d/a")
    assert s.list_names("d") == ["b"]
    s.delete("d/a")  # already gone: fine
    s.delete("never/was/here")
    assert s.read_bytes("d/b") == b"2"


def test_uri_storage_uses_the_uri_filesystem(tmp_path: Path) -> None:
    local = Storage(f"file://{tmp_path}/viauri")
    local.write_bytes("x/y.json", b"1")
    assert (tmp_path / "viauri" / "x" / "y.json").read_bytes() == b"1"

    mem = Storage("mock:///bucket/prefix/")  # an in-memory, non-local pyarrow filesystem
    assert not isinstance(mem.fs, pafs.LocalFileSystem)
    assert mem.root == "bucket/prefix"
    mem.write_bytes("jobs/j/assignment.json", b"{}")
    mem.write_bytes("jobs/j/.tmp-x", b"")
    assert mem.read_bytes("jobs/j/assignment.json") == b"{}"
    assert mem.list_names("jobs/j") == ["assignment.json"]
    assert mem.list_dirs("jobs") == ["j"]
    mem.delete("jobs/j/assignment.json")
    assert not mem.exists("jobs/j/assignment.json")


@pytest.mark.parametrize("path", ["../outside", "a/../../outside", "/etc/passwd", "a//b",
                                  "a/./b", "a\\..\\b", "a/\x00b", "a/b/", ".."])
def test_a_path_that_would_leave_the_root_is_refused_before_any_io(tmp_path: Path,
                                                                   path: str) -> None:
    """Names come back from storage (a snapshot's file list): none may reach outside."""
    from qstate.core.errors import CorruptState

    outside = tmp_path / "outside"
    outside.write_bytes(b"mine")
    s = Storage(str(tmp_path / "store"))
    for op in (lambda: s.read_bytes(path), lambda: s.write_bytes(path, b"x"),
               lambda: s.delete(path), lambda: s.exists(path), lambda: s.create(path, b"x"),
               lambda: s.list_names(path)):
        with pytest.raises(CorruptState, match="not a plain relative path under its root"):
            op()
    assert outside.read_bytes() == b"mine"
    assert all_files(tmp_path) == ["outside"]
