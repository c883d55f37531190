"""Checkpoint storage: a local directory, or any pyarrow filesystem URI (s3://, hdfs://, gs://).

Paths given to ``Storage`` are relative to its root (``qstate.core.records.paths`` builds them).
Writes are atomic for readers: write to a temporary name in the same directory, then move,
so a reader never sees half a file and a re-run of a batch simply replaces its files.
``create`` writes only if nothing is there yet, for objects two writers may race for (a
job's next assignment epoch).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs

from qstate.core.records import paths

__all__ = ["Storage"]


@dataclass
class Storage:
    uri: str
    fs: pafs.FileSystem = field(init=False, repr=False)
    root: str = field(init=False)
    # False: a look that only reads (``qstate state inspect``) does not make the root
    make_root: bool = True

    def __post_init__(self) -> None:
        if "://" in self.uri:
            self.fs, self.root = pafs.FileSystem.from_uri(self.uri)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(self.uri)
        self.root = self.root.rstrip("/")
        if self.make_root:
            self.fs.create_dir(self.root, recursive=True)

    def root_exists(self) -> bool:
        return self.fs.get_file_info(self.root).type == pafs.FileType.Directory

    def full(self, path: str) -> str:
        """The filesystem path of ``path`` (relative to the root, and staying under it:
        CorruptState otherwise, before anything is read, written or deleted)."""
        return f"{self.root}/{paths.plain_path(path)}" if path else self.root

    def write_bytes(self, path: str, data: bytes) -> None:
        full = self.full(path)
        parent = full.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        try:
            with self.fs.open_output_stream(tmp) as out:
                out.write(data)
            self.fs.move(tmp, full)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(tmp)
            raise

    def create(self, path: str, data: bytes) -> bool:
        """Write ``path`` only if it does not exist; False (nothing written) if it did.

        On a local or mounted filesystem this is atomic: the whole file is written under a
        temporary name and hard-linked to ``path``, which fails when ``path`` exists, so of
        two racing writers exactly one wins. pyarrow's object-store filesystems offer no
        conditional PUT: there it checks, then writes, which narrows the race but does not
        close it (one coordinator per job is still the rule)."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            if self.exists(path):
                return False
            self.write_bytes(path, data)
            return True
        full = self.full(path)
        parent = full.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, full)
            except FileExistsError:
                return False
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(self.full(path)) as f:
            return f.read()

    def open_file(self, path: str) -> pa.NativeFile:
        """Random access (Arrow IPC files are read by seeking to their footer)."""
        return self.fs.open_input_file(self.full(path))

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(self.full(path)).type != pafs.FileType.NotFound

    def list_names(self, path: str) -> list[str]:
        """Names of the files directly under ``path`` (empty if it does not exist)."""
        sel = pafs.FileSelector(self.full(path), allow_not_found=True)
        return sorted(
            i.base_name for i in self.fs.get_file_info(sel)
            if i.type == pafs.FileType.File and not i.base_name.startswith(".")
        )

    def list_dirs(self, path: str) -> list[str]:
        sel = pafs.FileSelector(self.full(path), allow_not_found=True)
        return sorted(i.base_name for i in self.fs.get_file_info(sel)
                      if i.type == pafs.FileType.Directory and not i.base_name.startswith("."))

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.full(path))
