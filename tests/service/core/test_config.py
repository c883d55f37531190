from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from qstate.core.config import DEFAULTS, Settings

FIELDS = Settings.model_fields


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No QSTATE_* variable from the caller, and a working directory without qstate.env."""
    for name in list(os.environ):
        if name.upper().startswith("QSTATE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def env_file(clean_env: Path) -> Path:
    path = clean_env / "site.env"
    path.write_text("# qstate settings\n"
                    "QSTATE_HTTP_PORT=9001\n"
                    "QSTATE_KAFKA_BOOTSTRAP=kafka-a:9092,kafka-b:9092\n"
                    "QSTATE_LOCAL_READS=false\n"
                    "QSTATE_SHARD_TIMEOUT_S=2.5\n"
                    "QSTATE_NOT_A_SETTING=whatever\n"  # ignored, not an error
                    "OTHER_TOOL_SETTING=1\n")
    return path


def test_file_beats_default(env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSTATE_CONFIG", str(env_file))
    s = Settings(_env_file=env_file)  # type: ignore[call-arg]
    assert s.http_port == 9001 != FIELDS["http_port"].default
    assert s.kafka_bootstrap == "kafka-a:9092,kafka-b:9092"
    assert s.local_reads is False and FIELDS["local_reads"].default is True
    assert s.shard_timeout_s == 2.5
    # what the file does not name keeps its default
    assert s.grpc_port == FIELDS["grpc_port"].default
    assert s.router_url == FIELDS["router_url"].default


def test_env_beats_file(env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSTATE_CONFIG", str(env_file))
    monkeypatch.setenv("QSTATE_HTTP_PORT", "9002")
    monkeypatch.setenv("QSTATE_GRPC_PORT", "6000")
    s = Settings(_env_file=env_file)  # type: ignore[call-arg]
    assert s.http_port == 9002  # env over file
    assert s.grpc_port == 6000  # env over default
    assert s.kafka_bootstrap == "kafka-a:9092,kafka-b:9092"  # file still applies elsewhere


def test_explicit_values_beat_env_and_file(env_file: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # how a command applies its flags: keyword arguments over everything else
    monkeypatch.setenv("QSTATE_HTTP_PORT", "9002")
    s = Settings(_env_file=env_file, http_port=9003)  # type: ignore[call-arg]
    assert s.http_port == 9003


def test_no_env_no_file_gives_the_defaults(clean_env: Path) -> None:
    s = Settings()
    for name, f in FIELDS.items():
        assert getattr(s, name) == f.default, name


def test_defaults_are_unaffected_by_env(env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSTATE_HTTP_PORT", "9002")
    monkeypatch.setenv("QSTATE_PARTITIONS", "8")
    for name, f in FIELDS.items():
        assert getattr(DEFAULTS, name) == f.default, name
    fresh = Settings.model_construct()  # how DEFAULTS is built, now with env set
    assert fresh.http_port == FIELDS["http_port"].default
    assert fresh.partitions == FIELDS["partitions"].default


def test_defaults_at_import_ignore_env_and_config_file(env_file: Path) -> None:
    """In a fresh process with QSTATE_CONFIG and an env var set before import: ``settings()``
    reads them, DEFAULTS does not."""
    code = ("import json; from qstate.core.config import DEFAULTS, settings; s = settings(); "
            "print(json.dumps([DEFAULTS.http_port, DEFAULTS.grpc_port, DEFAULTS.kafka_bootstrap,"
            " s.http_port, s.grpc_port, s.kafka_bootstrap, settings() is s]))")
    env = {**os.environ, "QSTATE_CONFIG": str(env_file), "QSTATE_GRPC_PORT": "6000"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    got = json.loads(out.stdout)
    assert got == [FIELDS["http_port"].default, FIELDS["grpc_port"].default,
                   FIELDS["kafka_bootstrap"].default,
                   9001, 6000, "kafka-a:9092,kafka-b:9092", True]


def test_default_values_pass_their_own_constraints() -> None:
    # DEFAULTS is built without validation: a default out of its bounds would go unnoticed
    validated = Settings.model_validate(DEFAULTS.model_dump())
    assert validated.model_dump() == DEFAULTS.model_dump()


@pytest.mark.parametrize(("name", "value"), [
    ("partitions", "0"), ("partitions", "4097"), ("heartbeat_s", "0"), ("http_port", "-1"),
    ("max_batch_keys", "0"), ("http_port", "eighty"),
])
def test_out_of_range_values_are_refused(clean_env: Path, monkeypatch: pytest.MonkeyPatch,
                                         name: str, value: str) -> None:
    monkeypatch.setenv(f"QSTATE_{name.upper()}", value)
    with pytest.raises(ValidationError, match=name):
        Settings()


def test_every_field_has_a_description() -> None:
    missing = [n for n, f in FIELDS.items() if not (f.description or "").strip()]
    assert missing == []


def test_derived_directories(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSTATE_HOME", "/var/qs")
    s = Settings()
    assert (s.storage_uri, s.checkpoints_dir, s.shard_data) == (
        os.path.join("/var/qs", "storage"), os.path.join("/var/qs", "checkpoints"),
        os.path.join("/var/qs", "shards"))
    monkeypatch.setenv("QSTATE_STORAGE", "s3://bucket/prefix")
    monkeypatch.setenv("QSTATE_CHECKPOINTS", "/ck")
    monkeypatch.setenv("QSTATE_SHARD_DATA_DIR", "/data")
    s = Settings()
    assert (s.storage_uri, s.checkpoints_dir, s.shard_data) == (
        "s3://bucket/prefix", "/ck", "/data")
