"""Prometheus metrics of a router (no per-key labels: routes are templates)."""

from prometheus_client import Counter, Histogram

__all__ = ["GRPC_LATENCY", "GRPC_REQUESTS", "HTTP_LATENCY", "HTTP_REQUESTS", "LOCAL_READS",
           "REMOTE_READS", "SHARD_READS"]

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

HTTP_REQUESTS = Counter("qstate_router_http_requests_total", "HTTP requests",
                        ["route", "status"])
HTTP_LATENCY = Histogram("qstate_router_http_request_seconds", "HTTP request latency",
                         ["route"], buckets=_BUCKETS)
GRPC_REQUESTS = Counter("qstate_router_grpc_requests_total", "gRPC requests", ["method", "code"])
GRPC_LATENCY = Histogram("qstate_router_grpc_request_seconds", "gRPC latency", ["method"],
                         buckets=_BUCKETS)
SHARD_READS = Counter("qstate_router_shard_reads_total",
                      "Key lookups by path: in-process from a co-located shard, or over gRPC",
                      ["path"])
LOCAL_READS, REMOTE_READS = SHARD_READS.labels("local"), SHARD_READS.labels("grpc")
