"""qstate across hosts (issue 11): Spark standalone with executors on two worker hosts, a
shard server beside each, the driver and the router on hosts of their own (harness.py).

In order, on one cluster under ~2K tweet events/s (out of order, 1% late); long: ``make soak``
(which CI runs after ``make test``) and ``loadtest.cluster`` run them:

1. The job runs there exact: every (key, window) of its three states equals ground truth
   from the generator's delivery log, read through the router on its own host.
2. A worker host's link is cut for 10 s: its shard's partitions move to the other shard
   under a new epoch and answer again; the link back, the host rejoins under another epoch.
   No split brain: no reader ever sees a value go down or above the truth, 0 lost, 0
   doubled.
3. A whole worker host is killed (kill -9 of its Spark worker, executors and shard server):
   Spark runs its tasks on the other worker, the shard's partitions are restored on the
   other shard; exact afterwards; the host restarted rejoins.
Between 1 and 2, clients that follow the cluster map (issue 55): a direct client's reads are
all answered in-process by the router of the key's owner's host (router-1, router-2), a
plain client's all cross the hop at the router. In 3, a direct and a plain client read
existing keys throughout: never a wrong or empty answer, and both answer again from the new
owner.

Between 2 and 3, planned moves (make-before-break) under a direct and a plain client: a
shard drains and comes back; no reader ever sees an answer older than one it saw, so the
old owner never answered once a partition's epoch changed.

4. Serving outlives the job: with the job stopped, a worker host is killed; the standby
   coordinator (`qstate coordinator`, on the router's host) moves its partitions and every
   key answers, exact, without the driver. The job started again goes on from the standby's
   epoch, and is exact after more load.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from qstate.client import Client
from qstate.core.address import partition_of
from tests.chaos.harness import JOB, ClientReader, Deployment, P, compare, scenario, truth
from tests.cluster.harness import WORKERS, Cluster
from tests.helpers import FAR, metric, wait_until

READS = "qstate_router_shard_reads_total"

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.kafka, pytest.mark.long]


def test_the_job_runs_across_hosts_exact(cluster) -> None:
    c, gen = cluster
    time.sleep(15)  # load
    gen.pause()
    assert gen.error is None, gen.error
    c.drain()
    # the topology is what it says: executors on both worker hosts, a shard on each (at its
    # host's address), the router reading them over the network
    assert c.executor_hosts() == {f"worker-{i}" for i in range(1, WORKERS + 1)}
    assert c.dropped_workers() == 0  # no worker host was dropped while healthy
    shard_hosts = {c.hosts[f"worker-{i}"].address for i in range(1, WORKERS + 1)}
    assert {a.rsplit(":", 1)[0] for a in c.owners().values()} == shard_hosts
    res = compare(c, gen.log)
    assert res["windows"] > 1000
    assert (res["lost"], res["doubled"]) == (0, 0), res
    assert c.router is not None
    assert metric(c.router.url, "qstate_router_shard_reads_total", path="remote") > 0
    assert metric(c.router.url, "qstate_router_shard_reads_total", path="local") == 0
    assert metric(c.job_metrics(), "qstate_job_batches_total", job=JOB) > 0
    for i in range(1, WORKERS + 1):
        assert metric(c.shard_metrics(i), "qstate_shard_partitions", job=JOB,
                      operator="per_tweet_1h", state="serving") > 0


def reads(c: Cluster) -> dict[str, dict[str, float]]:
    """Each router's key lookups so far: in-process (its host's shard) and over the hop."""
    assert c.router is not None
    routers = {"router": c.router, **{f"router-{i}": r for i, r in c.node_routers.items()}}
    return {n: {p: metric(r.url, READS, path=p) for p in ("local", "remote")}
            for n, r in routers.items()}


def existing(log: Path) -> tuple[set[str], dict[tuple[str, int], int]]:
    """Keys with impressions in the events so far, and the impressions per (key, hour)."""
    hourly = truth(log)[0]
    return {k for k, _ in hourly}, hourly


def two_per_partition(keys: set[str]) -> list[str]:
    out: dict[int, list[str]] = {}
    for k in sorted(keys):
        got = out.setdefault(partition_of(k, P), [])
        if len(got) < 2:
            got.append(k)
    return [k for ks in out.values() for k in ks]


def test_clients_that_follow_the_map_read_each_key_where_it_is_held(cluster) -> None:
    """With the job drained: 300 existing keys read by a direct client at the router (its
    host has no shard) are answered by router-1 and router-2 from their hosts' files, none
    over a hop and none through the router; the same keys by a plain client all cross the
    hop there. Every answer equals the truth."""
    c, gen = cluster
    gen.pause()
    c.drain()
    keys, hourly = existing(gen.log)
    sample = random.Random(55).sample(sorted(keys), 300)
    assert c.router is not None
    for direct in (True, False):
        before = reads(c)
        with Client(c.router.url, direct=direct) as cl:
            got = [cl.get(JOB, "per_tweet_1h", "impressions", k, from_=-FAR, to=FAR)
                   for k in sample]
        moved = {n: {p: v - before[n][p] for p, v in r.items()} for n, r in reads(c).items()}
        for k, a in zip(sample, got, strict=True):
            assert {w.start: w.value for w in a.windows if w.value} == {
                s: v for (key, s), v in hourly.items() if key == k and v}, k
        on_nodes = {n: m for n, m in moved.items() if n != "router"}
        local = sum(m["local"] for m in on_nodes.values())
        print(f"cluster map, {'direct' if direct else 'plain'} client: {moved}")
        if direct:
            assert moved["router"] == {"local": 0, "remote": 0}, moved
            assert all(m["remote"] == 0 for m in on_nodes.values()), moved
            assert local >= len(sample) and all(m["local"] > 0 for m in on_nodes.values())
        else:
            assert moved["router"]["remote"] >= len(sample), moved
            assert local == 0 and all(m["remote"] == 0 for m in on_nodes.values()), moved


def test_a_planned_move_under_read_load_is_never_answered_by_the_old_owner(cluster) -> None:
    """Make-before-break under a direct and a plain client reading existing keys: shard-2
    drains (SIGTERM: its partitions move to shard-1, each once shard-1 has its batch, then it
    exits), then starts again and takes its share back the same way. Once a partition's
    epoch changed, the old owner (its server, and the router reading its files on its host)
    never answers it: no reader ever sees a key at an older batch than it saw before, nor a
    wrong, empty or above-the-truth answer."""
    seen: dict = {}
    c, gen = cluster

    def inject(d: Deployment) -> float:
        assert isinstance(d, Cluster)
        seen["epoch"] = d.epoch()
        t = time.monotonic()
        d.shards[1].drain(120)  # returns once shard-2 exited by itself
        seen["drained"] = time.monotonic() - t
        return t

    def recovered(d: Deployment) -> None:
        assert isinstance(d, Cluster)
        assert set(d.owners()) == {"shard-1"}, d.owners()  # it left nothing behind
        t = time.monotonic()
        d.shards[1] = d.start_shard(2)
        wait_until(lambda: len(d.owners()) == WORKERS and
                   [serving(d, op) for op in ("per_tweet_1h", "per_tweet_1m")] == [P, P]
                   and all(serving_on(d, i) > 0 for i in (1, 2)), 120,
                   "shard-2 back with its share, one owner per partition")
        seen["joined"] = time.monotonic() - t
        assert d.job is not None and d.job.alive()

    with smart_and_plain(c, gen, "planned moves") as readers:
        scenario(cluster, "shard-2 drained, then back (planned moves)", inject, recovered)
    moves = c.epoch() - seen["epoch"]
    print(f"cluster planned moves: drain {seen['drained']:.1f}s, join {seen['joined']:.1f}s, "
          f"{moves} epochs")
    assert moves >= 2, moves  # away, and back
    for name, r in readers.items():
        assert not r.backwards, (name, r.backwards[:5])


@contextlib.contextmanager
def smart_and_plain(c: Cluster, gen: Any, what: str) -> Iterator[dict[str, ClientReader]]:
    """A direct and a plain client reading existing keys (two a partition) at the router for
    the block's length; then what each saw is held to the truth: every answer a 200, 503 or
    404 of a key with no events, never wrong, empty or above the final count."""
    keys, _ = existing(gen.log)
    assert c.router is not None
    readers = {"direct" if direct else "plain":
               ClientReader(c.router.url, two_per_partition(keys), keys, direct)
               for direct in (True, False)}
    for r in readers.values():
        r.start()
    try:
        yield readers
    finally:
        for r in readers.values():
            r.finish()
    hourly = truth(gen.log)[0]
    for name, r in readers.items():
        print(f"cluster {what}, {name} client: {dict(r.answers)}, "
              f"{len(r.backwards)} older than one seen")
        assert r.answers[200] > 0 and not r.wrong, (name, r.answers, r.wrong[:5])
        above = {w: v for w, v in r.highest.items() if v > hourly.get(w, 0)}
        assert not above, (name, list(above.items())[:5])


def serving_on(c: Cluster, i: int) -> int:
    """Partitions of both operators shard ``i`` serves."""
    return sum(int(metric(c.shard_metrics(i), "qstate_shard_partitions", job=JOB,
                          operator=op, state="serving")) for op in ("per_tweet_1h", "per_tweet_1m"))


def serving(c: Cluster, operator: str) -> int:
    """Partitions of ``operator`` the shards serve, summed: P when each has one owner."""
    return sum(int(metric(c.shard_metrics(i), "qstate_shard_partitions", job=JOB,
                          operator=operator, state="serving")) for i in range(1, WORKERS + 1))


def test_a_cut_link_moves_partitions_and_fences_the_isolated_side(cluster) -> None:
    seen: dict = {}

    def inject(d: Deployment) -> float:
        assert isinstance(d, Cluster)
        seen["epoch"] = d.epoch()
        host = d.hosts["worker-2"]
        host.cut()
        t = time.monotonic()
        threading.Timer(10, host.mend).start()
        return t

    def recovered(d: Deployment) -> None:
        assert isinstance(d, Cluster)
        wait_until(lambda: len(d.owners()) == WORKERS and d.epoch() >= seen["epoch"] + 2, 120,
                   "worker-2's shard moved away and given its share back")
        assert d.job is not None and d.job.alive()
        # the isolated side let go of what moved while it was away: one owner per partition
        wait_until(lambda: [serving(d, op) for op in ("per_tweet_1h", "per_tweet_1m")] == [P, P],
                   60, "one owner per partition")

    scenario(cluster, "link of worker-2 cut for 10 s", inject, recovered)


def test_a_worker_host_killed_reschedules_and_restores_elsewhere(cluster) -> None:
    """... with a direct and a plain client reading existing keys throughout (router-2 dies
    with its host: the direct client asks the router meanwhile, then the map's new owner)."""
    seen: dict = {}
    c, gen = cluster

    def inject(d: Deployment) -> float:
        assert isinstance(d, Cluster)
        seen["epoch"] = d.epoch()
        seen["killed"] = d.kill_host("worker-2")
        seen["t"] = time.monotonic()
        return seen["t"]

    def recovered(d: Deployment) -> None:
        assert isinstance(d, Cluster)
        # every partition on the surviving shard; the job kept running on worker-1
        wait_until(lambda: set(d.owners()) == {"shard-1"}, 60, "partitions on shard-1 only")
        assert d.job is not None and d.job.alive()
        time.sleep(5)
        d.restart_worker_host(2)
        wait_until(lambda: len(d.owners()) == WORKERS, 60, "worker-2's shard rejoined")

    with smart_and_plain(c, gen, "worker-2 killed") as readers:
        scenario(cluster, "worker-2 host killed", inject, recovered)
    assert seen["killed"] >= 4  # the worker JVM, its executor, the shard, router-2 (+ Python)
    for name, r in readers.items():
        tta = r.recovered_after(seen["t"])
        print(f"cluster worker-2 killed, {name} client: every key answering again after {tta}s")
        assert tta is not None, f"the {name} client never read every key again"


def test_with_the_job_down_the_standby_moves_a_dead_hosts_partitions(cluster) -> None:
    c, gen = cluster
    gen.pause()
    assert gen.error is None, gen.error
    c.drain()
    assert c.job is not None
    c.job.stop(60)  # the job is down (SIGTERM: it stops its query and Spark)
    epoch = c.epoch()
    c.kill_host("worker-2")
    t = time.monotonic()
    wait_until(lambda: set(c.owners()) == {"shard-1"}, 120,
               "the standby moved worker-2's partitions with the job down")
    assert c.assignment().by_standby() and c.epoch() > epoch
    tta = c.time_to_answer(t)
    res = compare(c, gen.log)
    print(f"cluster job down, worker-2 host killed: {res}, answering again after {tta:.2f}s")
    assert (res["lost"], res["doubled"]) == (0, 0) and res["windows"] > 1000, res
    # the host and the job back, more load: the driver goes on from the standby's epoch
    c.restart_worker_host(2)
    c.start_job()
    gen.running.set()
    wait_until(lambda: len(c.owners()) == WORKERS and not c.assignment().by_standby(), 180,
               "the driver back, worker-2 rejoined")
    time.sleep(10)
    gen.pause()
    c.drain()
    res = compare(c, gen.log)
    assert (res["lost"], res["doubled"]) == (0, 0) and res["windows"] > 1000, res
