"""The installed package tree, drawn with symlinks: ``qstate/`` holds service/'s entries plus
``jobs`` and ``proto``, as pyproject.toml maps them (docs/architecture.md §10).

Tools that walk a package's folder instead of importing it (lint-imports' graph, mypy, protoc)
see qstate.jobs only through this tree: the editable install's import hook is invisible to
them. ``python -m tests.mirror DEST`` builds it (`make lint` uses .lint/)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pyproject.toml's [tool.setuptools.package-dir]: import name -> folder
FOLDERS = {"qstate": "service", "qstate/jobs": "jobs", "qstate/proto": "proto"}


def build(dest: Path) -> Path:
    """Build (or rebuild) the tree under ``dest``; returns ``dest``, the folder to put on
    PYTHONPATH."""
    top = dest / "qstate"
    if top.exists():
        shutil.rmtree(top)
    top.mkdir(parents=True)
    for entry in sorted((ROOT / FOLDERS["qstate"]).iterdir()):
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for name, folder in FOLDERS.items():
        if name != "qstate":
            (dest / name).symlink_to(ROOT / folder)
    return dest


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else ".lint").resolve()))
