"""gRPC reflection and health on the router and the shards (issue 27): a generic client lists
the services and calls ``Get`` knowing no proto file; ``grpc.health.v1.Health`` says SERVING
when the process is ready (a router with an assignment, a shard with no partition
restoring), NOT_SERVING otherwise, and a shard answers it without the cluster token."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from qstate.core.storage import Storage
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from tests.helpers import wait_until
from tests.shop import BATCHES, KEYS, Shop, views

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


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
    assert status(router.grpc_address, "qstate.v1.QueryableState") == SERVING


def test_a_router_with_no_assignment_is_not_serving(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "empty"))
    r = RouterProcess.make(storage.uri, tmp_path / "logs", "lonely").start_and_wait()
    try:
        assert status(r.grpc_address) == NOT_SERVING
    finally:
        r.stop()


def test_a_shard_answers_health_without_the_cluster_token(shop: Shop, tmp_path: Path) -> None:
    import os
    env = {**os.environ, "QSTATE_CLUSTER_TOKEN": "sekrit-token"}
    s = ShardProcess.make("guarded", tmp_path / "data", str(tmp_path / "storage"),
                          tmp_path / "logs", env=env).start_and_wait()
    try:
        wait_until(lambda: status(s.address) == SERVING, 10, "the shard SERVING")
        assert status(s.address, "qstate.shard.v1.Shard") == SERVING
        with grpc.insecure_channel(s.address) as ch, pytest.raises(grpc.RpcError) as err:
            pb_grpc.ShardStub(ch).Describe(pb.DescribeRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    finally:
        s.stop()
