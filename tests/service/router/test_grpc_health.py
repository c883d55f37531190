"""gRPC reflection and health on the router and the shards (issue 27): a generic client lists
the services and calls ``Get`` knowing no proto file; ``grpc.health.v1.Health`` says SERVING
when the process is ready (a router once it has a job to route to, a shard with no partition
restoring), NOT_SERVING otherwise, and a shard answers it without the cluster token.
Each change of status is awaited on ``Health/Watch`` (a stream with a deadline), as a probe
that follows a process sees it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.records import paths
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from tests.batches import commit_values
from tests.helpers import wait_until
from tests.shop import BATCHES, KEYS, Shop, views

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
ROUTER = qpb.DESCRIPTOR.services_by_name["QueryableState"].full_name
SHARD = pb.DESCRIPTOR.services_by_name["Shard"].full_name
# an operator of two partitions, on one shard server
SPEC = OperatorSpec("health", "counts", "k", {"n": "long"}, partitions=2,
                    window=WindowSpec("tumbling", 60_000))


def status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_a_generic_client_lists_the_services_and_reads_a_key_without_the_protos(
        shop: Shop) -> None:
    router = shop.routers["local"]
    with grpc.insecure_channel(router.grpc_address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = set(db.get_services())
        assert {"qstate.v1.QueryableState", "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection"} <= services, services
        pool = descriptor_pool.DescriptorPool(db)  # nothing of qstate's own stubs
        get = pool.FindServiceByName("qstate.v1.QueryableState").FindMethodByName("Get")
        request_cls = message_factory.GetMessageClass(get.input_type)
        reply_cls = message_factory.GetMessageClass(get.output_type)
        call = ch.unary_unary("/qstate.v1.QueryableState/Get",
                              request_serializer=request_cls.SerializeToString,
                              response_deserializer=reply_cls.FromString)
        reply = call(request_cls(job="shop", operator="views_1m", state="views", key=KEYS[0]),
                     timeout=10)
    assert reply.windows[-1].int_value == views(KEYS[0], BATCHES - 1)
    assert status(router.grpc_address) == SERVING
    assert status(router.grpc_address, ROUTER) == SERVING


def until(stream: Iterator[health_pb2.HealthCheckResponse], want: int, what: str) -> list[str]:
    """The statuses a ``Health/Watch`` stream sends, up to ``want``; its deadline passing
    first fails the test, naming ``what``."""
    seen: list[str] = []
    try:
        for r in stream:
            seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
            if r.status == want:
                return seen
    except grpc.RpcError as exc:
        code = exc.code().name  # type: ignore[attr-defined]
        raise AssertionError(f"{what}: {code} after {seen}") from None
    raise AssertionError(f"{what}: the stream ended after {seen}")


def watch_health(ch: grpc.Channel, service: str = "") -> Iterator[health_pb2.HealthCheckResponse]:
    return health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=service),
                                                timeout=30)


def test_a_router_is_not_serving_until_a_job_registers_then_serving(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "storage"))
    r = RouterProcess.make(storage.uri, tmp_path / "logs", "lonely").start_and_wait()
    try:
        with grpc.insecure_channel(r.grpc_address) as ch:
            stream = watch_health(ch)
            until(stream, NOT_SERVING, "the router NOT_SERVING with no job to route to")
            assert status(r.grpc_address, ROUTER) == NOT_SERVING
            save_spec(storage, SPEC)  # a job registers its operator as it starts
            assert until(stream, SERVING, "the router SERVING once it knows the job") == [
                "SERVING"]
            assert status(r.grpc_address, ROUTER) == SERVING
            stream.cancel()  # type: ignore[attr-defined]
    finally:
        r.stop()


def restoring(address: str) -> dict[int, bool]:
    """The shard's partitions of SPEC: whether each is restoring."""
    clients = ShardClients()
    try:
        return {p.partition: p.restoring for p in clients.describe(address, 5).partitions
                if (p.job, p.operator) == (SPEC.job, SPEC.operator)}
    finally:
        clients.close()


def test_a_shard_is_not_serving_while_a_partition_restores_then_serving(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "storage"))
    save_spec(storage, SPEC)
    env = {**os.environ, "QSTATE_RESTORE_RETRY_S": "0.2"}  # a failed restore tried again soon

    def shard(disk: str, port: int = 0) -> ShardProcess:
        return ShardProcess.make("h0", tmp_path / disk, storage.uri, tmp_path / "logs",
                                 port, env).start_and_wait()
    s = shard("disk0")
    try:
        coordinator = Coordinator(storage, SPEC.job, [s.address])
        coordinator.register(SPEC)
        wait_until(lambda: restoring(s.address) == {0: False, 1: False}, 30,
                   "the shard serving both partitions")
        values = {k: i + 1 for i, k in enumerate(f"k{i}" for i in range(20))}
        assert {partition_of(k, 2) for k in values} == {0, 1}
        commit_values(coordinator, SPEC, 0, 0, values)
        coordinator.stop()
        s.stop()
        # its disk lost, the shard comes back and restores from checkpoint storage; partition
        # 0's delta file cannot be read until the test puts it back (the restore retries)
        delta = Path(storage.full(paths.delta(PartitionId(SPEC.job, SPEC.operator, 0), 0, 0)))
        away = delta.rename(delta.with_name(delta.name + ".away"))
        s = shard("disk1", s.port)
        with grpc.insecure_channel(s.address) as ch:
            stream = watch_health(ch)
            until(stream, NOT_SERVING, "the shard NOT_SERVING while partition 0 restores")
            # and that is why (partition 1 may still be restoring when the status turns)
            wait_until(lambda: restoring(s.address) == {0: True, 1: False}, 30,
                       "partition 0 restoring, partition 1 restored")
            assert status(s.address, SHARD) == NOT_SERVING
            away.rename(delta)
            assert until(stream, SERVING, "the shard SERVING once restored") == ["SERVING"]
            assert restoring(s.address) == {0: False, 1: False}
            assert status(s.address, SHARD) == SERVING
            stream.cancel()  # type: ignore[attr-defined]
        clients = ShardClients()  # what it restored is what was committed
        try:
            got = clients.stub(s.address).MultiGet(pb.LookupRequest(
                job=SPEC.job, operator=SPEC.operator, state="n", keys=[
                    pb.KeyQuery(key=k, partition=partition_of(k, 2)) for k in values]),
                timeout=10)
        finally:
            clients.close()
        assert {r.key: r.windows[-1].int_value for r in got.results} == values
    finally:
        s.stop()


def test_a_shard_answers_health_without_the_cluster_token(shop: Shop, tmp_path: Path) -> None:
    env = {**os.environ, "QSTATE_CLUSTER_TOKEN": "sekrit-token"}
    s = ShardProcess.make("guarded", tmp_path / "data", str(tmp_path / "storage"),
                          tmp_path / "logs", env=env).start_and_wait()
    try:
        wait_until(lambda: status(s.address) == SERVING, 10, "the shard SERVING")
        assert status(s.address, SHARD) == SERVING
        with grpc.insecure_channel(s.address) as ch, pytest.raises(grpc.RpcError) as err:
            pb_grpc.ShardStub(ch).Describe(pb.DescribeRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    finally:
        s.stop()
