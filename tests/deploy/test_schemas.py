"""deploy/ against the real schemas, offline and strictly (an unknown field is an error, as with
``kubectl apply --validate=strict``):

- every Kubernetes document under deploy/k8s against the OpenAPI schemas of Kubernetes
  ``K8S_VERSION``, as JSON schemas shipped inside the ``kubernetes-validate`` wheel (a dev
  dependency: nothing is fetched at test time);
- custom resources (the Prometheus Operator's ServiceMonitor) against the openAPIV3Schema of
  their CRD, vendored in tests/deploy/schemas/ (README.md there says from where);
- deploy/docker-compose.yml against the Compose Specification's JSON schema, vendored too.

Each validator is shown to reject a broken copy of a real document, so a green run means the
documents passed, not that nothing was checked."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "k8s"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# The Kubernetes version deploy/k8s is checked against: the oldest one it is written for
# (nothing in it is newer than 1.29). kubernetes-validate ships the schemas of 1.25 to 1.37.
K8S_VERSION = "1.33.0"
# Custom resources and the CRD each is checked against (vendored, see schemas/README.md)
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"):
        SCHEMAS / "monitoring.coreos.com_servicemonitors.yaml"}
# kustomize's own file, not a Kubernetes object: test_k8s_layout.py checks it
NOT_OBJECTS = {"kustomization.yaml"}
K8S_DEFINITIONS = ("https://kubernetes.io/api/_definitions.json"
                   "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.")


def k8s_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.y*ml")):
        if path.name in NOT_OBJECTS:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield f"{path.name}:{doc['kind']}/{doc['metadata'].get('name', '-')}", doc


# ---- validators --------------------------------------------------------------------------

@cache
def _k8s_definitions() -> Registry:
    """Kubernetes' own definitions (ObjectMeta, ...) as the pinned schemas hold them."""
    root = files("kubernetes_validate") / "kubernetes-json-schema"
    text = (root / f"v{K8S_VERSION}-local-strict" / "_definitions.json").read_text()
    return Resource.from_contents(json.loads(text)) @ Registry()


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as Kubernetes applies it to a request with strict field
    validation: an object's fields are the ones it lists, unless it says otherwise
    (additionalProperties, x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: _strict(s) for name, s in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not"):
            out[key] = _strict(value)
        else:
            out[key] = value
    if (out.get("type") == "object" and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def _crd_validator(api_version: str, kind: str) -> Draft202012Validator:
    [crd] = [d for d in yaml.safe_load_all(CRDS[(api_version, kind)].read_text()) if d]
    group, version = api_version.split("/")
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind)
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = _strict(served["schema"]["openAPIV3Schema"])
    # the CRD leaves metadata to the API server: check it as Kubernetes' ObjectMeta
    schema["properties"]["metadata"] = {"$ref": K8S_DEFINITIONS + "ObjectMeta"}
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_k8s_definitions())


def validate_k8s(doc: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError (or SchemaNotFoundError for an unknown kind)."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    if key in CRDS:
        _crd_validator(*key).validate(doc)
        return
    used = kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert used == K8S_VERSION.rsplit(".", 1)[0]  # the pinned schemas, not an older fallback


@cache
def _compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def validate_compose(doc: dict[str, Any]) -> None:
    _compose_validator().validate(doc)


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


# ---- the documents pass ------------------------------------------------------------------

@pytest.mark.parametrize(("name", "doc"), list(k8s_documents()),
                         ids=[n for n, _ in k8s_documents()])
def test_every_k8s_document_matches_the_kubernetes_schema(name: str, doc: dict) -> None:
    validate_k8s(doc)


def test_every_kind_in_deploy_k8s_has_a_schema() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for _, d in k8s_documents()}
    # what the issue asks deploy/k8s to hold, so a file dropped by mistake shows here too
    assert {("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"), ("v1", "Service"),
            ("policy/v1", "PodDisruptionBudget"), ("autoscaling/v2", "HorizontalPodAutoscaler"),
            ("v1", "Pod"), ("v1", "ServiceAccount"), ("rbac.authorization.k8s.io/v1", "Role"),
            ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("v1", "Secret"),
            ("v1", "ConfigMap"), ("monitoring.coreos.com/v1", "ServiceMonitor")} <= kinds


def test_the_compose_file_matches_the_compose_specification() -> None:
    validate_compose(compose())


# ---- each validator rejects what it should -----------------------------------------------

def _doc(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for _, d in k8s_documents()
             if d["kind"] == kind and d["metadata"].get("name") == name]
    return copy.deepcopy(doc)


def _router_with(change: str) -> dict[str, Any]:
    doc = _doc("Deployment", "qstate-router")
    pod = doc["spec"]["template"]["spec"]
    if change == "misspelled field":
        doc["spec"]["replica"] = 2
    elif change == "unknown container field":
        pod["containers"][0]["imagePullPolic"] = "Always"
    elif change == "wrong type":
        pod["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    elif change == "unknown metadata field":
        doc["metadata"]["lables"] = {"a": "b"}
    elif change == "missing required field":
        del pod["containers"][0]["name"]
    return doc


@pytest.mark.parametrize("change", ["misspelled field", "unknown container field", "wrong type",
                                    "unknown metadata field", "missing required field"])
def test_the_kubernetes_check_rejects_a_broken_deployment(change: str) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s(_router_with(change))


def test_the_kubernetes_check_refuses_a_kind_it_has_no_schema_for() -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_k8s(doc)


@pytest.mark.parametrize("change", ["unknown endpoint field", "bad scheme", "unknown spec field",
                                    "unknown metadata field", "wrong apiVersion"])
def test_the_crd_check_rejects_a_broken_servicemonitor(change: str) -> None:
    doc = _doc("ServiceMonitor", "qstate-router")
    endpoint = doc["spec"]["endpoints"][0]
    if change == "unknown endpoint field":
        endpoint["honourLabels"] = True
    elif change == "bad scheme":
        endpoint["scheme"] = "ftp"
    elif change == "unknown spec field":
        doc["spec"]["endpoint"] = doc["spec"].pop("endpoints")
    elif change == "unknown metadata field":
        doc["metadata"]["lables"] = {"a": "b"}
    elif change == "wrong apiVersion":
        doc["apiVersion"] = "monitoring.coreos.com/v1alpha1"
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.SchemaNotFoundError)):
            validate_k8s(doc)
        return
    with pytest.raises(jsonschema.ValidationError):
        validate_k8s(doc)


@pytest.mark.parametrize("change", ["unknown service key", "wrong type", "unknown top-level key"])
def test_the_compose_check_rejects_a_broken_compose_file(change: str) -> None:
    doc = compose()
    if change == "unknown service key":
        doc["services"]["shard-0"]["comand"] = doc["services"]["shard-0"].pop("command")
    elif change == "wrong type":
        doc["services"]["router"]["ports"] = 8000
    elif change == "unknown top-level key":
        doc["service"] = doc.pop("services")
    with pytest.raises(jsonschema.ValidationError):
        validate_compose(doc)


def test_the_vendored_schemas_are_the_recorded_copies() -> None:
    """schemas/README.md records where each came from and its sha256: a change shows here."""
    recorded = (SCHEMAS / "README.md").read_text()
    crd = (SCHEMAS / "monitoring.coreos.com_servicemonitors.yaml").read_bytes()
    crd = crd[crd.index(b"\n---\n") + 1:]  # the CRD as fetched, below the header
    for body in (crd, (SCHEMAS / "compose-spec.json").read_bytes()):
        assert hashlib.sha256(body).hexdigest() in recorded
