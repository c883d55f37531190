"""deploy/ is validated, not run (no Docker engine here): every manifest parses, every qstate
command line in it is accepted by the real CLI, and ports and probes line up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import yaml

from qstate.cli import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CLI = typer.main.get_command(app)


def docs() -> list[dict]:
    out = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def pod_template(doc: dict) -> dict | None:
    """The pod (metadata and spec) a document runs: a Pod itself or a workload's template."""
    if doc.get("kind") == "Pod":
        return doc
    if doc.get("kind") in WORKLOADS:
        return doc["spec"]["template"]
    return None


def containers(doc: dict) -> list[dict]:
    pod = pod_template(doc)
    return pod["spec"]["containers"] if pod else []


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
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe in c:
                    assert c[probe]["httpGet"]["port"] in names
                    assert c[probe]["httpGet"]["path"] in ("/readyz", "/healthz")
    workloads = [d for d in all_docs if d.get("kind") in WORKLOADS]
    for w in workloads:  # a workload's selector picks its own pods
        if "selector" in w["spec"]:
            labels = w["spec"]["template"]["metadata"]["labels"]
            assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for svc in (d for d in all_docs if d.get("kind") == "Service"):
        # the one workload (Deployment, DaemonSet, StatefulSet, Job) whose pods it selects
        [w] = [x for x in workloads if svc["spec"]["selector"].items()
               <= x["spec"]["template"]["metadata"]["labels"].items()]
        names = {p["name"] for c in containers(w) for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names, svc["metadata"]["name"]


def test_configmap_keys_are_real_settings() -> None:
    from qstate.core.config import Settings

    [cm] = [d for d in docs() if d.get("kind") == "ConfigMap"]
    fields = {f"QSTATE_{n.upper()}" for n in Settings.model_fields}
    assert set(cm["data"]) <= fields


def test_dockerfile_copies_what_exists() -> None:
    root = DEPLOY.parent
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:  # --from: an earlier stage
            for src in [w for w in line.split()[1:-1] if not w.startswith("--")]:
                assert (root / src).exists(), src


def test_compose_shards_advertise_their_service_name() -> None:
    """Other containers reach a shard at the address it registers: its --advertise, whose
    host must be the shard's Compose service name (Compose's DNS), on the port it binds."""
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    shards = {name: s["command"] for name, s in compose["services"].items()
              if s.get("command", [None])[0] == "shard"}
    assert len(shards) >= 2
    for name, cmd in shards.items():
        opts = dict(zip(cmd[1::2], cmd[2::2], strict=True))
        host, port = opts["--advertise"].rsplit(":", 1)
        assert host == name
        assert port == opts["--port"]
        assert opts["--host"] == "0.0.0.0"  # reachable from the other containers
        assert opts["--id"] == name
