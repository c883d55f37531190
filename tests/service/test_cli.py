"""The `qstate` command as a user runs it: `qstate get` output and exit codes, and where its
settings come from (flag > QSTATE_* environment > QSTATE_CONFIG file > default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qstate.core.records.savepoint import create
from qstate.core.records.storage import Storage
from qstate.embedded.ports import free_port
from qstate.exit_codes import HELP as EXIT_HELP
from tests.service.test_savepoints import JOB as SAVED_JOB
from tests.service.test_savepoints import P as SAVED_P
from tests.service.test_savepoints import storage as storage
from tests.shop import BATCHES, KEYS, MANY, Shop, views, window

ROOT = Path(__file__).resolve().parents[2]
LAST = BATCHES - 1


def qstate(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
           ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("QSTATE_")}
    return subprocess.run([sys.executable, "-m", "qstate", *args], env={**base, **(env or {})},
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def test_get_prints_the_answer_as_json(shop: Shop) -> None:
    r = qstate("get", "shop", "views_1m", "views", KEYS[7], "--url", shop.routers["local"].url)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["found"], out["batch"]) == (True, LAST)
    assert out["windows"] == [{"start": window(LAST)[0], "end": window(LAST)[1],
                               "value": views(KEYS[7], LAST)}]


def test_top_prints_the_board_as_json(shop: Shop) -> None:
    url = shop.routers["grpc"].url
    r = qstate("top", "shop", "views_1m", "views", "-n", "3", "--url", url)
    assert r.returncode == 0, r.stderr
    board = json.loads(r.stdout)
    mine = sorted(KEYS + MANY, key=lambda k: (-views(k, LAST), k))[:3]
    assert (board["batch"], board["window"]) == (LAST, dict(zip(("start", "end"),
                                                               window(LAST), strict=True)))
    assert board["entries"] == [{"key": k, "value": views(k, LAST)} for k in mine]
    asc = json.loads(qstate("top", "shop", "views_1m", "views", "-n", "2", "--asc",
                            "--window", "0", "--url", url).stdout)
    assert asc["order"] == "asc" and asc["entries"] == [
        {"key": k, "value": views(k, 0)}
        for k in sorted(KEYS + MANY, key=lambda k: (views(k, 0), k))[:2]]
    for args, code in ((("-n", "0"), 2), (("--window", "soon"), 2)):
        bad = qstate("top", "shop", "views_1m", "views", *args, "--url", url)
        assert (bad.returncode, bad.stdout) == (code, "") and bad.stderr.startswith("error: ")
    gone = qstate("top", "shop", "nope", "views", "--url", url)
    assert gone.returncode == 1 and 'no operator "nope"' in gone.stderr


@pytest.mark.parametrize(("args", "code", "says"), [
    (("shop", "views_1m", "views", "never-written"), 1, f"as of batch {LAST}"),
    (("shop", "nope", "views", "k"), 1, 'no operator "nope"'),
    (("shop", "views_1m", "views", "k", "--from", "soon"), 2, "ISO-8601"),
])
def test_get_exit_codes(shop: Shop, args: tuple[str, ...], code: int, says: str) -> None:
    r = qstate("get", *args, "--url", shop.routers["grpc"].url)
    assert (r.returncode, r.stdout) == (code, "")
    assert r.stderr.startswith("error: ") and says in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # one line, no traceback


# `make soak` (CI), keeping make test under 10 min (docs/architecture.md §9)
@pytest.mark.long
def test_get_unavailable_shard_exits_3(shop: Shop) -> None:
    victim = shop.shards[0]
    with shop.shard_down(victim) as key:
        r = qstate("get", "shop", "views_1m", "views", key, "--url", shop.routers["grpc"].url)
    assert r.returncode == 3 and victim.address in r.stderr


def test_get_unreachable_router_exits_4_in_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = qstate("get", "shop", "views_1m", "views", "k", "--url", url)
    assert r.returncode == 4
    assert r.stderr.startswith(f"error: the router at {url} cannot be reached")
    assert len(r.stderr.strip().splitlines()) == 1


def test_setting_precedence_flag_env_file(shop: Shop, tmp_path: Path) -> None:
    good = shop.routers["local"].url
    nowhere = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "site.env"
    config.write_text(f"QSTATE_ROUTER_URL={good}\n")
    args = ("get", "shop", "views_1m", "views", KEYS[0])
    # the file alone is heard
    assert qstate(*args, env={"QSTATE_CONFIG": str(config)}, cwd=tmp_path).returncode == 0
    # the environment beats the file
    r = qstate(*args, env={"QSTATE_CONFIG": str(config), "QSTATE_ROUTER_URL": nowhere},
               cwd=tmp_path)
    assert r.returncode == 4 and nowhere in r.stderr
    # a flag beats both
    r = qstate(*args, "--url", good, env={"QSTATE_CONFIG": str(config),
                                          "QSTATE_ROUTER_URL": nowhere}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # and without any, the documented default (nothing listens there in this test)
    r = qstate("get", "--help", cwd=tmp_path)
    assert "http://127.0.0.1:8000" in r.stdout


def test_help_documents_exit_codes() -> None:
    """Every command that asks a router states the one table (qstate.exit_codes), and
    paragraphs are wrapped to the terminal, not at the source's line breaks."""
    for cmd in ("get", "top", "watch"):
        r = qstate(cmd, "--help")
        assert r.returncode == 0
        text = " ".join(r.stdout.replace("│", " ").split())
        assert " ".join(EXIT_HELP.split()) in text, cmd
    # a paragraph wrapped at the source's line breaks leaves a line of one word ("session")
    prose = [ln.strip() for ln in qstate("top", "--help").stdout.splitlines()
             if ln.strip() and not ln.lstrip().startswith(("│", "╭", "╰", "Usage"))]
    assert all(len(ln.split()) > 1 for ln in prose), prose


def said(r: subprocess.CompletedProcess[str]) -> str:
    """stderr with its lines joined (rich wraps them at the terminal's width, in a box)."""
    return " ".join(r.stderr.replace("│", " ").split())


WIDE = {"COLUMNS": "400"}  # rich's boxes wrap at the terminal's width: no path cut in two


# `make soak` (CI), keeping make test under 10 min (docs/architecture.md §9)
@pytest.mark.long
def test_state_rescale_refuses_a_count_that_is_not_a_multiple_and_a_running_job(
        tmp_path: Path) -> None:
    from qstate.core.records import paths
    from qstate.core.records.operator import OperatorSpec, load_spec, save_spec
    from qstate.core.records.storage import Storage

    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, OperatorSpec("j", "op", "k", {"n": "long"}, partitions=4))
    r = qstate("state", "rescale", "j", "--partitions", "6", "--storage", storage.uri)
    assert r.returncode == 1 and "a larger multiple of it (8, 12, ...)" in said(r), r
    r = qstate("state", "rescale", "nope", "--partitions", "8", "--storage", storage.uri)
    assert r.returncode == 1 and "job 'nope' has no operators" in said(r), r
    # a driver that beats its lease while the tool watches: the job runs
    lease = tmp_path / "storage" / paths.driver_lease("j")
    lease.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", (
        "import time, pathlib\n"
        f"p = pathlib.Path({str(lease)!r})\n"
        "for i in range(100):\n"
        "    p.write_text(str(i)); time.sleep(0.2)\n")])
    try:
        r = qstate("state", "rescale", "j", "--partitions", "8", "--storage", storage.uri,
                   "--lease-s", "1")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 1 and "is running" in said(r), r
    spec = load_spec(storage, "j", "op")
    assert spec is not None and spec.partitions == 4  # nothing changed
    r = qstate("state", "rescale", "--help")
    assert r.returncode == 0 and "Exit codes: 0 done; 1 refused" in " ".join(r.stdout.split())


# `make soak` (CI), keeping make test under 10 min (docs/architecture.md §9)
@pytest.mark.long
def test_job_finds_the_users_module_in_the_working_directory(tmp_path: Path) -> None:
    """`qstate job mymod:build` beside mymod.py finds it, as `python -m` would; each way of
    failing to load a job says what it looked for, where, and what to do (refused before
    Spark starts: exit 2)."""
    def job(*args: str) -> subprocess.CompletedProcess[str]:
        return qstate("job", *args, "--no-live", cwd=tmp_path, env=WIDE)

    absent = job("mymod:build")
    assert absent.returncode == 2
    assert f"no module named 'mymod' in the working directory ({tmp_path})" in said(absent)
    assert "pip install -e ." in said(absent)
    (tmp_path / "mymod.py").write_text("def other(spark, ctx):\n    pass\n")
    found = job("mymod:build")  # found here: it is the function that is missing
    assert found.returncode == 2 and "module mymod" in said(found)
    assert f"({tmp_path / 'mymod.py'})" in said(found)
    assert "has no 'build'" in said(found) and "def build(spark, ctx)" in said(found)
    (tmp_path / "deps.py").write_text("import no_such_dependency_qs\n")
    dep = job("deps:build")
    assert dep.returncode == 2
    assert "deps imports 'no_such_dependency_qs', which is not installed" in said(dep)
    (tmp_path / "broken.py").write_text("raise RuntimeError('bad config')\n")
    broken = job("broken:build")
    assert broken.returncode == 2
    assert "importing broken failed: RuntimeError: bad config" in said(broken)


# `make soak` (CI), keeping make test under 10 min (docs/architecture.md §9)
@pytest.mark.long
def test_job_starting_offsets_are_checked_before_spark_starts(tmp_path: Path) -> None:
    for bad in ("soon", "{", '{"tweets": {"x": 1}}', '{"tweets": {"0": -3}}', "{}"):
        r = qstate("job", "tweets", "--starting-offsets", bad, "--no-live", cwd=tmp_path,
                   env=WIDE)
        assert r.returncode == 2 and "earliest, latest, or JSON" in said(r), (bad, r.stderr)


# `make soak` (CI), keeping make test under 10 min (docs/architecture.md §9)
@pytest.mark.long
def test_job_from_a_savepoint_is_checked_before_spark_starts(tmp_path: Path) -> None:
    """The savepoint named by --from-savepoint is read before Spark starts: none there, or
    none of that name, exits 1 saying which there are; --name takes one job."""
    from qstate.core.records.operator import OperatorSpec, save_spec
    from qstate.core.records.storage import Storage

    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, OperatorSpec("tweets", "per_tweet_1h", "tweet_id", {"n": "long"}, 2))

    def job(*args: str) -> subprocess.CompletedProcess[str]:
        return qstate("job", *args, "--storage", storage.uri, "--no-live", cwd=tmp_path,
                      env=WIDE)

    r = job("tweets", "--from-savepoint", "nope")
    assert r.returncode == 1 and "no savepoint 'nope' of job 'tweets'; it has none" in said(r)
    r = job("tweets", "--name", "tweets_v2", "--from-savepoint", "other@x")
    assert r.returncode == 1 and "no savepoint 'x' of job 'other'" in said(r)
    r = job("tweets", "ads", "--name", "v2")
    assert r.returncode == 2 and "--name and --from-savepoint take one job" in said(r)
    r = job("tweets", "--name", "../x")
    assert r.returncode == 2 and "invalid job" in said(r)


def test_job_from_a_savepoint_takes_its_partition_count_unless_one_is_set(
        storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork or a rollback given no partition count takes the savepoint's (`make run`'s 16,
    not the default 64, which it would refuse); one set by --partitions or QSTATE_PARTITIONS
    is kept, and the job's start refuses it if it differs, naming the savepoint's
    (tests/jobs/test_origin.py). The command's own part, up to starting the job (recorded
    here); through Spark: tests/jobs/test_fork_rollback.py."""
    from typer.testing import CliRunner

    from qstate.cli import app
    from qstate.core.config import DEFAULTS
    from qstate.jobs.runtime import supervise

    started: list[int] = []
    monkeypatch.setattr(supervise, "run_jobs",
                        lambda names, ctx, *a, **kw: started.append(ctx.partitions))
    # the command puts its working directory first, for the job's module
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("QSTATE_PARTITIONS", raising=False)
    create(storage, SAVED_JOB, "good")

    def job(*args: str, **env: str) -> None:
        r = CliRunner().invoke(app, ["job", "tweets", "--storage", storage.uri, "--no-live",
                                     *args], env=env)
        assert r.exit_code == 0, r.output

    fork = ("--name", "v2", "--from-savepoint", f"{SAVED_JOB}@good")
    job(*fork)
    job(*fork, "--partitions", "8")
    job(*fork, QSTATE_PARTITIONS="8")
    job()  # no savepoint: the default, as before
    assert started == [SAVED_P, 8, 8, DEFAULTS.partitions]
    r = qstate("job", "--help", env=WIDE)
    [line] = [ln for ln in r.stdout.splitlines()
              if ln.replace("│", " ").split()[:1] == ["--partitions"]]
    assert "takes the savepoint's count unless one is set here" in line
    assert f"[default: {DEFAULTS.partitions}]" in line


def test_state_inspect_names_what_it_looked_at_and_makes_nothing(tmp_path: Path) -> None:
    nowhere = tmp_path / "no-storage"
    r = qstate("state", "inspect", "--storage", str(nowhere), cwd=tmp_path, env=WIDE)
    assert r.returncode == 1 and f"no checkpoint storage at {nowhere}" in said(r)
    assert not nowhere.exists() and not (tmp_path / ".qstate").exists()
    (tmp_path / "empty").mkdir()
    r = qstate("state", "inspect", "--storage", str(tmp_path / "empty"), cwd=tmp_path, env=WIDE)
    assert r.returncode == 1
    assert f"no queryable operator in checkpoint storage at {tmp_path / 'empty'}" in said(r)
