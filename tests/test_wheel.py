"""What a user installs (docs/architecture.md §10): two wheels, ``qstate`` and the read
engine's ``qstate-engine``, built from this tree as pip builds them, and installed into fresh
venvs: the server install (both wheels) and the client-only install (``qstate`` without
extras). The ``qstate`` wheel installs ``qstate`` and nothing else, so a user's own ``jobs`` and
``proto`` packages live beside it; a reader needs only the base install.

Nothing is downloaded: each venv installs the wheels without their dependencies and borrows
from the project's venv exactly the distributions pip would have installed beside them (the
requirements' closure), file by file, through a folder named in a .pth line. The engine's
build is incremental: it reuses the RocksDB that ``make setup`` compiled once per machine into
the shared CARGO_TARGET_DIR (Makefile)."""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine" / "py"  # the PyO3 face, built by maturin as qstate-engine
FOLDERS = {"service": "qstate", "jobs": "qstate/jobs", "proto": "qstate/proto"}
SERVER_ONLY = ("pyspark", "rocksdict", "confluent_kafka", "pyarrow", "pandas", "fastapi",
               "uvicorn", "datasketches", "orjson", "qstate_engine",
               "feast")  # qstate[feast]'s (qstate.feast), never the client's
OURS = ("qstate", "qstate-engine")  # installed from the wheels, never borrowed
READER_COMMANDS = ("get", "top", "watch")  # what a client-only install's `qstate` runs
SERVER_EXTRA = "pip install 'qstate[server]'"  # what the other commands ask for (cli.py)


def run(*args: str | Path, timeout: float = 300,
        **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, check=False, **kw)  # type: ignore[call-overload]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cargo_target_dir() -> Path:
    """Where the engine's build keeps its compiled RocksDB: the environment's CARGO_TARGET_DIR
    (make exports it), else the Makefile's default, the folder every clone shares."""
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"])
    found = re.search(r"^CARGO_TARGET_DIR \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile no longer says where CARGO_TARGET_DIR is"
    return Path(found.group(1).replace("$(HOME)", str(Path.home())))


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (meta,) = (n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(meta))


def closure(requires: Iterable[str], extras: Iterable[str]) -> list[metadata.Distribution]:
    """The distributions pip installs for a package of these requirements asked with these
    extras, as the project's venv resolved them: each requirement whose marker holds, then
    theirs, with the extras each asks for. Our own distributions are left out."""
    # the venv's site-packages only: the checkout's qstate.egg-info is no install
    installed = {norm(d.metadata["Name"]): d
                 for d in metadata.distributions(path=site.getsitepackages())}
    seen: set[tuple[str, str]] = set()
    todo = [(line, extra) for line in requires for extra in ("", *extras)]
    while todo:
        line, extra = todo.pop()
        req = Requirement(line)
        name = norm(req.name)
        if (req.marker and not req.marker.evaluate({"extra": extra})) or (name, extra) in seen:
            continue
        seen.add((name, extra))
        assert name in installed, f"{line} is not installed in the project's venv: make setup"
        todo += [(r, e) for r in installed[name].requires or [] for e in ("", *req.extras)]
    return [installed[n] for n in sorted({n for n, _ in seen} - set(OURS))]


def borrow(purelib: Path, dists: list[metadata.Distribution]) -> None:
    """Each distribution's installed files (its RECORD: modules, compiled libraries, its
    .dist-info), symlinked one by one into a folder the venv reads from a .pth line: the venv
    sees these distributions and no other, and writes its bytecode into the folder, never
    into the project's venv. (Python reads no .pth file of a folder named in a .pth line.)"""
    folder = purelib.parent / "borrowed"
    for dist in dists:
        assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD"
        for f in dist.files:
            src = Path(str(dist.locate_file(f)))
            dst = folder / f
            if f.parts[0] == ".." or "__pycache__" in f.parts or dst.exists() \
                    or not src.exists():  # scripts outside site-packages; bytecode
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src)
    (purelib / "borrowed.pth").write_text(f"{folder}\n")


def fresh_venv(home: Path, wheels: list[Path], extras: tuple[str, ...]) -> Path:
    """A venv with ``wheels`` installed as ``pip install 'qstate[extras]'`` would, their
    dependencies borrowed; pip check says none is missing. The venv has no pip or setuptools
    of its own (this venv's pip installs into it): what it sees is what pip would install."""
    assert run(sys.executable, "-m", "venv", "--without-pip", home).returncode == 0
    python = home / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", python)
    installed = run(*pip, "install", "--quiet", "--no-deps", "--no-index", *wheels)
    assert installed.returncode == 0, installed.stderr
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
                   .stdout.strip())
    (qstate,) = (w for w in wheels if w.name.startswith("qstate-"))
    borrow(purelib, closure(wheel_metadata(qstate).get_all("Requires-Dist") or [], extras))
    checked = run(*pip, "check")
    assert checked.returncode == 0, checked.stdout
    return home


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
def engine_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The engine's wheel as pip builds it (maturin, release), and the build's log. The
    interpreter is the one `make setup`'s `maturin develop` builds for, so that PyO3's build
    configuration is reused as well; a build that compiles RocksDB takes 7-16 minutes on two
    cores, hence the timeout."""
    out = tmp_path_factory.mktemp("engine")
    built = run(Path(sys.executable).with_name("maturin"), "build", "--release", "--locked",
                "--interpreter", sys.executable, "-o", out, cwd=ENGINE, timeout=3600,
                env={**os.environ, "CARGO_TARGET_DIR": str(cargo_target_dir())})
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("qstate_engine-*.whl")
    return found, built.stderr + built.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path,
         engine_build: tuple[Path, str]) -> Path:
    """The server install: `pip install 'qstate[server]'`, the engine from its wheel."""
    return fresh_venv(tmp_path_factory.mktemp("venv"), [wheel, engine_build[0]], ("server",))


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """The client-only install: `pip install qstate`, no extras, no compiler involved."""
    return fresh_venv(tmp_path_factory.mktemp("client"), [wheel], ())


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


def test_the_server_extra_requires_the_engine_built(wheel: Path,
                                                    engine_build: tuple[Path, str]) -> None:
    """qstate[server] names the engine's distribution at the version its wheel has, and the
    engine's wheel installs its own module only (qstate's files stay qstate's)."""
    engine = wheel_metadata(engine_build[0])
    (required,) = (Requirement(r) for r in wheel_metadata(wheel).get_all("Requires-Dist") or []
                   if norm(Requirement(r).name) == norm(engine["Name"]))
    assert required.marker is not None and required.marker.evaluate({"extra": "server"})
    assert not required.marker.evaluate({"extra": ""}), "the client install needs no engine"
    assert engine["Version"] in required.specifier, (str(required), engine["Version"])
    tops = {n.split("/")[0] for n in zipfile.ZipFile(engine_build[0]).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"qstate_engine"}


def test_the_engine_build_reuses_the_compiled_rocksdb(engine_build: tuple[Path, str]) -> None:
    log = engine_build[1]
    assert "Finished `release` profile" in log, log  # the log is cargo's
    assert "Compiling librocksdb-sys" not in log, (
        f"the engine's build compiled RocksDB again in {cargo_target_dir()}: the Makefile's "
        "profiles must let one compile per machine serve `make setup`, cargo test, clippy "
        "and this build (docs/architecture.md §10)")


def test_qstate_runs_beside_a_users_jobs_and_proto(venv: Path, user: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(user)}
    helped = run(venv / "bin" / "qstate", "--help", cwd=user, env=env)
    assert helped.returncode == 0, helped.stderr
    assert "Usage" in helped.stdout
    code = ("import json, jobs, proto; from qstate import Client, AsyncClient; "
            "from qstate.errors import NotFound, QStateError; import qstate.jobs.runtime.launch, "
            "qstate.proto.shard_pb2, qstate.cli, importlib.util; "
            "print(json.dumps([jobs.OWNER, proto.OWNER, Client.__module__, "
            "issubclass(NotFound, QStateError), qstate.jobs.runtime.launch.__file__, "
            "importlib.util.find_spec('loadtest') is None]))")
    got = run(venv / "bin" / "python", "-c", code, cwd=user, env=env)
    assert got.returncode == 0, got.stderr
    owners_j, owners_p, client_module, is_error, launch_file, no_loadtest = json.loads(got.stdout)
    assert (owners_j, owners_p) == ("the user: jobs", "the user: proto")
    assert client_module == "qstate.client" and is_error and no_loadtest
    assert launch_file.startswith(str(venv)), launch_file  # the wheel's, not this tree's


def test_the_server_install_runs_the_engine_and_the_router(venv: Path, user: Path) -> None:
    code = ("import json, qstate._engine, qstate_engine; "
            "print(json.dumps([qstate_engine.__file__, qstate._engine.__file__, "
            "qstate._engine.Engine.__name__]))")
    got = run(venv / "bin" / "python", "-c", code, cwd=user)
    assert got.returncode == 0, got.stderr
    module, shim, engine = json.loads(got.stdout)
    # the engine's wheel's and the qstate wheel's, not the project's venv's or this tree's
    assert module.startswith(str(venv)) and shim.startswith(str(venv)), (module, shim)
    assert engine == "Engine"
    helped = run(venv / "bin" / "qstate", "router", "--help", cwd=user)
    assert helped.returncode == 0, helped.stderr
    assert "Usage: qstate router" in helped.stdout


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


def test_a_client_only_install_imports_the_client(client_venv: Path, user: Path) -> None:
    code = ("import json, importlib.util; from qstate import Client, AsyncClient; "
            "import qstate.errors; print(json.dumps([Client.__module__, AsyncClient.__name__, "
            "qstate.errors.NotFound.__name__, "
            f"[m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)]]))")
    got = run(client_venv / "bin" / "python", "-c", code, cwd=user)
    assert got.returncode == 0, got.stderr
    client, async_client, not_found, server_found = json.loads(got.stdout)
    assert (client, async_client, not_found) == ("qstate.client", "AsyncClient", "NotFound")
    assert server_found == [], "the client-only venv sees what only the server install brings"


def test_a_client_only_install_runs_the_readers_commands(client_venv: Path, user: Path) -> None:
    """`qstate --help` lists the reader's commands, and each runs as far as asking a router:
    at an address nothing listens on, each ends with exit 4 (qstate.exit_codes), no
    traceback."""
    qstate = client_venv / "bin" / "qstate"
    env = {**os.environ, "COLUMNS": "120"}
    helped = run(qstate, "--help", cwd=user, env=env)
    assert helped.returncode == 0, helped.stderr
    listed = set(re.findall(r"^\W (\w[\w-]*)  ", helped.stdout, re.M))  # the rows' names
    assert set(READER_COMMANDS) <= listed, helped.stdout
    get_help = run(qstate, "get", "--help", cwd=user, env=env)
    assert get_help.returncode == 0, get_help.stderr
    assert "Usage: qstate get" in get_help.stdout
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    for args in (["get", "tweets", "per_tweet_1h", "clicks", "tw-1"],
                 ["top", "tweets", "per_tweet_1h", "clicks"],
                 ["watch", "tweets", "per_tweet_1h", "clicks", "tw-1", "--max-reconnects", "0"]):
        asked = run(qstate, *args, "--url", url, cwd=user, env=env, timeout=60)
        assert (asked.returncode, "Traceback" in asked.stderr) == (4, False), asked.stderr
        assert "cannot be reached" in asked.stderr, asked.stderr


def test_a_client_only_install_names_the_server_extra(client_venv: Path, user: Path) -> None:
    for command in ("shard", "generate"):
        got = run(client_venv / "bin" / "qstate", command, cwd=user)
        assert (got.returncode, "Traceback" in got.stderr) == (2, False), got.stderr
        assert SERVER_EXTRA in got.stderr and f"qstate {command}" in got.stderr, got.stderr
