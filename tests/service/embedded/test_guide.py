"""What `qstate run` prints about where to look, and the Prometheus targets file it keeps
(the file is read by a real Prometheus in tests/deploy/test_observability.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qstate.core.config import DEFAULTS
from qstate.embedded import guide
from qstate.embedded.prometheus import Target, targets_path, write_targets

ROOT = Path(__file__).resolve().parents[3]
TARGETS = [Target("router", "router", "127.0.0.1:8000"),
           Target("shard", "shard-0", "127.0.0.1:9465"),
           Target("shard", "shard-1", "127.0.0.1:9466"), Target("job", "jobs", "127.0.0.1:9464")]


def test_targets_file_is_file_sd_with_a_role_per_process(tmp_path: Path) -> None:
    path = targets_path(tmp_path)
    write_targets(path, TARGETS)
    assert json.loads(path.read_text()) == [
        {"targets": [t.address], "labels": {"role": t.role, "process": t.process}}
        for t in TARGETS]
    write_targets(path, TARGETS[:1])  # a rewrite replaces it whole, nothing else left
    assert len(json.loads(path.read_text())) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["targets.json"]


def test_endpoints_name_every_metrics_page_prometheus_and_grafana(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # as `make run` runs it
    text = guide.endpoints(TARGETS, targets_path(Path(DEFAULTS.home)))
    for t in TARGETS:
        assert f"http://{t.address}/metrics" in text
    assert ".qstate/prometheus/targets.json" in text
    assert "prometheus --config.file=deploy/prometheus/prometheus.yml " \
           "--storage.tsdb.path=.qstate/prometheus/data" in text
    assert "point its file_sd" not in text  # the default home is what the config reads
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    assert f"GF_PATHS_PROVISIONING={provisioning} grafana server" in text
    assert f"-v {provisioning}:/etc/grafana/provisioning" in text
    assert "yesoreyeram-infinity-datasource" in text and guide.GRAFANA_IMAGE in text


def test_another_home_is_named_for_the_prometheus_config(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    text = guide.endpoints(TARGETS, targets_path(tmp_path))
    assert f"point its file_sd at {targets_path(tmp_path)}" in text
    assert f"--storage.tsdb.path={tmp_path / 'prometheus' / 'data'}" in text


def test_queries_name_curl_lines_the_ui_docs_and_metrics() -> None:
    text = guide.queries("http://127.0.0.1:8000", 50051, "tw-1")
    assert "curl -s http://127.0.0.1:8000/v1/state/tweets/per_tweet_1h/impressions/tw-1" in text
    assert "/v1/series/tweets/per_tweet_1m/impressions/tw-1?from=now-1h" in text
    for page in ("/ui", "/docs", "/metrics"):
        assert f"http://127.0.0.1:8000{page}" in text
    assert "127.0.0.1:50051" in text
    assert "QSTATE_CLUSTER_TOKEN_FILE=.qstate/cluster-token .venv/bin/qstate state inspect" \
        in text
    assert os.path.exists(ROOT / "clients" / "node" / "query.mjs")


def test_the_guide_is_not_broken_at_the_consoles_width_in_a_log() -> None:
    """Read from a log or a pipe (rich's console is 80 columns wide there), each command and
    URL of the guide stays on its line whole: copied, it runs."""
    from qstate.embedded.demo import console

    text = guide.queries("http://127.0.0.1:8000", 50051, "tw-" + "1" * 12)
    with console.capture() as cap:
        console.print(text, markup=False, highlight=False)
    printed = cap.get().splitlines()
    assert printed == text.splitlines()
    assert any(line.endswith("?from=now-15m'") and len(line) > 80 for line in printed)
