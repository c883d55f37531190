"""deploy/ is validated, not run (no Docker engine here): every manifest parses, every qstate
command line in it is accepted by the real CLI, and ports and probes line up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import yaml

from service.cli import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CLI = typer.main.get_command(app)


def docs() -> list[dict]:
    out = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def containers(doc: dict) -> list[dict]:
    if doc.get("kind") == "Pod":
        return doc["spec"]["containers"]
    if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]["spec"]["containers"]
    return []


def qstate_commands() -> list[list[str]]:
    cmds = [c["args"] for d in docs() for c in containers(d) if c.get("image", "").startswith(
        "qstate:")]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    cmds += [s["command"] for s in compose["services"].values()
             if s.get("image", "").startswith("qstate:")]
    return cmds


@pytest.mark.parametrize("args", qstate_commands(), ids=lambda a: " ".join(a[:2]))
def test_every_qstate_command_line_is_accepted_by_the_cli(args: list[str]) -> None:
    name, *rest = args
    sub = CLI.commands[name]  # type: ignore[attr-defined]
    rest = [re.sub(r"\$\((\w+)\)", "x", a) for a in rest]  # k8s env expansion
    ctx = sub.make_context(name, list(rest))  # raises on an unknown option or a bad value
    assert ctx.params


def test_the_cli_check_above_rejects_a_wrong_option() -> None:
    with pytest.raises(Exception, match="No such option"):
        CLI.commands["shard"].make_context("shard", ["--bogus", "1"])  # type: ignore[attr-defined]


def test_k8s_probes_and_services_point_at_declared_ports() -> None:
    all_docs = docs()
    for d in all_docs:
        for c in containers(d):
            names = {p["name"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in names
                    assert c[probe]["httpGet"]["path"] in ("/readyz", "/healthz")
    deployments = {d["metadata"]["name"]: d for d in all_docs if d.get("kind") == "Deployment"}
    for svc in (d for d in all_docs if d.get("kind") == "Service"):
        [dep] = [x for x in deployments.values()
                 if x["spec"]["selector"]["matchLabels"].items() <= svc["spec"]["selector"].items()]
        names = {p["name"] for c in containers(dep) for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names


def test_configmap_keys_are_real_settings() -> None:
    from service.core.config import Settings

    [cm] = [d for d in docs() if d.get("kind") == "ConfigMap"]
    fields = {f"QSTATE_{n.upper()}" for n in Settings.model_fields}
    assert set(cm["data"]) <= fields


def test_dockerfile_copies_what_exists() -> None:
    root = DEPLOY.parent
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (root / src).exists(), src
