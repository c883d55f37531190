"""deploy/prometheus with promtool (missing promtool fails, never skips): the scrape config
and rules check, the rule unit tests pass and cover every alert firing and not firing, and
the config reads the targets file `make run` writes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from qstate.core.config import DEFAULTS
from qstate.embedded.prometheus import targets_path
from tests.deploy.kit import PROMETHEUS_DIR, ROOT, alert_rules, tool

ALERTS = {"QStateFreshnessLow", "QStateShardDown", "QStatePartitionsRestoring",
          "QStateDeadLetters", "QStateCommitsFailing", "QStateCommitsStalled",
          "QStateJobDown", "QStateJobProcessDown", "QStateRouterDown", "QStateRouterUnavailable",
          "QStateWatermarkInFuture", "QStateEnginePanicked"}


def promtool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_config_and_rules_check() -> None:
    for args in (("check", "config", "deploy/prometheus/prometheus.yml"),
                 ("check", "rules", "deploy/prometheus/alerts.yml")):
        r = promtool(*args)
        assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests_pass() -> None:
    r = promtool("test", "rules", PROMETHEUS_DIR / "alerts.test.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_unit_tests_have_teeth(tmp_path: Path) -> None:
    """A rule made wrong (a threshold out of reach) fails them."""
    shutil.copy(PROMETHEUS_DIR / "alerts.test.yml", tmp_path)
    text = (PROMETHEUS_DIR / "alerts.yml").read_text()
    assert text.count("> 120\n") >= 2
    (tmp_path / "alerts.yml").write_text(text.replace("> 120\n", "> 100000\n"))
    r = promtool("test", "rules", tmp_path / "alerts.test.yml")
    assert r.returncode != 0 and "QStateFreshnessLow" in r.stdout + r.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    assert {r["alert"] for r in alert_rules()} == ALERTS
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts.test.yml").read_text())
    cases = [c for t in tests["tests"] for c in t["alert_rule_test"]]
    for name in ALERTS:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: never tested firing"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: never tested not firing"
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_config_reads_the_targets_file_make_run_writes() -> None:
    """Prometheus resolves file_sd paths against the config's folder: from the repository
    root, `make run` (default home) writes exactly the file the config reads."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    [scrape] = config["scrape_configs"]
    [sd] = scrape["file_sd_configs"]
    [files] = sd["files"]
    assert (PROMETHEUS_DIR / files).resolve() == \
        (ROOT / targets_path(Path(DEFAULTS.home))).resolve()
    assert scrape["honor_labels"] is True  # qstate's `job` label is the qstate job
    assert (PROMETHEUS_DIR / config["rule_files"][0]).resolve() == \
        (PROMETHEUS_DIR / "alerts.yml").resolve()


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_its_runbook_section() -> None:
    """Each alert's runbook_url is docs/runbook.md#<its section>, and the section is there:
    a renamed alert or a dropped section fails here, not in an operator's browser."""
    runbook = ROOT / "docs" / "runbook.md"
    anchors = {_anchor(line.lstrip("#")) for line in runbook.read_text().splitlines()
               if line.startswith("#")}
    for rule in alert_rules():
        path, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert path == "docs/runbook.md", rule["alert"]
        assert anchor == rule["alert"].lower() and anchor in anchors, rule["alert"]
    for link in re.findall(r"\]\(#([^)]+)\)", runbook.read_text()):
        assert link in anchors, link
