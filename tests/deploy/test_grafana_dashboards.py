"""deploy/grafana without a Grafana server (none can be installed here): the dashboards are
what generate.py writes, valid for the Grafana version the provisioning names, and every
datasource, variable and panel id they use lines up with the provisioning. Their queries are
run against real processes in test_observability.py."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kit import (
    DASHBOARDS,
    GLOBALS,
    PROVISIONING,
    dashboards,
    datasources,
    generator,
    panels,
    used_variables,
)

# The dashboard schemaVersion a Grafana release writes (its DashboardMigrator's latest):
# 11.5 exports 40, 11.6 exports 41 (the time_options clean-up), 12.x 41, 13.x 42.
SCHEMA_VERSIONS = {"11.5": 40, "11.6": 41}
PANEL_TYPES = {"row", "timeseries", "stat", "table", "text"}


def named_version() -> str:
    """The Grafana version every provisioning file names in its first line."""
    versions = set()
    for path in sorted(PROVISIONING.rglob("*.yml")):
        m = re.match(r"# Grafana (\d+\.\d+)\b", path.read_text())
        assert m, f"{path} does not name its Grafana version in its first line"
        versions.add(m.group(1))
    [version] = versions
    return version


def test_committed_json_is_what_the_generator_writes() -> None:
    gen = generator()
    want = {name: gen.render(d) for name, d in gen.dashboards().items()}
    have = {p.name: p.read_text() for p in sorted(DASHBOARDS.glob("*.json"))}
    assert have == want, "run: python deploy/grafana/generate.py"


def test_schema_version_is_that_of_the_named_grafana() -> None:
    version = named_version()
    assert version == generator().GRAFANA
    for name, d in dashboards().items():
        assert d["schemaVersion"] == SCHEMA_VERSIONS[version], name


def test_uids_panel_ids_and_layout() -> None:
    ds = dashboards()
    assert len({d["uid"] for d in ds.values()}) == len(ds)
    for name, d in ds.items():
        assert d["title"] and d["refresh"] and d["time"]["to"] == "now"
        ids = [p["id"] for p in panels(d)]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        cells: set[tuple[int, int]] = set()
        for p in panels(d):
            assert p["type"] in PANEL_TYPES, (name, p["title"], p["type"])
            g = p["gridPos"]
            assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, p
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                    for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, f"{name}: {p['title']} overlaps another panel"
            cells |= mine
            refs = [t["refId"] for t in p.get("targets", [])]
            assert len(refs) == len(set(refs)), (name, p["title"])
            assert p["type"] == "row" or refs, f"{name}: {p['title']} has no query"


def datasource_refs(obj: Any) -> list[dict[str, Any]]:
    """Every {"type", "uid"} datasource reference in ``obj``."""
    if isinstance(obj, dict):
        found = [obj["datasource"]] if isinstance(obj.get("datasource"), dict) else []
        return found + [r for v in obj.values() for r in datasource_refs(v)]
    if isinstance(obj, list):
        return [r for v in obj for r in datasource_refs(v)]
    return []


def test_every_datasource_is_provisioned_with_its_type() -> None:
    provisioned = datasources()
    for name, d in dashboards().items():
        refs = datasource_refs({"panels": d["panels"], "templating": d["templating"]})
        assert refs
        for ref in refs:
            if ref["uid"] == "-- Grafana --":
                continue
            assert ref["uid"] in provisioned, f"{name}: datasource {ref['uid']} not provisioned"
            assert provisioned[ref["uid"]]["type"] == ref["type"], (name, ref)


def test_every_variable_used_is_defined() -> None:
    for name, d in dashboards().items():
        defined = {v["name"] for v in d["templating"]["list"]}
        assert len(defined) == len(d["templating"]["list"]), f"{name}: a variable repeats"
        queries = [{k: v for k, v in var.items() if k not in ("current", "options")}
                   for var in d["templating"]["list"]]
        used = used_variables({"panels": d["panels"], "templating": queries})
        assert used - defined - GLOBALS == set(), f"{name}: undefined {used - defined - GLOBALS}"
        assert defined - used == set(), f"{name}: defined, never used: {defined - used}"


def test_the_used_variable_check_catches_a_typo() -> None:
    d = dashboards()["qstate-live-counts.json"]
    assert "jbo" in used_variables({"url": d["panels"][0]["targets"][0]["url"]
                                    .replace("${job}", "${jbo}")})


def test_live_counts_refresh_every_5s_with_the_variables_the_issue_names() -> None:
    d = dashboards()["qstate-live-counts.json"]
    assert d["refresh"] == "5s"
    assert {v["name"] for v in d["templating"]["list"]} == {"job", "operator", "state", "key",
                                                           "keys"}
    keys = next(v for v in d["templating"]["list"] if v["name"] == "keys")
    assert keys["multi"] is True


def test_the_dashboard_provider_finds_the_dashboards() -> None:
    """``$GF_PATHS_PROVISIONING/dashboards`` as Grafana expands it (the official image and
    the README's local command both set GF_PATHS_PROVISIONING to the provisioning folder)."""
    [provider] = yaml.safe_load((PROVISIONING / "dashboards" / "qstate.yml").read_text())[
        "providers"]
    assert provider["type"] == "file"
    path = os.path.expandvars(provider["options"]["path"].replace(
        "$GF_PATHS_PROVISIONING", str(PROVISIONING)))
    assert sorted(p.name for p in Path(path).glob("*.json")) == sorted(dashboards())


@pytest.mark.parametrize("uid", ["qstate-prometheus", "qstate-router"])
def test_datasources_point_at_what_make_run_serves(uid: str) -> None:
    from qstate.core.config import DEFAULTS

    ds = datasources()[uid]
    want = {"qstate-prometheus": "http://127.0.0.1:9090",  # prometheus's default port
            "qstate-router": f"http://127.0.0.1:{DEFAULTS.http_port}"}[uid]
    assert ds["url"] == want
    if ds["type"] == "yesoreyeram-infinity-datasource":
        assert ds["jsonData"]["allowedHosts"] == [want]
