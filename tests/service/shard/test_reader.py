"""The owner's reader (docs/architecture.md §5, cluster reads), with real shard servers and a
router that reads every key over the hop (``--no-local-reads``, as a router on another host
would): live reads of a server that registered a reader are answered there, natively (its
``qstate_shard_reader_keys_total`` counts them, its Python ``MultiGet`` none), those of a
server without one (``QSTATE_SHARD_READER=false``) by its Python ``MultiGet``, and both
answers equal the truth counted from the events committed. Called directly, the reader
refuses what the shard's own port refuses: a call without the cluster token, a savepoint
(read by the server's own port), an unknown state, a key outside its partition; a partition
it does not hold is NOT_OWNED, and any other method is UNIMPLEMENTED."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import grpc
import httpx
import pyarrow as pa
import pytest

from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.config import settings
from qstate.core.records import delta as deltas
from qstate.core.records.assignment import ServerInfo, list_servers, load_assignment
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.security import cluster_token, shard_settings
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.jobs.runtime.commit import Committer
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from tests.helpers import metric, wait_until
from tests.service.shard.sim import STATES, partials

P = 4
JOB = "reader-job"
KEYS = [f"k{i}" for i in range(40)] + ["ü/é key", "a b"]


@dataclass
class Cluster:
    storage: Storage
    native: ShardProcess
    python: ShardProcess
    router: RouterProcess
    spec: OperatorSpec
    truth: Counter[str]

    def info(self, shard: ShardProcess) -> ServerInfo:
        return next(i for i in list_servers(self.storage) if i.address == shard.address)

    def owned_by(self, shard: ShardProcess) -> list[int]:
        a = load_assignment(self.storage, JOB)
        return [p for p in range(P) if a.owner("op", p) == shard.address]


def _ready(shards: list[ShardProcess]) -> bool:
    clients = ShardClients()
    try:
        ready = {p.partition for s in shards for p in clients.describe(s.address).partitions
                 if p.job == JOB and not p.restoring}
    finally:
        clients.close()
    return ready == set(range(P))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("reader")
    storage = Storage(str(tmp / "storage"))
    native = ShardProcess.make("rd-native", tmp / "data", storage.uri, tmp / "logs")
    python = ShardProcess.make("rd-python", tmp / "data", storage.uri, tmp / "logs",
                               env={"QSTATE_SHARD_READER": "false"})
    for s in (native, python):
        s.start_and_wait()
    spec = OperatorSpec(JOB, "op", "k", dict(STATES), partitions=P,
                        window=WindowSpec("tumbling", 10_000))
    save_spec(storage, spec)
    coord = Coordinator(storage, JOB, [native.address, python.address])
    coord.register(spec)
    wait_until(functools.partial(_ready, [native, python]), 30, "the shards serving the job")
    truth: Counter[str] = Counter()
    for batch in range(3):
        events = [(KEYS[(batch * 7 + i * 3) % len(KEYS)], 5, i, i) for i in range(50)]
        truth.update(e[0] for e in events)
        table = partials(spec, events, -1)
        written = {}
        for p in range(P):
            mine = table.filter(pa.array([partition_of(k, P) == p
                                          for k in table.column("key").to_pylist()], pa.bool_()))
            deltas.write_delta(storage, PartitionId(JOB, "op", p), batch, mine)
            written[p] = {0: mine.num_rows}
        Committer(coord).commit(spec, batch, 0, written)
    coord.stop()
    router = RouterProcess.make(storage.uri, tmp / "logs", "rd-hop", None, "--no-local-reads")
    router.start_and_wait()
    try:
        yield Cluster(storage, native, python, router, spec, truth)
    finally:
        router.stop()
        for s in (native, python):
            s.stop()


def _metrics(storage: Storage, shard: ShardProcess) -> str:
    return "http://" + next(i.metrics for i in list_servers(storage)
                            if i.address == shard.address)


def test_live_reads_are_answered_by_the_reader_where_there_is_one(cluster: Cluster) -> None:
    assert cluster.info(cluster.native).reader, "a server with a reader registers it"
    assert not cluster.info(cluster.python).reader
    assert cluster.owned_by(cluster.native) and cluster.owned_by(cluster.python)
    native_url = _metrics(cluster.storage, cluster.native)
    python_url = _metrics(cluster.storage, cluster.python)
    # the router must know the reader before a read goes there
    wait_until(lambda: httpx.get(f"{cluster.router.url}/v1/state/{JOB}/op/n/k0").status_code
               == 200, 30, "the router answering")
    before = {s: metric(u, "qstate_shard_lookup_keys_total", status="FOUND")
              for s, u in (("native", native_url), ("python", python_url))}
    read_before = metric(native_url, "qstate_shard_reader_keys_total", status="FOUND")
    calls_before = {m: metric(native_url, m) for m in (
        "qstate_shard_reader_calls_total", "qstate_shard_reader_seconds_count")}
    owners = {k: partition_of(k, P) for k in KEYS}
    on_native = {k for k, p in owners.items() if p in cluster.owned_by(cluster.native)}
    for key in KEYS:
        r = httpx.get(f"{cluster.router.url}/v1/state/{JOB}/op/n/{quote(key, safe='')}")
        assert r.status_code == 200, r.text
        assert r.json()["windows"][0]["value"] == cluster.truth[key], key
    batch = httpx.post(f"{cluster.router.url}/v1/state/{JOB}/op/n:batchGet",
                       json={"keys": [*KEYS, "never-seen"]}).json()["results"]
    assert [(a["key"], a["found"]) for a in batch] == [(k, True) for k in KEYS] + \
        [("never-seen", False)]
    assert [a["windows"][0]["value"] for a in batch[:-1]] == [cluster.truth[k] for k in KEYS]
    # the native server's keys: by its reader
    assert metric(native_url, "qstate_shard_reader_keys_total", status="FOUND") - \
        read_before == 2 * len(on_native)
    assert metric(native_url, "qstate_shard_lookup_keys_total", status="FOUND") == \
        before["native"], "no live read reached the native server's Python MultiGet"
    # each of the reader's calls timed, on the bounds of the Python MultiGet's histogram
    calls = {m: metric(native_url, m) - n for m, n in calls_before.items()}
    assert calls["qstate_shard_reader_calls_total"] > 0
    assert calls["qstate_shard_reader_seconds_count"] == calls["qstate_shard_reader_calls_total"]
    assert metric(native_url, "qstate_shard_reader_seconds_sum") > 0
    assert metric(python_url, "qstate_shard_lookup_keys_total", status="FOUND") - \
        before["python"] >= 2 * (len(KEYS) - len(on_native))


def _reader(cluster: Cluster) -> pb_grpc.ShardStub:
    channel = grpc.insecure_channel(cluster.info(cluster.native).reader)
    return pb_grpc.ShardStub(channel)


def _token() -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {cluster_token(shard_settings(settings(), '127.0.0.1'))}")]


def _lookup(cluster: Cluster, keys: list[str], **kw: object) -> pb.LookupRequest:
    fields = {"job": JOB, "operator": "op", "state": "n", **kw}
    return pb.LookupRequest(keys=[pb.KeyQuery(key=k, partition=partition_of(k, P)) for k in keys],
                            **fields)  # type: ignore[arg-type]


def test_the_reader_answers_and_refuses_as_the_shard_does(cluster: Cluster) -> None:
    stub = _reader(cluster)
    mine = [k for k in KEYS if partition_of(k, P) in cluster.owned_by(cluster.native)]
    theirs = [k for k in KEYS if partition_of(k, P) in cluster.owned_by(cluster.python)]
    never = next(f"never-{i}" for i in range(100)
                 if partition_of(f"never-{i}", P) in cluster.owned_by(cluster.native))
    reply = stub.MultiGet(_lookup(cluster, [*mine, theirs[0], never]), metadata=_token(),
                          timeout=10)
    got = [(r.key, pb.KeyStatus.Name(r.status)) for r in reply.results]
    assert got == [(k, "FOUND") for k in mine] + [(theirs[0], "NOT_OWNED"), (never, "ABSENT")]
    assert [r.windows[0].int_value for r in reply.results[:len(mine)]] == \
        [cluster.truth[k] for k in mine]
    assert {r.batch for r in reply.results[:len(mine)]} == {2}

    def refused(request: pb.LookupRequest, metadata: list[tuple[str, str]]) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as e:
            stub.MultiGet(request, metadata=metadata, timeout=10)
        return e.value

    e = refused(_lookup(cluster, mine[:1]), [])
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED
    e = refused(_lookup(cluster, mine[:1]), [("authorization", "Bearer not-the-token")])
    assert e.code() == grpc.StatusCode.UNAUTHENTICATED
    e = refused(_lookup(cluster, mine[:1], savepoint="sp1"), _token())
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "savepoint" in (e.details() or "")
    e = refused(_lookup(cluster, mine[:1], state="nope"), _token())
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert dict(e.trailing_metadata() or ())["qstate-error"] == "UnknownOperator"
    wrong = pb.LookupRequest(job=JOB, operator="op", state="n",
                             keys=[pb.KeyQuery(key=mine[0], partition=(partition_of(mine[0], P)
                                                                       + 1) % P)])
    e = refused(wrong, _token())
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "not in partition" in (e.details()
                                                                                   or "")
    with pytest.raises(grpc.RpcError) as d:
        stub.Describe(pb.DescribeRequest(), metadata=_token(), timeout=10)
    assert d.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # an operator this server holds nothing of: NOT_OWNED, as the shard's own port says
    other = pb.LookupRequest(job="other-job", operator="op", state="n",
                             keys=[pb.KeyQuery(key="k", partition=0)])
    assert [r.status for r in stub.MultiGet(other, metadata=_token(), timeout=10).results] == \
        [pb.NOT_OWNED]
