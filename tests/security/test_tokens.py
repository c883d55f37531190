"""Client tokens at a real router over the session's shop deployment: the auth matrix (who
asks what, expected status, and for a 200 the exact value), tokens made by ``qstate token
add`` and never seen again, and the CLI's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from httpx_sse import connect_sse
from prometheus_client.parser import text_string_to_metric_families

from qstate.client import Client
from qstate.core.answer import WatchEvent
from qstate.core.errors import InvalidRequest
from qstate.embedded.ports import free_port
from qstate.embedded.procs import RouterProcess, qstate_command
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.clients.test_node_client import run_node
from tests.helpers import Scrape, wait_until
from tests.shop import BATCHES, KEYS, MANY, Shop, views

pytestmark = pytest.mark.security

LAST = BATCHES - 1
KEY = KEYS[4]
# who -> scopes; "nobody" and "forged" hold no valid token
SCOPES = {"shop": ["shop"], "views": ["shop/views_1m"], "other": ["ads"],
          "other_op": ["shop/clicks_1m"], "admin": ["*"], "leaving": ["shop"]}


@dataclass
class Guarded:
    router: RouterProcess
    tokens: dict[str, str]  # who -> token
    tokens_file: Path
    log: Path

    def headers(self, who: str) -> dict[str, str]:
        if who == "nobody":
            return {}
        token = self.tokens.get(who, "qs_forged-token-nobody-issued")
        return {"authorization": f"Bearer {token}"}


def _add(file: Path, who: str, scopes: list[str]) -> str:
    args = ["token", "add", who, "--file", str(file)]
    for s in scopes:
        args += ["--scope", s]
    out = subprocess.run(qstate_command(*args), capture_output=True, text=True, timeout=60,
                         check=True)
    token = out.stdout.strip()
    assert token.startswith("qs_") and len(token) > 40
    return token


@pytest.fixture(scope="module")
def guarded(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    tmp = tmp_path_factory.mktemp("guarded")
    file = tmp / "tokens.json"
    tokens = {who: _add(file, who, scopes) for who, scopes in SCOPES.items()}
    env = {**os.environ, "QSTATE_TOKENS_FILE": str(file), "QSTATE_METRICS_PUBLIC": "false"}
    router = RouterProcess.make(shop.storage.uri, tmp / "logs", "guarded", env).start_and_wait()
    try:
        yield Guarded(router, tokens, file, tmp / "logs" / "guarded.log")
    finally:
        router.stop()


S = f"/v1/state/shop/views_1m/views/{KEY}"
# (who, method, path) -> expected status; a 200 on a state path is checked against truth
MATRIX = [
    *[(w, "GET", S, 401) for w in ("nobody", "forged")],
    *[(w, "GET", S, 200) for w in ("shop", "views", "admin")],
    *[(w, "GET", S, 403) for w in ("other", "other_op")],
    ("views", "GET", f"/v1/series/shop/views_1m/views/{KEY}", 200),
    ("other", "GET", f"/v1/series/shop/views_1m/views/{KEY}", 403),
    ("nobody", "GET", f"/v1/series/shop/views_1m/views/{KEY}", 401),
    ("shop", "POST", "/v1/state/shop/views_1m/views:batchGet", 200),
    ("other_op", "POST", "/v1/state/shop/views_1m/views:batchGet", 403),
    ("nobody", "POST", "/v1/state/shop/views_1m/views:batchGet", 401),
    # several states of one operator: its scope is the operator's
    ("views", "POST", "/v1/state/shop/views_1m:batchGet", 200),
    ("other_op", "POST", "/v1/state/shop/views_1m:batchGet", 403),
    ("nobody", "POST", "/v1/state/shop/views_1m:batchGet", 401),
    ("views", "GET", "/v1/jobs/shop", 200),
    ("other", "GET", "/v1/jobs/shop", 403),
    ("other_op", "GET", "/v1/jobs/shop", 200),  # sees the job, lists only its operator
    ("views", "GET", "/v1/top/shop/views_1m/views", 200),
    ("other", "GET", "/v1/top/shop/views_1m/views", 403),
    ("other_op", "GET", "/v1/top/shop/views_1m/views", 403),
    ("nobody", "GET", "/v1/top/shop/views_1m/views", 401),
    ("views", "GET", f"/v1/watch/shop/views_1m/views?key={KEY}", 200),
    ("other", "GET", f"/v1/watch/shop/views_1m/views?key={KEY}", 403),
    ("other_op", "GET", f"/v1/watch/shop/views_1m/views?key={KEY}", 403),
    ("nobody", "GET", f"/v1/watch/shop/views_1m/views?key={KEY}", 401),
    # the shop's manifests name no Kafka topic: a 404, past the token check
    ("views", "GET", "/v1/jobs/shop/position?topic=t&partition=0&offset=0", 404),
    ("other", "GET", "/v1/jobs/shop/position?topic=t&partition=0&offset=0", 403),
    ("nobody", "GET", "/v1/jobs/shop/position?topic=t&partition=0&offset=0", 401),
    ("admin", "GET", "/v1/cluster", 200),
    ("shop", "GET", "/v1/cluster", 403),
    ("nobody", "GET", "/v1/cluster", 401),
    ("nobody", "GET", "/v1/jobs", 401),
    ("nobody", "GET", "/metrics", 401),  # QSTATE_METRICS_PUBLIC=false
    ("other", "GET", "/metrics", 200),
    ("nobody", "GET", "/healthz", 200),
    ("nobody", "GET", "/openapi.json", 200),
    ("nobody", "GET", "/ui/", 200),
]


@pytest.mark.parametrize(("who", "method", "path", "expected"), MATRIX,
                         ids=[f"{w}-{m}-{p.split('/')[2] if p.count('/') > 1 else p}-{e}"
                              for w, m, p, e in MATRIX])
def test_the_auth_matrix_over_http(guarded: Guarded, who: str, method: str, path: str,
                                   expected: int) -> None:
    body = {"keys": [KEY, KEYS[5]]} if method == "POST" else None
    if path.endswith("views_1m:batchGet"):
        body = {**(body or {}), "states": ["views"]}
    if path.startswith("/v1/watch/") and expected == 200:  # a stream: its first event
        with httpx.Client(timeout=10) as c, connect_sse(
                c, method, guarded.router.url + path, headers=guarded.headers(who)) as es:
            assert es.response.status_code == 200
            first = WatchEvent.model_validate_json(next(es.iter_sse()).data)
        assert [a.windows[-1].value for a in first.changes] == [views(KEY, LAST)]
        return
    r = httpx.request(method, guarded.router.url + path, json=body,
                      headers=guarded.headers(who), timeout=10)
    assert r.status_code == expected, r.text
    if expected == 401:
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"] == "Unauthenticated"
    elif expected == 403:
        assert r.json()["error"] == "Forbidden"
        assert f"token '{who}'" in r.json()["message"]  # named by name, never the token
    elif path == S:
        assert r.json()["windows"][-1]["value"] == views(KEY, LAST)
    elif method == "POST":
        assert [a["windows"][-1]["value"] for a in r.json()["results"]] == \
            [views(KEY, LAST), views(KEYS[5], LAST)]
    elif path.startswith("/v1/top/"):
        assert [e["value"] for e in r.json()["entries"]] == sorted(
            (views(k, LAST) for k in KEYS + MANY), reverse=True)[:10]
    elif path.startswith("/v1/jobs/") and expected == 200:
        ops = [o["name"] for o in r.json()["operators"]]
        assert ops == ([] if who == "other_op" else ["views_1m"])


def test_the_job_list_shows_only_what_a_token_may_read(guarded: Guarded) -> None:
    def jobs(who: str) -> list[str]:
        r = httpx.get(guarded.router.url + "/v1/jobs", headers=guarded.headers(who),
                      timeout=10)
        assert r.status_code == 200, r.text
        return [j["name"] for j in r.json()["jobs"]]

    assert jobs("shop") == ["shop"] and jobs("admin") == ["shop"]
    assert jobs("other") == []


@pytest.mark.parametrize(("who", "code"), [
    ("nobody", grpc.StatusCode.UNAUTHENTICATED), ("forged", grpc.StatusCode.UNAUTHENTICATED),
    ("other", grpc.StatusCode.PERMISSION_DENIED), ("views", grpc.StatusCode.OK),
    ("admin", grpc.StatusCode.OK)])
def test_the_auth_matrix_over_grpc(guarded: Guarded, who: str, code: grpc.StatusCode) -> None:
    md = tuple(guarded.headers(who).items())
    with grpc.insecure_channel(guarded.router.grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        req = qpb.GetRequest(job="shop", operator="views_1m", state="views", key=KEY)
        if code == grpc.StatusCode.OK:
            assert stub.Get(req, metadata=md, timeout=10).windows[-1].int_value == \
                views(KEY, LAST)
            listed = stub.ListJobs(qpb.ListJobsRequest(), metadata=md, timeout=10)
            assert [(j.name, [o.name for o in j.operators]) for j in listed.jobs] == \
                [("shop", ["views_1m"])]
            return
        with pytest.raises(grpc.RpcError) as err:
            stub.Get(req, metadata=md, timeout=10)
        assert err.value.code() == code
        if who == "other":
            assert "token 'other'" in (err.value.details() or "")


def _refused(guarded: Guarded) -> tuple[str, Scrape]:
    text = httpx.get(guarded.router.url + "/metrics", headers=guarded.headers("admin"),
                     timeout=10).text
    return text, Scrape([s for f in text_string_to_metric_families(text) for s in f.samples])


def test_tokens_are_stored_hashed_and_never_logged_or_counted(guarded: Guarded) -> None:
    _, before = _refused(guarded)
    statuses = [httpx.get(guarded.router.url + S, headers=guarded.headers(who),
                          timeout=10).status_code
                for who in [*guarded.tokens, "nobody", "forged"]]  # every token, and none
    stored = guarded.tokens_file.read_text()
    assert guarded.tokens_file.stat().st_mode & 0o077 == 0
    assert {e["name"] for e in json.loads(stored)["tokens"]} == set(SCOPES)
    metrics, after = _refused(guarded)
    log = guarded.log.read_text()
    for token in guarded.tokens.values():
        assert token not in stored and token not in metrics and token not in log
    # each of this test's own refusals counted once, under its reason ("other" may not read
    # shop: 403; nobody and forged hold no valid token: 401)
    assert statuses.count(401) >= 2 and statuses.count(403) >= 1, statuses
    for status, reason in ((401, "unauthenticated"), (403, "forbidden")):
        counted = (after.value("qstate_router_refused_total", reason=reason)
                   - before.value("qstate_router_refused_total", reason=reason))
        assert counted == statuses.count(status), (reason, statuses)


def test_a_malformed_tokens_file_stops_the_router_naming_it(shop: Shop, tmp_path: Path) -> None:
    bad = tmp_path / "tokens.json"
    bad.write_text('{"tokens": [{"name": "x", "sha256": "not-hex", "scopes": ["shop"]}]}')
    out = subprocess.run(qstate_command("router", "--http-port", str(free_port()),
                                        "--grpc-port", str(free_port()), "--storage",
                                        shop.storage.uri),
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "QSTATE_TOKENS_FILE": str(bad)})
    assert out.returncode == 2, out
    assert str(bad) in out.stderr and "Traceback" not in out.stderr


def test_get_exit_codes(guarded: Guarded) -> None:
    def get(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "QSTATE_TOKEN"}
        if token:
            env["QSTATE_TOKEN"] = token
        return subprocess.run(qstate_command("get", "shop", "views_1m", "views", *args),
                              capture_output=True, text=True, timeout=60, env=env)

    url = guarded.router.url
    ok = get(KEY, "--url", url, token=guarded.tokens["views"])
    assert ok.returncode == 0 and json.loads(ok.stdout)["windows"][-1]["value"] == \
        views(KEY, LAST)
    assert get("no-such-key", "--url", url, token=guarded.tokens["views"]).returncode == 1
    assert get(KEY, "--url", url).returncode == 5
    assert get(KEY, "--url", url, token=guarded.tokens["other"]).returncode == 5
    closed = get(KEY, "--url", f"http://127.0.0.1:{free_port()}")
    assert closed.returncode == 4
    assert closed.stderr.count("\n") == 1 and "cannot be reached" in closed.stderr


def test_the_node_client_sends_a_token(node: str, guarded: Guarded) -> None:
    args = ("get", "shop", "views_1m", "views", KEY)
    ok = run_node(node, guarded.router.grpc_address, *args, "--token", guarded.tokens["views"])
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["windows"][-1]["int_value"] == str(views(KEY, LAST))
    for token in ((), ("--token", guarded.tokens["other"])):
        refused = run_node(node, guarded.router.grpc_address, *args, *token)
        assert refused.returncode == 5, refused.stderr


def test_grpc_lists_and_describes_only_what_a_token_may_read(guarded: Guarded) -> None:
    with grpc.insecure_channel(guarded.router.grpc_address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)

        def md(who: str) -> tuple[tuple[str, str], ...]:
            return tuple(guarded.headers(who).items())

        assert list(stub.ListJobs(qpb.ListJobsRequest(), metadata=md("other"),
                                  timeout=10).jobs) == []
        op_only = stub.DescribeJob(qpb.DescribeJobRequest(job="shop"), metadata=md("other_op"),
                                   timeout=10)
        assert list(op_only.operators) == []  # its operator is not views_1m
        full = stub.DescribeJob(qpb.DescribeJobRequest(job="shop"), metadata=md("views"),
                                timeout=10)
        assert [o.name for o in full.operators] == ["views_1m"]


def test_secrets_stay_out_of_settings_reprs() -> None:
    from qstate.core.config import Settings

    s = Settings(token="qs_secret-client", cluster_token="secret-cluster")
    assert "secret" not in repr(s) and "secret" not in str(s)


def test_a_token_removed_from_the_file_is_refused_without_a_restart(guarded: Guarded) -> None:
    url = guarded.router.url + S
    assert httpx.get(url, headers=guarded.headers("leaving"), timeout=10).status_code == 200
    doc = json.loads(guarded.tokens_file.read_text())
    doc["tokens"] = [e for e in doc["tokens"] if e["name"] != "leaving"]
    guarded.tokens_file.write_text(json.dumps(doc))
    wait_until(lambda: httpx.get(url, headers=guarded.headers("leaving"),
                                 timeout=10).status_code == 401, 10, "the token revoked")
    assert httpx.get(url, headers=guarded.headers("shop"), timeout=10).status_code == 200


def test_tokens_come_from_a_file_and_never_go_off_loopback_in_plain_text(
        node: str, guarded: Guarded, tmp_path: Path) -> None:
    """`qstate get`, the Python client and the Node client read the token from a file (a
    mounted secret) as well; none sends it in plain text to another host unless told the
    network protects it (issue 25)."""
    secret = tmp_path / "token"
    secret.write_text(guarded.tokens["views"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QSTATE_")}
    got = subprocess.run(qstate_command("get", "shop", "views_1m", "views", KEY, "--url",
                                        guarded.router.url, "--token-file", str(secret)),
                         capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == 0 and json.loads(got.stdout)["windows"][-1]["value"] == \
        views(KEY, LAST), got.stderr
    with Client(guarded.router.url, token_file=str(secret)) as c:
        assert c.get("shop", "views_1m", "views", KEY).windows[-1].value == views(KEY, LAST)
    by_env = run_node(node, guarded.router.grpc_address, "get", "shop", "views_1m", "views",
                      KEY, env={"QSTATE_TOKEN_FILE": str(secret)})
    assert by_env.returncode == 0, by_env.stderr
    # off loopback (an address nobody is asked: the refusal comes first)
    with pytest.raises(InvalidRequest, match=r"refusing to send the client token to 10\.1\.2\.3"):
        Client("http://10.1.2.3:8000", token_file=str(secret))
    Client("http://10.1.2.3:8000", token="t", insecure_token=True).close()
    Client("http://10.1.2.3:8000").close()  # no token: nothing to protect
    off = subprocess.run(qstate_command("get", "shop", "views_1m", "views", KEY, "--url",
                                        "http://10.1.2.3:8000", "--token-file", str(secret)),
                         capture_output=True, text=True, timeout=60, env=env)
    assert off.returncode == 2 and "in plain text" in off.stderr, off.stderr
    refused = run_node(node, "10.1.2.3:50051", "get", "shop", "views_1m", "views", KEY,
                       "--token-file", str(secret))
    assert refused.returncode == 2 and "in plain text" in refused.stderr, refused.stderr


def test_an_unknown_job_lists_no_job_names_where_tokens_scope_them(guarded: Guarded) -> None:
    """With client tokens, a 404 does not tell a caller the names of jobs its token may not
    read: it points at GET /v1/jobs, which lists those it may."""
    r = httpx.get(f"{guarded.router.url}/v1/state/nojob/views_1m/views/k",
                  headers=guarded.headers("admin"))
    assert r.status_code == 404
    message = r.json()["message"]
    assert "GET /v1/jobs lists the jobs" in message and "'shop'" not in message
