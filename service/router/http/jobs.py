"""What a router serves: the job list (with tokens: what the caller's token may read), a job's
operators and how they stand, the batch that counted a Kafka record, the cluster."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from qstate.core.answer import (
    ClusterInfo,
    ClusterMap,
    JobInfo,
    JobList,
    JobPosition,
    JobSummary,
    OperatorInfo,
    StateInfo,
    WindowInfo,
    error_responses,
)
from qstate.router.cluster import cluster, cluster_map
from qstate.router.http.params import Name
from qstate.router.position import TOPIC_PATTERN
from qstate.router.query import OperatorStatus, QueryService
from qstate.router.wire import JSON

__all__ = ["add_job_routes", "json_response"]


def json_response(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type=JSON)


def _operator(s: OperatorStatus) -> OperatorInfo:
    sp = s.spec
    return OperatorInfo(
        name=sp.operator, key=sp.key,
        states=[StateInfo(name=n, type=t) for n, t in sp.types.items()],
        window=WindowInfo(kind=sp.window.kind, size_ms=sp.window.size_ms,
                          slide_ms=sp.window.slide_ms, gap_ms=sp.window.gap_ms),
        partitions=sp.partitions, partitions_available=s.partitions_available,
        retention_ms=sp.retention_ms, last_batch=s.last_batch, watermark=s.watermark_ms)


def _may_read(request: Request, job: str, operator: str | None = None) -> bool:
    """Whether the request's token (``qstate.router.auth`` leaves it in the request's state
    when the router asks for tokens) may read ``job`` (``operator``)."""
    principal = getattr(request.state, "principal", None)
    return principal is None or principal.allows(job, operator)


def add_job_routes(app: FastAPI, query: QueryService) -> None:
    errors = error_responses()

    @app.get("/v1/jobs", response_model=JobList, responses=errors,
             summary="Jobs whose state is queryable (with tokens: those the token may read)")
    async def list_jobs(request: Request) -> Any:
        jobs = await query.jobs()
        return json_response(JobList(jobs=[
            JobSummary(name=j, operators=[s.operator for s in specs
                                          if _may_read(request, j, s.operator)])
            for j, specs in jobs.items() if _may_read(request, j)]))

    @app.get("/v1/jobs/{job}", response_model=JobInfo, responses=errors,
             summary="Operators, states, windows, partitions, last batch and watermark")
    async def describe_job(request: Request, job: Name) -> Any:
        ops = await query.describe_job(job)
        return json_response(JobInfo(name=job, operators=[
            _operator(s) for s in ops if _may_read(request, job, s.spec.operator)]))

    @app.get("/v1/jobs/{job}/position", response_model=JobPosition, responses=errors,
             summary="The batch that counted a Kafka record: read with min_batch=<it> to "
                     "read your own writes")
    async def job_position(
            job: Name,
            topic: Annotated[str, Query(pattern=TOPIC_PATTERN,
                                        description="The Kafka topic the job reads")],
            partition: Annotated[int, Query(ge=0, description="The record's partition")],
            offset: Annotated[int, Query(ge=0, lt=2**63, description="The record's offset, "
                                         "as the producer's delivery report gives it")]
    ) -> Any:
        p = await query.position(job, topic, partition, offset)
        return json_response(JobPosition(job=p.job, topic=p.topic, partition=p.partition,
                                         offset=p.offset, batch=p.batch,
                                         end_offset=p.end_offset))

    @app.get("/v1/cluster", response_model=ClusterInfo,
             summary="Shard servers, their partitions and how each stands: state, last batch, "
                     "watermark, freshness")
    async def describe_cluster() -> Any:
        await query.routing.refresh()
        return json_response(await cluster(query.routing, query.describer))

    @app.get("/v1/cluster/{job}", response_model=ClusterMap, responses=errors,
             summary="Where each partition of the job is read: its owner and followers, "
                     "their readiness and the routers on their nodes, at the assignment "
                     "epoch (what a client caches to ask each key without a hop)")
    async def describe_cluster_map(request: Request, job: Name) -> Any:
        ops = await query.describe_job(job)  # the job known (a 404 naming it, else)
        readable = {s.spec.operator for s in ops if _may_read(request, job, s.spec.operator)}
        return json_response(await cluster_map(query.routing, query.describer, job, readable))
