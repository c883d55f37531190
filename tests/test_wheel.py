"""One import namespace (docs/architecture.md §10): the wheel installs ``qstate`` and nothing
else, so a user's own ``jobs`` and ``proto`` packages live beside it; a reader needs only the
base install.

The wheel is built from this tree and installed without dependencies into a fresh venv that
borrows the dependencies of the project's venv (a .pth line), so nothing is downloaded."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"service": "qstate", "jobs": "qstate/jobs", "proto": "qstate/proto"}
SERVER_ONLY = ("pyspark", "rocksdict", "confluent_kafka", "pyarrow", "pandas", "fastapi",
               "uvicorn", "xxhash", "datasketches")


def run(*args: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                          check=False, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", *FOLDERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name)
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "--quiet", "-w", out, src)
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("qstate-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    home = tmp_path_factory.mktemp("venv")
    assert run(sys.executable, "-m", "venv", home).returncode == 0
    installed = run(home / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-index", wheel)
    assert installed.returncode == 0, installed.stderr
    # the dependencies, from the project's venv; its editable qstate stays out (the .pth
    # files of a folder named in a .pth line are not read)
    purelib = Path(run(home / "bin" / "python", "-c",
                       "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return home


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's project with packages of their own named ``jobs`` and ``proto``."""
    home = tmp_path_factory.mktemp("user")
    for name in ("jobs", "proto"):
        (home / name).mkdir()
        (home / name / "__init__.py").write_text(f"OWNER = 'the user: {name}'\n")
    return home


def test_the_wheel_holds_qstate_only_and_every_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"qstate"}
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            inside = init.relative_to(ROOT / folder).as_posix()
            assert f"{package}/{inside}" in names, f"{init} is not in the wheel"
    assert "qstate/router/ui/index.html" in names


def test_qstate_runs_beside_a_users_jobs_and_proto(venv: Path, user: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(user)}
    helped = run(venv / "bin" / "qstate", "--help", cwd=user, env=env)
    assert helped.returncode == 0, helped.stderr
    assert "Usage" in helped.stdout
    code = ("import json, jobs, proto; from qstate import Client, AsyncClient; "
            "from qstate.errors import NotFound, QStateError; import qstate.jobs.launch, "
            "qstate.proto.shard_pb2, qstate.cli, importlib.util; "
            "print(json.dumps([jobs.OWNER, proto.OWNER, Client.__module__, "
            "issubclass(NotFound, QStateError), qstate.jobs.launch.__file__, "
            "importlib.util.find_spec('loadtest') is None]))")
    got = run(venv / "bin" / "python", "-c", code, cwd=user, env=env)
    assert got.returncode == 0, got.stderr
    owners_j, owners_p, client_module, is_error, launch_file, no_loadtest = json.loads(got.stdout)
    assert (owners_j, owners_p) == ("the user: jobs", "the user: proto")
    assert client_module == "qstate.client" and is_error and no_loadtest
    assert launch_file.startswith(str(venv)), launch_file  # the wheel's, not this tree's


# The third-party modules the client's own qstate modules import (read from their source, so
# a dependency's optional imports do not count) and whether the base install (its
# requirements without extras) names each one's distribution
CLIENT_NEEDS = """
import ast, json, re, sys
from importlib import metadata
import qstate.client, qstate.errors
def norm(n): return re.sub(r'[-_.]+', '-', n).lower()
ours = [m for n, m in list(sys.modules.items()) if n.split('.')[0] == 'qstate']
imported = set()
for m in ours:
    for node in ast.walk(ast.parse(open(m.__file__).read())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split('.')[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split('.')[0])
third = imported - set(sys.stdlib_module_names) - {'qstate', '__future__'}
owners = metadata.packages_distributions()
base = {norm(re.split(r'[<>=!~\\[ (;]', r)[0]) for r in metadata.requires('qstate')
        if 'extra ==' not in r}
print(json.dumps({"loaded": sorted({m.split('.')[0] for m in sys.modules}),
                  "third": sorted(third),
                  "missing": sorted(m for m in third
                                    if not {norm(d) for d in owners.get(m, [])} & base)}))
"""


def test_a_reader_needs_only_the_base_install(venv: Path, user: Path) -> None:
    got = run(venv / "bin" / "python", "-c", CLIENT_NEEDS, cwd=user)
    assert got.returncode == 0, got.stderr
    answer = json.loads(got.stdout)
    assert not set(SERVER_ONLY) & set(answer["loaded"])
    assert "httpx" in answer["third"]  # the reading is real
    assert answer["missing"] == [], "the client imports what the base install does not bring"
