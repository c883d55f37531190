"""Checkpoint storage: where delta files, operator specs and the assignment live.

A local directory by default; any pyarrow filesystem URI (s3://, hdfs://, gs://) works the
same. Writes are atomic for readers: write to a temporary name, then move, so a shard never
reads half a delta file and a re-run of a batch simply replaces the file.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, field

import pyarrow.fs as pafs


@dataclass
class Storage:
    uri: str
    fs: pafs.FileSystem = field(init=False, repr=False)
    root: str = field(init=False)

    def __post_init__(self) -> None:
        if "://" in self.uri:
            self.fs, self.root = pafs.FileSystem.from_uri(self.uri)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(self.uri)
        self.root = self.root.rstrip("/")
        self.fs.create_dir(self.root, recursive=True)

    def path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def write_bytes(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, path)

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def list_names(self, path: str) -> list[str]:
        """Names of the files directly under ``path`` (empty if it does not exist)."""
        sel = pafs.FileSelector(path, allow_not_found=True)
        return sorted(
            i.base_name for i in self.fs.get_file_info(sel)
            if i.type == pafs.FileType.File and not i.base_name.startswith(".")
        )

    def list_dirs(self, path: str) -> list[str]:
        sel = pafs.FileSelector(path, allow_not_found=True)
        return sorted(i.base_name for i in self.fs.get_file_info(sel)
                      if i.type == pafs.FileType.Directory and not i.base_name.startswith("."))

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)
