"""TLS on every socket and a closed shard API, with real processes: certificates made by
``qstate certs``, a shard server and a router serving TLS, a committer holding the cluster
token, and outsiders who hold neither."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pyarrow as pa
import pytest

from qstate.client import Client
from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.config import Settings
from qstate.core.errors import StartFailed, Unavailable
from qstate.core.records import delta as deltas
from qstate.core.records.assignment import load_assignment
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.security import check_exposure, is_loopback
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import RouterProcess, ShardProcess, qstate_command
from qstate.exit_codes import Exit
from qstate.feast.wire import Wire
from qstate.jobs.runtime.commit import Committer
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from tests.clients.test_node_client import run_node
from tests.helpers import refused_then_answered, wait_until

pytestmark = pytest.mark.security

P = 4
SPEC = OperatorSpec(
    "vault",
    "hits_1m",
    "page",
    {"hits": "long"},
    partitions=P,
    window=WindowSpec("tumbling", 60_000),
)
KEYS = [f"page-{i}" for i in range(40)]
TOKEN = "cluster-secret-of-this-test"


def hits(key: str, batch: int) -> int:
    return (sum(map(ord, key)) + 7 * batch) % 500 + 1


@dataclass
class Vault:
    certs: Path
    storage: Storage
    shard: ShardProcess
    router: RouterProcess
    cfg: Settings  # what an insider holds: the CA and the cluster token
    env: dict[str, str]

    @property
    def ca(self) -> str:
        return str(self.certs / "ca.pem")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.router.http_port}"


def _commit(storage: Storage, coord: Coordinator, batch: int) -> None:
    written = {}
    for p in range(P):
        mine = [k for k in KEYS if partition_of(k, P) == p]
        t = pa.table(
            {
                "key": mine,
                "start": [0] * len(mine),
                "end": [60_000] * len(mine),
                "tag": pa.nulls(len(mine), pa.int64()),
                "hits": [hits(k, batch) for k in mine],
            }
        ).cast(deltas.delta_schema(SPEC))
        deltas.write_delta(storage, PartitionId(SPEC.job, SPEC.operator, p), batch, t)
        written[p] = {0: t.num_rows}
    Committer(coord).commit(SPEC, batch, 0, written)


def _served(clients: ShardClients, address: str) -> set[int]:
    try:
        d = clients.describe(address, timeout=5)
    except grpc.RpcError:
        return set()
    return {p.partition for p in d.partitions if p.job == SPEC.job and not p.restoring}


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    tmp = tmp_path_factory.mktemp("vault")
    certs = tmp / "certs"
    made = subprocess.run(
        qstate_command("certs", "--out", str(certs)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"QSTATE_TLS_CA={certs / 'ca.pem'}" in made.stdout
    assert (certs / "server-key.pem").stat().st_mode & 0o077 == 0  # keys private
    env = {
        **os.environ,
        "QSTATE_TLS_CERT": str(certs / "server.pem"),
        "QSTATE_TLS_KEY": str(certs / "server-key.pem"),
        "QSTATE_TLS_CA": str(certs / "ca.pem"),
        "QSTATE_CLUSTER_TOKEN": TOKEN,
    }
    storage = Storage(str(tmp / "storage"))
    save_spec(storage, SPEC)
    shard = ShardProcess.make("vault0", tmp / "data", storage.uri, tmp / "logs", env=env)
    shard.start_and_wait()
    cfg = Settings(tls_ca=env["QSTATE_TLS_CA"], cluster_token=TOKEN)
    clients = ShardClients(cfg)
    coord = Coordinator(storage, SPEC.job, [shard.address], clients=clients)
    coord.register(SPEC)
    wait_until(lambda: _served(clients, shard.address) == set(range(P)), 30, "shard serving")
    for batch in range(2):
        _commit(storage, coord, batch)
    coord.stop()
    router = RouterProcess.make(
        storage.uri, tmp / "logs", "vault-router", env, "--no-local-reads"
    ).start_and_wait()
    try:
        yield Vault(certs, storage, shard, router, cfg, env)
    finally:
        router.stop()
        shard.stop()
        clients.close()


def test_https_answers_truth_to_a_client_that_trusts_the_ca(vault: Vault) -> None:
    key = KEYS[3]
    r = httpx.get(
        f"{vault.url}/v1/state/vault/hits_1m/hits/{key}",
        verify=ssl.create_default_context(cafile=vault.ca),
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["windows"][-1]["value"] == hits(key, 1) and r.json()["batch"] == 1
    with Client(vault.url, ca=vault.ca) as c:
        assert [a.windows[-1].value for a in c.multi_get("vault", "hits_1m", "hits", KEYS)] == [
            hits(k, 1) for k in KEYS
        ]


def test_a_client_that_does_not_trust_the_ca_or_speaks_plain_text_gets_nothing(
    vault: Vault,
) -> None:
    path = f"/v1/state/vault/hits_1m/hits/{KEYS[0]}"
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(vault.url + path, timeout=10)  # the system's CAs only
    with pytest.raises(httpx.HTTPError):
        r = httpx.get(f"http://127.0.0.1:{vault.router.http_port}{path}", timeout=10)
        r.raise_for_status()
    out = subprocess.run(
        qstate_command("get", "vault", "hits_1m", "hits", KEYS[0], "--url", vault.url, "--ca", ""),
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "QSTATE_TLS_CA"},
    )
    assert out.returncode == 4, out
    assert len(out.stderr.strip().splitlines()) == 1 and "cannot be reached" in out.stderr
    ok = subprocess.run(
        qstate_command(
            "get", "vault", "hits_1m", "hits", KEYS[0], "--url", vault.url, "--ca", vault.ca
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert f'"value": {hits(KEYS[0], 1)}' in ok.stdout


def test_the_feast_stores_reads_over_tls_trust_the_ca_and_only_it(vault: Vault) -> None:
    """qstate.feast reads over connections of its own (qstate.feast.connections), not httpx:
    https with the CA given, refused by name with the system's CAs only."""
    wire = Wire(vault.url, 10.0, 0, vault.ca, None, None)
    for _ in range(2):  # the second on the kept connection
        got = wire.multi_get_states("vault", "hits_1m", ["hits"], KEYS)
        assert [a["windows"][-1]["value"] for a in got] == [hits(k, 1) for k in KEYS]
    wire.close()
    with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED") as caught:
        Wire(vault.url, 10.0, 0, "", None, None).multi_get_states(
            "vault", "hits_1m", ["hits"], KEYS[:1])
    assert caught.value.reason == "router-unreachable"


def test_grpc_over_tls(vault: Vault) -> None:
    creds = grpc.ssl_channel_credentials(Path(vault.ca).read_bytes())
    with grpc.secure_channel(vault.router.grpc_address, creds) as ch:
        v = qpb_grpc.QueryableStateStub(ch).Get(
            qpb.GetRequest(job="vault", operator="hits_1m", state="hits", key=KEYS[5]), timeout=10
        )
    assert v.windows[-1].int_value == hits(KEYS[5], 1)
    with (
        grpc.insecure_channel(vault.router.grpc_address) as ch,
        pytest.raises(grpc.RpcError) as err,
    ):
        qpb_grpc.QueryableStateStub(ch).Get(
            qpb.GetRequest(job="vault", operator="hits_1m", state="hits", key=KEYS[5]), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # no TLS handshake, no answer


def _shard_stub(vault: Vault, token: str | None) -> tuple[ShardClients, pb_grpc.ShardStub]:
    ch = ShardClients(Settings(tls_ca=vault.ca, cluster_token=token or ""))
    return ch, ch.stub(vault.shard.address)


@pytest.mark.parametrize("token", [None, "guessed"], ids=["no-token", "wrong-token"])
def test_an_outsider_is_refused_every_shard_call_and_its_commit_changes_nothing(
    vault: Vault, token: str | None
) -> None:
    clients, stub = _shard_stub(vault, token)
    key = KEYS[7]
    # the current epoch: the only thing an outsider's Commit lacks is the token
    epoch = load_assignment(vault.storage, SPEC.job).epoch
    pid = partition_of(key, P)
    lookup = pb.LookupRequest(job=SPEC.job, operator=SPEC.operator, state="hits",
                              keys=[pb.KeyQuery(key=key, partition=pid)])
    try:
        calls = {
            "Commit": lambda: stub.Commit(
                pb.CommitRequest(
                    job=SPEC.job,
                    operator=SPEC.operator,
                    batch=2,
                    epoch=epoch,
                    watermark_ms=10**12,  # all windows would close
                    partitions=[pb.PartitionDelta(partition=p, has_delta=False) for p in range(P)],
                ),
                timeout=10,
            ),
            "MultiGet": lambda: stub.MultiGet(lookup, timeout=10),
            "Describe": lambda: stub.Describe(pb.DescribeRequest(), timeout=10),
        }
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
            assert "cluster token" in (err.value.details() or "")
            assert "guessed" not in (err.value.details() or "")
    finally:
        clients.close()
    # nothing changed: the insider still reads batch 1's value
    insiders = ShardClients(vault.cfg)
    try:
        got = insiders.stub(vault.shard.address).MultiGet(lookup, timeout=10)
        d = insiders.describe(vault.shard.address)
    finally:
        insiders.close()
    assert got.results[0].windows[-1].int_value == hits(key, 1)
    assert {p.last_batch for p in d.partitions if p.job == SPEC.job} == {1}


def test_servers_refuse_to_start_exposed_without_tls_and_tokens(tmp_path: Path) -> None:
    # bind checks run before any socket opens, so 0.0.0.0 is never actually served here
    env = {k: v for k, v in os.environ.items() if not k.startswith("QSTATE_")}
    for cmd in (
        ["shard", "--host", "0.0.0.0", "--port", "0"],
        ["router", "--host", "0.0.0.0", "--http-port", "0", "--grpc-port", "0"],
    ):
        out = subprocess.run(
            qstate_command(*cmd, "--storage", str(tmp_path / "s")),
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
        assert out.returncode == 2, out
        assert "refusing to serve" in out.stderr and "QSTATE_TLS_CERT" in out.stderr
        assert "QSTATE_CLUSTER_TOKEN" in out.stderr
        assert "Traceback" not in out.stderr


def test_exposure_rules() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    check_exposure("127.0.0.1", Settings(), "the router")  # plain text is fine on loopback
    with pytest.raises(StartFailed, match="QSTATE_TOKENS_FILE"):
        check_exposure(
            "10.1.2.3",
            Settings(tls_cert="c", tls_key="k", cluster_token="t"),
            "the router",
            tokens=True,
        )
    check_exposure(
        "10.1.2.3",
        Settings(tls_cert="c", tls_key="k", cluster_token="t", tokens_file="f"),
        "the router",
        tokens=True,
    )
    check_exposure("10.1.2.3", Settings(allow_insecure=True), "the router", tokens=True)


def test_the_node_client_over_tls(node: str, vault: Vault) -> None:
    args = ("get", "vault", "hits_1m", "hits", KEYS[2])
    ok = run_node(node, vault.router.grpc_address, *args, "--ca", vault.ca)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["windows"][-1]["int_value"] == str(hits(KEYS[2], 1))
    plain = run_node(node, vault.router.grpc_address, *args)  # no CA: plain text, refused
    # no connection is made: the router cannot be reached, as `qstate get` without --ca says
    assert plain.returncode == Exit.UNREACHABLE and plain.stderr.startswith("UNAVAILABLE"), \
        plain.stderr


def test_a_shard_dialled_by_an_address_its_certificate_does_not_name(
        vault: Vault, tmp_path: Path) -> None:
    """Shards register addresses (pod IPs) that no shared certificate names: dialled there,
    TLS fails, unless ``tls_server_name`` names what the certificate does."""
    env = {**vault.env, "QSTATE_SHARD_HOST": "127.0.0.2"}  # loopback, but not in the cert
    shard = ShardProcess.make("vault-ip", tmp_path / "data", vault.storage.uri,
                              tmp_path / "logs", env=env)
    shard.host = "127.0.0.2"
    shard.start_and_wait()
    try:
        named = vault.cfg.model_copy(update={"tls_server_name": "localhost"})
        assert refused_then_answered(shard.address, vault.cfg, named,
                                     grpc.StatusCode.UNAVAILABLE) == "vault-ip"
    finally:
        shard.stop()


def test_state_inspect_says_refused_without_the_token_and_reads_it_from_a_file(
        vault: Vault, tmp_path: Path) -> None:
    def inspect(**env: str) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in vault.env.items() if k != "QSTATE_CLUSTER_TOKEN"}
        return subprocess.run(
            qstate_command("state", "inspect", SPEC.job, "--storage", vault.storage.uri,
                           "--json"), capture_output=True, text=True, timeout=60,
            env={**clean, **env})

    import orjson

    out = inspect()
    assert out.returncode == 1
    assert {orjson.loads(line)["state"] for line in out.stdout.splitlines()} == {"refused"}
    assert "QSTATE_CLUSTER_TOKEN" in out.stderr and TOKEN not in out.stderr

    file = tmp_path / "cluster-token"
    file.write_text(TOKEN + "\n")  # as a mounted secret often is: with a line break
    out = inspect(QSTATE_CLUSTER_TOKEN_FILE=str(file))
    assert out.returncode == 0, out.stderr
    rows = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert {(r["state"], r["last_batch"]) for r in rows} == {("ready", 1)} and len(rows) == P

    out = inspect(QSTATE_CLUSTER_TOKEN_FILE=str(tmp_path / "missing"))
    assert out.returncode == 2 and "cluster token file" in out.stderr
