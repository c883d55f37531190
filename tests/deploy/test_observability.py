"""The monitoring kit against real processes (Grafana's own server cannot be installed here,
so what its panels would read is checked where it is served):

- every Infinity panel and variable of the live-counts dashboard, its variables substituted
  the way Grafana and the plugin do, answered 200 by a real router with the fields the panel
  selects, and the values equal to what was committed;
- every PromQL expression of every panel, the overview's variable, and every series an alert
  reads, returning series from a real Prometheus run with deploy/prometheus/prometheus.yml
  and scraping real shard and router processes through a file_sd targets file written as
  `make run` writes it; the job's panels and alerts with a Spark job running (marked spark).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import httpx
import pytest
from confluent_kafka import Producer
from httpx_sse import connect_sse

from qstate.core.config import Settings
from qstate.core.records.assignment import list_servers
from qstate.core.records.storage import Storage
from qstate.core.transport import security
from qstate.embedded.ports import free_port
from qstate.embedded.procs import RouterProcess, ShardProcess
from qstate.embedded.prometheus import Target, write_targets
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from qstate.proto import shard_pb2 as pb
from qstate.proto import shard_pb2_grpc as pb_grpc
from tests.deploy.kit import (
    MISSING,
    Prometheus,
    alert_rules,
    dashboards,
    datasources,
    infinity_request,
    infinity_rows,
    interpolate,
    prom_exprs,
    selectors,
    targets,
)
from tests.helpers import wait_until
from tests.shop import (
    BATCHES,
    BIG,
    KEYS,
    MANY,
    SPEC,
    WINDOW,
    P,
    Shop,
    start_shop,
    views,
    window,
)

RATE = "5m"  # $__rate_interval: a window that holds every sample since Prometheus started
# series only a running job exports, and the scrape of a job process
NEEDS_JOB = re.compile(r'\bqstate_(job|sink)_|role="job"')
ROUTER_DS = "qstate-router"


@dataclass
class Kit:
    shop: Shop
    batches: int  # committed so far: 0 .. batches - 1, each the truth of tests/shop.py


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    """A shop of its own: the test kills a shard and commits more batches."""
    shop = start_shop(tmp_path_factory.mktemp("kit-shop"))
    try:
        yield Kit(shop, BATCHES)
    finally:
        shop.stop()


# ---- Infinity: the live-counts dashboard against a real router ------------------------------

def resolve_variables(dashboard: dict, base: str, chosen: dict[str, str | list[str]]
                      ) -> dict[str, str | list[str]]:
    """Each variable in dashboard order: a query variable's options read from the router
    (the value ``chosen`` must be among them), the others set to ``chosen``."""
    values: dict[str, str | list[str]] = {}
    for var in dashboard["templating"]["list"]:
        name = var["name"]
        if var["type"] == "query":
            assert var["datasource"]["uid"] == ROUTER_DS
            query = var["query"]["infinityQuery"]
            req = infinity_request(query, base, values)
            r = httpx.request(req.method, req.url, params=req.params, timeout=10)
            assert r.status_code == 200, (name, req, r.text)
            options = [row[name] for row in infinity_rows(query, r.json(), values)]
            assert chosen[name] in options, (name, options)
        values[name] = chosen[name]
    return values


# the dashboards' panels over a shop of their own: `make soak` (CI; §9)
@pytest.mark.long
def test_infinity_panels_answer_what_was_committed(kit: Kit) -> None:
    d = dashboards()["qstate-live-counts.json"]
    router = kit.shop.routers["local"]
    assert datasources()[ROUTER_DS]["url"] == "http://127.0.0.1:8000"  # make run's router
    key = "ünï/cødé key"  # percent-encoded into the path
    keys = [KEYS[0], BIG, "never-written"]
    values = resolve_variables(d, router.url, {
        "job": SPEC.job, "operator": SPEC.operator, "state": "views", "key": key,
        "keys": keys})
    values |= {"__from": "0", "__to": str(kit.batches * WINDOW)}  # epoch ms, as Grafana
    last = kit.batches - 1
    want = {
        "${key}: current window": [{"value": views(key, last)}],
        "As of": [{"batch": last, "watermark": last * WINDOW, "partitions answering": P,
                   "partitions": P}],
        "${key}: windows in the time range": [
            {"window start": window(b)[0], "value": views(key, b)} for b in range(kit.batches)],
        "Top 10 now": [{"key": k, "value": views(k, last)} for k in sorted(
            KEYS + MANY, key=lambda k: (-views(k, last), k))[:10]],
        "Keys: current window": [
            {"key": k, "found": k != "never-written",
             "value": views(k, last) if k != "never-written" else MISSING,
             "window start": window(last)[0] if k != "never-written" else MISSING,
             "batch": last} for k in keys],
    }
    seen = set()
    for title, target in targets(d, "yesoreyeram-infinity-datasource"):
        req = infinity_request(target, router.url, values)
        r = httpx.request(req.method, req.url, params=req.params, content=req.body,
                          headers={"content-type": "application/json"} if req.body else {},
                          timeout=10)
        assert r.status_code == 200, (title, req, r.text)
        rows = infinity_rows(target, r.json(), values)
        for column in target["columns"]:  # every field the panel selects is in the answer
            assert any(row[column["text"]] is not MISSING for row in rows), (title, column)
        assert rows == want[title], title
        seen.add(title)
    assert seen == set(want)


# ---- Prometheus: every panel and alert query on a real scrape -------------------------------

def panel_exprs(job: str) -> list[tuple[str, str]]:
    """(where, PromQL) of every Prometheus panel, variables as Grafana substitutes them."""
    out = []
    for name, d in dashboards().items():
        for title, expr in prom_exprs(d):
            out.append((f"{name}: {title}",
                        interpolate(expr, {"job": job, "__rate_interval": RATE}, "regex")))
    return out


def alert_selectors() -> list[tuple[str, str]]:
    return [(rule["alert"], s) for rule in alert_rules() for s in selectors(rule["expr"])]


def not_answered(prom: Prometheus, exprs: list[tuple[str, str]], finite: bool) -> list[str]:
    """Those of ``exprs`` that return no series (or, ``finite``, only NaN: a rate or a
    quantile over no increase)."""
    out = []
    for where, expr in exprs:
        values = [float(s["value"][1]) for s in prom.query(expr)]
        if not values or (finite and not any(math.isfinite(v) for v in values)):
            out.append(f"{where}: {expr}")
    return out


def wait_answered(prom: Prometheus, exprs: list[tuple[str, str]], finite: bool,
                  timeout: float = 60) -> None:
    left = list(exprs)

    def done() -> bool:
        left[:] = [e for e in left if not_answered(prom, [e], finite)]
        return not left

    try:
        wait_until(done, timeout, "every expression answered")
    except AssertionError:
        raise AssertionError("no series (or only NaN) from a real Prometheus after "
                             f"{timeout:.0f}s:\n  " + "\n  ".join(
                                 f"{w}: {e}" for w, e in left)) from None


def address(url: str) -> str:
    return url.removeprefix("http://")


def shop_targets(shop: Shop) -> list[Target]:
    return [*(Target("shard", s.name, address(shop.metrics_url(s))) for s in shop.shards),
            *(Target("router", r.name, address(r.url)) for r in shop.routers.values())]


def traffic(shop: Shop) -> None:
    """What dashboards and clients ask: HTTP through both routers (state, series, range,
    batchGet, jobs, a 404, a 400) and gRPC."""
    for router in shop.routers.values():
        with httpx.Client(base_url=router.url, timeout=10) as c:
            for k in KEYS[:20]:
                assert c.get(f"/v1/state/shop/views_1m/views/{k}").status_code == 200
                assert c.get(f"/v1/series/shop/views_1m/views/{k}",
                             params={"from": "now-30000w"}).status_code == 200
            assert c.post("/v1/state/shop/views_1m/views:batchGet",
                          json={"keys": KEYS[:50]}).status_code == 200
            assert c.get("/v1/jobs/shop").status_code == 200
            assert c.get("/v1/state/shop/views_1m/views/never-written").status_code == 404
            assert c.get("/v1/state/shop/views_1m/views/k", params={"from": "x"}
                         ).status_code == 400
        with grpc.insecure_channel(router.grpc_address) as ch:
            stub = qpb_grpc.QueryableStateStub(ch)
            stub.Get(qpb.GetRequest(job="shop", operator="views_1m", state="views",
                                    key=KEYS[0]), timeout=10)
            stub.MultiGet(qpb.MultiGetRequest(job="shop", operator="views_1m", state="views",
                                              keys=KEYS[:50]), timeout=10)


@contextmanager
def watching(shop: Shop, through: int) -> Iterator[None]:
    """A board watch (SSE, ``top=10``) open on each router while the block commits, read
    until an event of batch ``through``: the events after the first carry the commit they
    follow, so the watch panels' delay has samples."""
    opened = [threading.Event() for _ in shop.routers]
    got: list[list[dict]] = [[] for _ in shop.routers]
    failed: list[BaseException] = []

    def read(url: str, first: threading.Event, events: list[dict]) -> None:
        try:
            with httpx.Client(base_url=url, timeout=httpx.Timeout(10, read=60)) as c, \
                    connect_sse(c, "GET", f"/v1/watch/{SPEC.job}/{SPEC.operator}/views",
                                params={"top": 10}) as es:
                for sse in es.iter_sse():
                    if not sse.data:  # a ping (qstate.client._watch_event)
                        continue
                    events.append(json.loads(sse.data))
                    first.set()
                    if events[-1]["batch"] >= through:
                        return
        except BaseException as exc:
            failed.append(exc)
            first.set()

    threads = [threading.Thread(target=read, args=(r.url, o, e), daemon=True)
               for r, o, e in zip(shop.routers.values(), opened, got, strict=True)]
    for t in threads:
        t.start()
    for o in opened:
        assert o.wait(30), "a watch's first event"
    assert not failed, failed
    yield
    for t in threads:
        t.join(60)
    assert not failed, failed
    assert not any(t.is_alive() for t in threads), "a watch never reached the last batch"
    for events in got:
        assert any(e["committed_at"] is not None for e in events[1:]), events


def refused_commit(shop: Shop, shard: ShardProcess, batch: int) -> None:
    """A commit from a stale writer (epoch 0): the shard refuses it."""
    part = next(p for p in range(P)
                if shop.coordinator.assignment.owner(SPEC.operator, p) == shard.address)
    req = pb.CommitRequest(job=SPEC.job, operator=SPEC.operator, batch=batch,
                           watermark_ms=batch * WINDOW, epoch=0)
    req.partitions.add(partition=part, has_delta=False)
    # a stale writer of this deployment holds its cluster token (the host's, from home)
    with security.channel(shard.address, Settings(), []) as ch, \
            pytest.raises(grpc.RpcError) as err:
        pb_grpc.ShardStub(ch).Commit(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.ABORTED


# a real Prometheus scraping a shop: `make soak` (CI; docs/architecture.md §9)
@pytest.mark.long
def test_every_shard_and_router_query_answers_on_a_real_prometheus(kit: Kit,
                                                                   tmp_path: Path) -> None:
    shop = kit.shop
    targets_file = tmp_path / "targets.json"
    write_targets(targets_file, shop_targets(shop))
    with Prometheus(tmp_path, targets_file) as prom:
        wait_until(lambda: prom.all_up({t.address for t in shop_targets(shop)}), 30,
                   "every shard and router scraped")
        # a shard down: reads of its keys answer 503 / UNAVAILABLE, counted by reason
        down = shop.shards[0]
        with shop.shard_down(down) as key:
            for router in shop.routers.values():
                r = httpx.get(f"{router.url}/v1/state/shop/views_1m/views/{key}", timeout=10)
                assert r.status_code == 503, r.text
            with grpc.insecure_channel(shop.routers["grpc"].grpc_address) as ch, \
                    pytest.raises(grpc.RpcError) as err:
                qpb_grpc.QueryableStateStub(ch).Get(qpb.GetRequest(
                    job="shop", operator="views_1m", state="views", key=key), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # back on another metrics port: the targets file is rewritten, as make run does
        write_targets(targets_file, shop_targets(shop))
        wait_until(lambda: prom.all_up({t.address for t in shop_targets(shop)}), 30,
                   "the restarted shard scraped at its new address")
        # batches committed and read (and watched) while Prometheus scrapes
        with watching(shop, through=kit.batches + 2):
            for _ in range(3):
                shop.commit(kit.batches)
                kit.batches += 1
                traffic(shop)
        refused_commit(shop, shop.shards[1], kit.batches)

        mine = [e for e in panel_exprs(".*") if not NEEDS_JOB.search(e[1])]
        assert len(mine) >= 10
        wait_answered(prom, mine, finite=True)
        wait_answered(prom, [e for e in alert_selectors() if not NEEDS_JOB.search(e[1])],
                      finite=False)
        for rule in alert_rules():  # each alert's expression evaluates
            prom.query(rule["expr"])
        assert prom.label_values("job", "qstate_shard_partitions") == ["shop"]  # $job
        # honor_labels: a qstate job's series keep job=<the qstate job>, the process is
        # told by role; series without a job label get the scrape job's name
        shard_series = prom.query("qstate_shard_partitions")
        assert {(s["metric"]["job"], s["metric"]["role"]) for s in shard_series} == {
            ("shop", "shard")}
        assert {s["metric"]["job"] for s in prom.query('up{role="router"}')} == {"qstate"}
        assert {s["metric"]["process"] for s in prom.query("up")} == \
            {"shop0", "shop1", "shop-local", "shop-grpc"}


# ---- with a job running (Spark) -------------------------------------------------------------

def scraped(prom: Prometheus, job: str, batch: int) -> bool:
    """Prometheus holds the job's last batch at ``batch`` or later."""
    return any(float(s["value"][1]) >= batch
               for s in prom.query(f'qstate_job_last_batch{{job="{job}"}}'))


@pytest.mark.long  # ~50 s of a Spark job under Prometheus: `make soak`, which CI runs
def test_every_query_answers_with_a_job_running(spark, broker, topic: str, tmp_path: Path,
                                                storage_uri: str, shards: list[ShardProcess],
                                                router: RouterProcess) -> None:
    """The job's panels and alerts, on a Prometheus scraping a job, the shards and a router:
    a tweets job (this process's Spark session, its metrics served as `qstate job` serves
    them, watched as `qstate job` watches it) reading events and a record it dead-letters,
    committing to the session's shards."""
    from prometheus_client import start_http_server

    from qstate.embedded.generate import produce
    from qstate.jobs.examples.workloads import Tweets, events_over_span
    from qstate.jobs.job import JobContext
    from qstate.jobs.runtime.launch import start_job
    from qstate.jobs.runtime.supervise import watch

    job = f"kit{topic[-6:]}"
    cfg = JobContext(broker.bootstrap, storage_uri, tmp_path / "ckpt", 4, "0 seconds",
                     max_rows_per_trigger=2_000, topic=topic, job=job,
                     shards=[s.address for s in shards])
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1")
    by_address = {i.address: i.metrics for i in list_servers(Storage(storage_uri))}
    processes = [Target("job", "pytest", f"127.0.0.1:{port}"),
                 Target("router", router.name, address(router.url)),
                 *(Target("shard", s.name, by_address[s.address]) for s in shards)]
    targets_file = tmp_path / "targets.json"
    write_targets(targets_file, processes)
    workload = Tweets(keys=200, seed=7)
    stop = threading.Event()
    try:
        with Prometheus(tmp_path, targets_file) as prom:
            wait_until(lambda: prom.all_up({t.address for t in processes}), 60,
                       "the job, the shards and the router scraped")
            running = start_job(spark, "tweets", cfg)
            watcher = threading.Thread(target=watch, args=([running], stop),
                                       kwargs={"every_s": 0.5}, daemon=True)
            watcher.start()
            try:
                now = int(time.time() * 1000)
                for round_ in range(3):
                    produce(broker.bootstrap, topic, events_over_span(
                        workload, 3_000, t0_ms=now - 120_000 + round_ * 30_000,
                        span_ms=30_000, disorder_ms=2_000, seed=round_), progress=False)
                    if round_ == 1:  # a record the job dead-letters (a time of wrong type)
                        bad = Producer({"bootstrap.servers": broker.bootstrap})
                        bad.produce(topic, b'{"tweet_id": "tw-1", "event": "impression", '
                                           b'"time": "soon"}', b"tw-1")
                        assert bad.flush(10) == 0
                    running.process_all_available()
                    batch = max(r.last.batch for r in running.reports.values()
                                if r.last is not None)
                    # scraped after this round's batches: rates see every step
                    wait_until(partial(scraped, prom, job, batch), 30,
                               f"batch {batch} scraped")
                # the shard and router panels are the test above's
                wait_answered(prom, [e for e in panel_exprs(job) if NEEDS_JOB.search(e[1])],
                              finite=True)
                wait_answered(prom, [e for e in alert_selectors() if NEEDS_JOB.search(e[1])],
                              finite=False)
                dead = prom.query(f'qstate_job_dead_lettered_total{{job="{job}"}}')
                assert sum(float(s["value"][1]) for s in dead) == 1
            finally:
                stop.set()
                watcher.join(10)
                running.stop()
    finally:
        server.shutdown()
