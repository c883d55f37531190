"""The monitoring kit (deploy/prometheus, deploy/grafana) as the tests read it: the
dashboards' panels and queries, Grafana's variable interpolation, the gjson selectors of the
Infinity datasource, the alert rules, and a real Prometheus process to run them on."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml

from qstate.embedded.ports import free_port, wait_for_port
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
PROVISIONING = GRAFANA_DIR / "provisioning"
DASHBOARDS = PROVISIONING / "dashboards"

# Grafana's own variables (https://grafana.com/docs/grafana/latest/dashboards/variables/
# add-template-variables/#global-variables); a dashboard may use these without defining them
GLOBALS = {"__from", "__to", "__interval", "__interval_ms", "__rate_interval", "__range",
           "__range_s", "__range_ms", "__all", "__dashboard", "__org", "__user", "__name",
           "timeFilter", "__timeFilter"}
# $name, ${name}, ${name:format}, [[name]] (the old syntax)
VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")


def tool(name: str) -> str:
    """A program the kit is checked with: missing is a failure, never a skip."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: apt-get install prometheus (the Debian package "
                    f"brings prometheus and promtool; .ci/run installs it)", pytrace=False)
    return path


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_generate",
                                                  GRAFANA_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows too."""
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def datasources() -> dict[str, dict[str, Any]]:
    """uid -> the provisioned datasource."""
    out = {}
    for path in sorted((PROVISIONING / "datasources").glob("*.y*ml")):
        for ds in yaml.safe_load(path.read_text())["datasources"]:
            out[ds["uid"]] = ds
    return out


def targets(dashboard: dict[str, Any], ds_type: str) -> list[tuple[str, dict[str, Any]]]:
    """(panel title, target) of every query of a datasource type."""
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            ds = t.get("datasource") or p.get("datasource") or {}
            if ds.get("type") == ds_type:
                out.append((p["title"], t))
    return out


def prom_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(title, t["expr"]) for title, t in targets(dashboard, "prometheus")]


# ---- Grafana's interpolation --------------------------------------------------------------

def _format(value: str | list[str], fmt: str | None) -> str:
    """Grafana's variable formats, those the dashboards use (anything else fails)."""
    values = value if isinstance(value, list) else [value]
    if fmt == "json":
        return json.dumps(value)
    if fmt == "percentencode":
        return ",".join(urllib.parse.quote(v, safe="-_.!~*'()") for v in values)
    if fmt in ("glob", None):  # Infinity's default: one value as is, several as {a,b}
        return values[0] if len(values) == 1 else "{" + ",".join(values) + "}"
    if fmt == "regex":  # the Prometheus datasource's default for several values
        return values[0] if len(values) == 1 else "(" + "|".join(values) + ")"
    raise AssertionError(f"variable format {fmt!r}: not interpolated by these tests")


def interpolate(text: str, values: dict[str, str | list[str]], default: str | None) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3) or m.group(4)
        assert name in values, f"{text!r}: no value for ${name}"
        return _format(values[name], m.group(2) or default)
    return VARIABLE.sub(one, text)


def used_variables(obj: Any) -> set[str]:
    """Names of the variables used in every string of ``obj``."""
    if isinstance(obj, str):
        return {m.group(1) or m.group(3) or m.group(4) for m in VARIABLE.finditer(obj)}
    if isinstance(obj, dict):
        return set().union(*(used_variables(v) for v in obj.values()), set())
    if isinstance(obj, list):
        return set().union(*(used_variables(v) for v in obj), set())
    return set()


# ---- the Infinity datasource's backend parser: gjson paths ----------------------------------

_QUERY = re.compile(r'#\((\w+)\s*==\s*"([^"]*)"\)')
_PART = re.compile(r"#\([^)]*\)|[^.]+")


def gjson(doc: Any, path: str) -> Any:
    """The subset of gjson (github.com/tidwall/gjson) the dashboards use: keys, array
    indexes and ``#(field=="value")`` (the first element that matches). Returns ``MISSING``
    where gjson's result would not exist; other syntax fails the test."""
    if path == "":
        return doc
    cur = doc
    for part in _PART.findall(path):
        q = _QUERY.fullmatch(part)
        if q:
            assert isinstance(cur, list), f"{path}: {part} on a non-array"
            cur = next((x for x in cur if isinstance(x, dict) and
                        str(x.get(q.group(1))) == q.group(2)), MISSING)
        elif part.isdigit() and isinstance(cur, list):
            cur = cur[int(part)] if int(part) < len(cur) else MISSING
        elif re.fullmatch(r"[\w-]+", part) and isinstance(cur, dict):
            cur = cur.get(part, MISSING)
        else:
            assert re.fullmatch(r"[\w-]+", part), f"gjson syntax {part!r}: not in this subset"
            cur = MISSING
        if cur is MISSING:
            return MISSING
    return cur


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


@dataclass
class InfinityRequest:
    method: str
    url: str
    params: dict[str, str]
    body: str | None


def infinity_request(target: dict[str, Any], base_url: str,
                     values: dict[str, str | list[str]]) -> InfinityRequest:
    """The HTTP request the Infinity datasource makes for ``target`` (its URL relative to
    the datasource's, params and body interpolated with Infinity's default format)."""
    assert target["type"] == "json" and target["source"] == "url", target
    assert target.get("parser") == "backend", "panels use the backend parser (gjson)"
    opts = target.get("url_options", {})
    url = base_url + interpolate(target["url"], values, "glob")
    params = {p["key"]: interpolate(p["value"], values, "glob")
              for p in opts.get("params", [])}
    body = interpolate(opts["data"], values, "glob") if opts.get("method") == "POST" else None
    return InfinityRequest(opts.get("method", "GET"), url, params, body)


def infinity_rows(target: dict[str, Any], answer: Any,
                  values: dict[str, str | list[str]]) -> list[dict[str, Any]]:
    """The rows the panel shows: the root selector's result, each column's selector."""
    root = gjson(answer, interpolate(target.get("root_selector", ""), values, "glob"))
    assert root is not MISSING, f"root selector {target.get('root_selector')!r} selects " \
                                f"nothing in {str(answer)[:300]}"
    items = root if isinstance(root, list) else [root]
    return [{c["text"]: gjson(item, c["selector"]) for c in target["columns"]}
            for item in items]


# ---- alert rules --------------------------------------------------------------------------

def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


_SELECTOR = re.compile(r"\b((?:qstate_|up\b)[A-Za-z0-9_:]*)\s*(\{[^}]*\})?")


def selectors(expr: str) -> list[str]:
    """The vector selectors of ``expr`` (metric name and matchers): what an alert reads."""
    return sorted({name + (matchers or "") for name, matchers in _SELECTOR.findall(expr)})


# ---- a real Prometheus --------------------------------------------------------------------

class Prometheus:
    """``prometheus`` on a free port with the shipped scrape config, pointed at a targets
    file of the test's and scraping every second."""

    def __init__(self, tmp: Path, targets_file: Path) -> None:
        shipped = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
        shipped["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
        shipped["rule_files"] = [str(PROMETHEUS_DIR / f) for f in shipped["rule_files"]]
        [scrape] = shipped["scrape_configs"]
        [sd] = scrape["file_sd_configs"]
        sd |= {"files": [str(targets_file)], "refresh_interval": "1s"}
        self.config = tmp / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(shipped))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "prometheus.log"
        self.args = [tool("prometheus"), f"--config.file={self.config}",
                     f"--storage.tsdb.path={tmp / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}"]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        wait_for_port("127.0.0.1", self.port, 30, self.proc)
        wait_until(lambda: httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200, 30,
                   f"prometheus ready (log: {self.log})")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return list(body["data"]["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        r = httpx.get(f"{self.url}/api/v1/label/{label}/values", params={"match[]": match},
                      timeout=10)
        assert r.status_code == 200, r.text
        return list(r.json()["data"])

    def targets(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/targets", timeout=10)
        return list(r.json()["data"]["activeTargets"])

    def all_up(self, addresses: set[str]) -> bool:
        """Every one of ``addresses`` is a target and its last scrape succeeded."""
        health = {t["labels"]["instance"]: t["health"] for t in self.targets()}
        return all(health.get(a) == "up" for a in addresses)
