"""A shard never runs open (docs/architecture.md §8): on loopback without a configured
cluster token it makes the host's token in ``<home>/cluster-token`` (0600), which every
job, router and tool with the same home sends; elsewhere it refuses to start."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from qstate.core.config import Settings
from qstate.core.errors import StartFailed
from qstate.core.transport.security import cluster_token, host_token, shard_settings
from qstate.embedded.procs import ShardProcess
from tests.helpers import refused_then_answered

pytestmark = pytest.mark.security

OPEN_ENV = ("QSTATE_CLUSTER_TOKEN", "QSTATE_CLUSTER_TOKEN_FILE", "QSTATE_ALLOW_INSECURE",
            "QSTATE_HOME")


def test_a_shard_on_loopback_without_a_token_makes_the_hosts_and_keeps_it(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    cfg = Settings(home=str(home))
    assert cluster_token(cfg) == ""
    first = shard_settings(cfg, "127.0.0.1").cluster_token
    file = home / "cluster-token"
    assert first and file.read_text() == first
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert cluster_token(cfg) == first  # what a router or a job with this home sends
    assert shard_settings(cfg, "localhost").cluster_token == first  # a restart keeps it
    assert [p.name for p in home.iterdir()] == ["cluster-token"]  # no draft left


def test_shards_starting_at_once_agree_on_one_token(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        made = set(pool.map(lambda _: host_token(tmp_path), range(32)))
    assert len(made) == 1 and (tmp_path / "cluster-token").read_text() in made


def test_a_configured_token_wins_and_no_file_is_made(tmp_path: Path) -> None:
    cfg = Settings(home=str(tmp_path), cluster_token="set-by-the-operator")
    assert shard_settings(cfg, "127.0.0.1").cluster_token == "set-by-the-operator"
    secret = tmp_path / "mounted"
    secret.write_text("from-a-secret\n")
    cfg = Settings(home=str(tmp_path), cluster_token_file=str(secret))
    assert shard_settings(cfg, "127.0.0.1").cluster_token == "from-a-secret"
    assert not (tmp_path / "cluster-token").exists()


def test_a_shard_on_another_address_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    cfg = Settings(home=str(tmp_path), tls_cert="c", tls_key="k")
    with pytest.raises(StartFailed, match="cluster token"):
        shard_settings(cfg, "10.1.2.3")
    assert not (tmp_path / "cluster-token").exists()  # a token no other host finds is no help
    mesh = cfg.model_copy(update={"allow_insecure": True})
    assert shard_settings(mesh, "10.1.2.3").cluster_token == ""  # the mesh authenticates


def test_a_real_shard_refuses_callers_without_the_hosts_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in OPEN_ENV}
    env["QSTATE_HOME"] = str(home)
    shard = ShardProcess.make("lone", tmp_path / "data", str(tmp_path / "storage"),
                              tmp_path / "logs", env=env).start_and_wait()
    try:
        log = shard.log_path.read_text()
        assert f"made one in {home / 'cluster-token'}" in log
        assert (home / "cluster-token").read_text() not in log  # where, never what
        # a caller with another home has no token; one with the shard's home finds it
        assert refused_then_answered(shard.address, Settings(home=str(tmp_path / "elsewhere")),
                                     Settings(home=str(home)),
                                     grpc.StatusCode.UNAUTHENTICATED) == "lone"
    finally:
        shard.stop()


def test_a_home_it_cannot_write_is_a_clear_refusal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o500)  # read and enter, not write
    try:
        if os.access(home, os.W_OK):  # root writes anyway: the refusal needs another cause
            (home / "cluster-token").mkdir()  # a directory where the file should be
            with pytest.raises(StartFailed, match="cluster token file"):
                shard_settings(Settings(home=str(home)), "127.0.0.1")
        else:
            with pytest.raises(StartFailed, match="cannot make the cluster token"):
                shard_settings(Settings(home=str(home)), "127.0.0.1")
    finally:
        home.chmod(0o700)
