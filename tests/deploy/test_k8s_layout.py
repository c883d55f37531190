"""deploy/k8s's layout: shard servers are node daemons that outlive executor pods, routers are
kept available and scaled, the driver can run its executors, and every name a manifest refers
to (a Secret and its keys, a ConfigMap, a claim, a port, a $(VAR)) is declared somewhere."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_manifests import DEPLOY, containers, pod_template
from tests.deploy.test_schemas import validate_k8s

K8S = DEPLOY / "k8s"
POOL = "qstate.io/executor-pool"


def k8s_docs() -> list[dict[str, Any]]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    [doc] = [d for d in k8s_docs() if d.get("kind") == kind
             and (name is None or d["metadata"].get("name") == name)]
    return doc


def executor_template() -> dict[str, Any]:
    return yaml.safe_load((K8S / "executor-pod-template.yaml").read_text())


def options(args: list[str]) -> dict[str, str]:
    """--name value pairs of a qstate command line (flags without a value are skipped)."""
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[a] = args[i + 1]
    return out


def confs(args: list[str]) -> dict[str, str]:
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def image_uid() -> int:
    [uid] = re.findall(r"useradd --uid (\d+)", (DEPLOY / "Dockerfile").read_text())
    return int(uid)


def qstate_container(doc: dict[str, Any], command: str) -> dict[str, Any]:
    [c] = [c for c in containers(doc) if c.get("args", [None])[0] == command]
    return c


# ---- shards: a DaemonSet on the executor pool ---------------------------------------------

def test_shards_are_a_daemonset_on_the_executor_pool_and_executors_carry_none() -> None:
    runs_shard = [d for d in k8s_docs() for c in containers(d) if c.get("args", [""])[0] == "shard"]
    assert [d["kind"] for d in runs_shard] == ["DaemonSet"]
    assert not [c for c in containers(executor_template()) if "shard" in c["name"]]
    ds = one("DaemonSet", "qstate-shard")
    pod = ds["spec"]["template"]["spec"]
    # shards and executors on the same pool of nodes, tolerating the same taint
    assert pod["nodeSelector"] == {POOL: "true"} == executor_template()["spec"]["nodeSelector"]
    assert pod["tolerations"] == executor_template()["spec"]["tolerations"]
    # never two shard pods on a node during an update: both would open one RocksDB directory
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    assert pod["terminationGracePeriodSeconds"] >= 30


def test_a_shard_keeps_its_data_on_the_node_under_a_stable_id() -> None:
    ds = one("DaemonSet", "qstate-shard")
    pod = ds["spec"]["template"]["spec"]
    shard = qstate_container(ds, "shard")
    opts = options(shard["args"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    [mount] = [m for m in shard["volumeMounts"] if m["mountPath"] == opts["--data-dir"]]
    assert volumes[mount["name"]]["hostPath"] == {"path": "/var/lib/qstate/shards",
                                                 "type": "DirectoryOrCreate"}
    env = env_of(shard)
    # the id is the node's name: a restarted pod reopens <data-dir>/<id>
    assert opts["--id"] == "$(NODE_NAME)"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # it registers the pod's IP and the port it binds
    assert opts["--advertise"] == f"$(POD_IP):{opts['--port']}"
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert opts["--host"] == "0.0.0.0"
    # the hostPath directory is made the image user's before the shard starts
    [init] = pod["initContainers"]
    assert init["command"] == ["chown", f"{image_uid()}:{image_uid()}", opts["--data-dir"]]
    assert [m["mountPath"] for m in init["volumeMounts"]] == [opts["--data-dir"]]


def test_every_shard_pod_carries_the_router_of_its_node() -> None:
    """The router beside each shard registers the shard's node and reads its files at the
    shard's own path, read-only: the cluster map names it as those partitions' read
    address (docs/architecture.md §5, cluster map)."""
    ds = one("DaemonSet", "qstate-shard")
    shard, router = qstate_container(ds, "shard"), qstate_container(ds, "router")
    node = env_of(shard)["QSTATE_NODE"]["value"]
    assert env_of(router)["QSTATE_NODE"]["value"] == node == "$(NODE_NAME)"
    assert env_of(router)["NODE_NAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env_of(router)["QSTATE_ROUTER_ADVERTISE"]["value"] == "$(POD_IP)"
    data = options(shard["args"])["--data-dir"]
    [mount] = [m for m in router["volumeMounts"] if m["mountPath"] == data]
    [own] = [m for m in shard["volumeMounts"] if m["mountPath"] == data]
    assert mount["name"] == own["name"] and mount["readOnly"] is True
    assert router["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_shard_probes_and_headless_service_use_its_metrics_port() -> None:
    ds = one("DaemonSet", "qstate-shard")
    shard = qstate_container(ds, "shard")
    ports = {p["name"]: p["containerPort"] for p in shard["ports"]}
    opts = options(shard["args"])
    assert ports == {"shard-grpc": int(opts["--port"]),
                     "shard-reader": int(opts["--reader-port"]),
                     "shard-metrics": int(opts["--metrics-port"])}
    assert shard["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "shard-metrics"}
    assert shard["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "shard-metrics"}
    svc = one("Service", "qstate-shard")
    assert svc["spec"]["clusterIP"] == "None"  # callers dial each shard, never a virtual IP
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]


def test_qstate_containers_declare_the_ports_their_command_line_binds() -> None:
    flags = ("--port", "--metrics-port", "--reader-port", "--http-port", "--grpc-port")
    for d in k8s_docs():
        for c in containers(d):
            if c.get("image", "").startswith("qstate:") and c["args"][0] != "job":
                opts = options(c["args"])
                assert {int(opts[f]) for f in flags if f in opts} == \
                    {p["containerPort"] for p in c.get("ports", [])}, d["metadata"]["name"]


# ---- every pod: the image's user, no root, resources --------------------------------------

def pods() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in k8s_docs():
        pod = pod_template(d)
        if pod:
            out.append((d["metadata"].get("name", d["kind"]), pod["spec"]))
    return out


@pytest.mark.parametrize(("name", "pod"), pods(), ids=[n for n, _ in pods()])
def test_pods_run_as_the_image_user_without_privileges(name: str, pod: dict) -> None:
    ctx = pod["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == image_uid()
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"]:
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        if c.get("args", [""])[0] in ("shard", "router"):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}
        if c.get("image"):  # Spark sets the executor's resources
            assert {"cpu", "memory"} <= c["resources"]["requests"].keys()
            assert "memory" in c["resources"]["limits"]
    for c in pod.get("initContainers", []):
        # root only to chown, with that one capability
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False


# ---- routers: disruption budget and autoscaling ------------------------------------------

def test_routers_have_a_disruption_budget_and_a_cpu_autoscaler() -> None:
    dep = one("Deployment", "qstate-router")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    pdb = one("PodDisruptionBudget", "qstate-router")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = one("HorizontalPodAutoscaler", "qstate-router")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "qstate-router"}
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    # more replicas than the budget keeps, so a drain can evict one
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]
    assert "replicas" not in dep["spec"]  # the autoscaler owns the count
    [router] = containers(dep)
    assert "cpu" in router["resources"]["requests"]  # utilization is measured against it


# ---- the driver: client mode, its account, its executors ----------------------------------

def driver() -> dict[str, Any]:
    [d] = [d for d in k8s_docs() for c in containers(d) if c.get("args", [""])[0] == "job"]
    return d


def test_the_driver_runs_qstate_job_in_client_mode_on_kubernetes() -> None:
    d = driver()
    assert d["kind"] == "Deployment"
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate"
    c = qstate_container(d, "job")
    opts, conf, env = options(c["args"]), confs(c["args"]), env_of(c)
    assert opts["--master"].startswith("k8s://https://")
    assert opts["--driver-host"] == "$(POD_IP)"
    assert conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"  # owns its executors
    assert conf["spark.kubernetes.namespace"] == "$(POD_NAMESPACE)"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    ports = {p["containerPort"] for p in c["ports"]}
    assert {int(conf["spark.driver.port"]), int(conf["spark.blockManager.port"]),
            int(opts["--metrics-port"])} <= ports
    assert conf["spark.kubernetes.container.image"] == c["image"]


def test_the_driver_is_a_caller_of_the_shard_api() -> None:
    """deploy/README.md: the driver's pod needs envFrom qstate-config, the qstate-cluster
    secret at /etc/qstate/cluster and QSTATE_CLUSTER_TOKEN_FILE naming its token."""
    d = driver()
    c = qstate_container(d, "job")
    assert {"configMapRef": {"name": "qstate-config"}} in c["envFrom"]
    volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    [m] = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/qstate/cluster"]
    assert volumes[m["name"]]["secret"]["secretName"] == "qstate-cluster"
    token_file = env_of(c)["QSTATE_CLUSTER_TOKEN_FILE"]["value"]
    assert token_file == "/etc/qstate/cluster/cluster-token"
    assert "cluster-token" in one("Secret", "qstate-cluster")["stringData"]


def test_the_drivers_account_may_run_executor_pods() -> None:
    d = driver()
    account = d["spec"]["template"]["spec"]["serviceAccountName"]
    assert one("ServiceAccount", account)
    [binding] = [b for b in k8s_docs() if b["kind"] == "RoleBinding"
                 and {"kind": "ServiceAccount", "name": account} in b["subjects"]]
    role = one("Role", binding["roleRef"]["name"])
    verbs = {(r, v) for rule in role["rules"] if rule["apiGroups"] == [""]
             for r in rule["resources"] for v in rule["verbs"]}
    for verb in ("create", "get", "list", "watch", "delete", "deletecollection"):
        assert ("pods", verb) in verbs
        assert ("configmaps", verb) in verbs  # the executors' Spark settings


def test_the_executor_template_reaches_the_driver_through_a_generated_configmap() -> None:
    d = driver()
    c = qstate_container(d, "job")
    path = Path(confs(c["args"])["spark.kubernetes.executor.podTemplateFile"])
    [m] = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    volumes = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
    cm_name = volumes[m["name"]]["configMap"]["name"]
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    [gen] = [g for g in kust["configMapGenerator"] if g["name"] == cm_name]
    assert path.name in gen["files"] and (K8S / path.name).exists()
    # the executors' image runs them with Spark's executor backend, not qstate's CLI
    [ex] = containers(executor_template())
    script = ex["command"][-1]
    assert (DEPLOY / Path(script).name).exists()
    assert f"./{Path(script).name}" in (DEPLOY / "Dockerfile").read_text()


def test_driver_and_executors_share_the_checkpoint_claim_at_one_path() -> None:
    d = driver()
    c = qstate_container(d, "job")
    root = options(c["args"])["--checkpoints"]

    def claim_at(pod: dict[str, Any], container: dict[str, Any]) -> str:
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        [m] = [m for m in container["volumeMounts"] if m["mountPath"] == root]
        return volumes[m["name"]]["persistentVolumeClaim"]["claimName"]

    [ex] = containers(executor_template())
    claim = claim_at(d["spec"]["template"], c)
    assert claim == claim_at(executor_template(), ex)
    assert "ReadWriteMany" in one("PersistentVolumeClaim", claim)["spec"]["accessModes"]


# ---- names referred to are declared ------------------------------------------------------

def test_every_secret_configmap_claim_and_variable_referred_to_exists() -> None:
    all_docs = k8s_docs()
    secrets = {s["metadata"]["name"]: set(s.get("stringData", {})) | set(s.get("data", {}))
               for s in all_docs if s["kind"] == "Secret"}
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    configmaps = {c["metadata"]["name"] for c in all_docs if c["kind"] == "ConfigMap"}
    configmaps |= {g["name"] for g in kust["configMapGenerator"]}
    claims = {c["metadata"]["name"] for c in all_docs if c["kind"] == "PersistentVolumeClaim"}
    for d in all_docs:
        pod = pod_template(d)
        if not pod:
            continue
        for v in pod["spec"].get("volumes", []):
            if "secret" in v:
                keys = {i["key"] for i in v["secret"].get("items", [])}
                assert keys <= secrets[v["secret"]["secretName"]]
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims
        names = {v["name"] for v in pod["spec"].get("volumes", [])}
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            assert {m["name"] for m in c.get("volumeMounts", [])} <= names
            for src in c.get("envFrom", []):
                assert src["configMapRef"]["name"] in configmaps
            env = env_of(c)
            for e in env.values():
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]]
            used = {v for a in c.get("args", []) for v in re.findall(r"\$\((\w+)\)", a)}
            assert used <= env.keys(), (d["metadata"].get("name"), used - env.keys())


# ---- kustomization: everything applied, the template generated ---------------------------

def test_kustomization_applies_every_manifest_but_the_monitoring_and_the_template() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kust["resources"])
    generated = {f for g in kust["configMapGenerator"] for f in g["files"]}
    on_disk = {p.name for p in K8S.glob("*.y*ml")} - {"kustomization.yaml"}
    assert listed | generated <= on_disk
    # monitoring.yaml needs the Prometheus Operator's CRDs: applied on its own (README)
    assert on_disk - listed - generated == {"monitoring.yaml"}
    assert "executor-pod-template.yaml" not in listed  # a template, not a pod to create
    assert one("Namespace")["metadata"]["name"] == kust["namespace"]


def test_kustomize_renders_documents_that_match_the_schema() -> None:
    # kubectl's own kustomize, as `kubectl apply -k` renders (.ci/run installs kubectl)
    assert shutil.which("kubectl"), "kubectl is needed: apt-get install kubectl"
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for d in rendered:
        validate_k8s(d)
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == kust["namespace"]
    [binding] = [d for d in rendered if d["kind"] == "RoleBinding"]
    assert binding["subjects"][0]["namespace"] == kust["namespace"]
    [cm] = [d for d in rendered if d["metadata"]["name"].startswith("qstate-spark-templates")]
    assert yaml.safe_load(cm["data"]["executor-pod-template.yaml"]) == executor_template()
    [drv] = [d for d in rendered if d["kind"] == "Deployment"
             and d["metadata"]["name"] == driver()["metadata"]["name"]]
    # the generated, hashed name is written into the driver's volume
    assert [v["configMap"]["name"] for v in drv["spec"]["template"]["spec"]["volumes"]
            if "configMap" in v] == [cm["metadata"]["name"]]


# ---- Prometheus: ServiceMonitors with the labels of deploy/prometheus ---------------------

def test_servicemonitors_scrape_every_role_the_alerts_and_dashboards_select() -> None:
    monitors = [d for d in k8s_docs() if d["kind"] == "ServiceMonitor"]
    services = [d for d in k8s_docs() if d["kind"] == "Service"]
    roles = set()
    for m in monitors:
        selected = [s for s in services if m["spec"]["selector"]["matchLabels"].items()
                    <= s["metadata"]["labels"].items()]
        assert selected, m["metadata"]["name"]
        for ep in m["spec"]["endpoints"]:
            for s in selected:
                assert ep["port"] in {p["name"] for p in s["spec"]["ports"]}
            assert ep["honorLabels"] is True  # as prometheus.yml: keep qstate's `job` label
            [relabel] = [r for r in ep["relabelings"] if r["targetLabel"] == "role"]
            roles.add(relabel["replacement"])
    assert roles == {"job", "shard", "router"}
    prom = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    assert "honor_labels: true" in prom and "role" in prom
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    assert set(re.findall(r'role="(\w+)"', alerts)) <= roles


def test_the_router_is_scraped_over_tls_with_the_cluster_ca() -> None:
    m = one("ServiceMonitor", "qstate-router")
    [ep] = m["spec"]["endpoints"]
    assert ep["scheme"] == "https"
    ca = ep["tlsConfig"]["ca"]["secret"]
    assert ca["key"] in one("Secret", ca["name"])["stringData"]
    [router] = containers(one("Deployment", "qstate-router"))
    assert router["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"



def test_scrape_annotations_name_a_declared_port() -> None:
    for d in k8s_docs():
        pod = pod_template(d)
        port = (pod or {}).get("metadata", {}).get("annotations", {}).get("prometheus.io/port")
        if port:
            assert int(port) in {p["containerPort"] for c in containers(d)
                                 for p in c.get("ports", [])}, d["metadata"].get("name")
