"""The checked-in Python stubs are exactly what `make proto` generates from proto/*.proto, as
the package qstate.proto (docs/architecture.md §10)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted(p.name for p in (ROOT / "proto").glob("*.proto"))


@pytest.mark.parametrize("name", PROTOS)
def test_checked_in_stubs_match_the_proto(name: str, tmp_path: Path) -> None:
    out = tmp_path / "qstate" / "proto"
    out.mkdir(parents=True)
    shutil.copy(ROOT / "proto" / name, out / name)
    rc = protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                      f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", str(out / name)])
    assert rc == 0
    stem = name.removesuffix(".proto")
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
        generated = (out / f"{stem}{suffix}").read_text()
        checked_in = (ROOT / "proto" / f"{stem}{suffix}").read_text()
        assert checked_in == generated, f"proto/{stem}{suffix} is stale: run `make proto`"
