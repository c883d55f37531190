"""``qstate.jobs`` is one face (docs/architecture.md §1): every name a job imports comes from
the library (never the runtime), type checkers and the interpreter see the same names, and
importing the package, the runtime's metrics or the examples' workloads (``qstate --help``
does) starts no PySpark; shards and routers import nothing of ``qstate.jobs``."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import qstate.jobs as face

INIT = Path(face.__file__)


def loaded_after(*modules: str) -> list[str]:
    """The modules a fresh interpreter holds after importing ``modules``."""
    code = f"import json, sys; import {', '.join(modules)}; print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(run.stdout)


def typed_names() -> dict[str, str]:
    """What the TYPE_CHECKING block imports: name -> library module."""
    block = next(n for n in ast.parse(INIT.read_text()).body
                 if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {a.asname or a.name: node.module for node in block.body
            if isinstance(node, ast.ImportFrom) and node.module for a in node.names}


@pytest.mark.parametrize("name", face.__all__)
def test_each_name_is_the_librarys_own(name: str) -> None:
    value = getattr(face, name)
    home = typed_names()[name]
    assert not home.startswith("qstate.jobs.runtime")
    assert getattr(importlib.import_module(home), name) is value


def test_type_checkers_and_the_interpreter_see_the_same_face() -> None:
    assert sorted(typed_names()) == sorted(face.__all__)
    assert set(face.__all__) <= set(dir(face))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        face.nothing_here  # noqa: B018


def test_the_face_the_runtime_and_the_command_start_no_spark() -> None:
    loaded = loaded_after("qstate.jobs", "qstate.jobs.runtime.metrics",
                          "qstate.jobs.examples.workloads", "qstate.cli")
    assert "qstate.jobs.examples.workloads" in loaded
    assert not [m for m in loaded if m.split(".")[0] == "pyspark"]


def test_shards_and_routers_import_nothing_of_the_jobs() -> None:
    loaded = loaded_after("qstate.shard.main", "qstate.router.main")
    assert "qstate.router.main" in loaded
    assert not [m for m in loaded if m == "qstate.jobs" or m.startswith("qstate.jobs.")
                or m.split(".")[0] == "pyspark"]
