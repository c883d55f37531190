"""Feast's online reads through qstate vs through Feast's Redis online store, same values, one
run (issue 46; docs/feast.md).

    python -m loadtest.bench_feast --keys 100000 --calls 2000 --duration 10 --rounds 2

Stands up checkpoint storage with the tweets job's ``per_tweet_1h`` operator (``impressions``
and ``clicks`` of ``--keys`` tweets in one hour, written as delta files and committed through
the coordinator, as ``loadtest.bench_router`` does), two shard servers and a router (the
native front); a ``redis-server``; and two Feast repositories with the same entity and
feature view: one whose online store is ``qstate.feast.QStateOnlineStore`` over the router,
one whose online store is Feast's Redis store, filled by ``FeatureStore.materialize`` from a
Parquet file of the same values (what the router answers, read back first). A sample of keys
is read from both and compared.

Then, ``--rounds`` times, the order reversed each round: ``get_online_features`` of 1 and of
100 random entities (both features), ``--calls`` calls each, timed one by one in this
process (p50, p99); and ``feast serve`` of each repository (one gunicorn worker, as `feast
serve` starts), driven by ``wrk -c8`` with ``/get-online-features`` bodies of 1 and 100
random entities for ``--duration`` seconds: requests per second, p50, p99. Servers (shards,
router, Redis, feast serve) run on ``--server-cpus``, this process and wrk on
``--client-cpus``. Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loadtest import results
from loadtest.bench_ingest import start_redis
from loadtest.bench_router import WRK_LUA, run_wrk
from loadtest.cpu import pin, pin_self, pinned
from qstate.client import Client
from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.records import delta as deltas
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.embedded.guard import guarded
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import Child, RouterProcess, ShardProcess
from qstate.jobs.runtime.commit import Committer

HOUR = 3_600_000
P = 16
SPEC = OperatorSpec("tweets", "per_tweet_1h", "tweet_id",
                    {"impressions": "long", "clicks": "long"}, partitions=P,
                    window=WindowSpec("tumbling", HOUR))
FEATURES = ["tweet_hourly:impressions", "tweet_hourly:clicks"]
SIZES = (1, 100)
STORES = ("qstate", "redis")
NAMES = {"qstate": "qstate (QStateOnlineStore)", "redis": "Feast's Redis online store"}
Result = dict[str, float]

FEATURES_PY = """
from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.types import Int64, String

tweet = Entity(name="tweet", join_keys=["tweet_id"], value_type=ValueType.STRING)
history = FileSource(path="{parquet}", timestamp_field="event_timestamp")
tweet_hourly = FeatureView(
    name="tweet_hourly", entities=[tweet], source=history,
    schema=[Field(name="tweet_id", dtype=String), Field(name="impressions", dtype=Int64),
            Field(name="clicks", dtype=Int64)])
"""
ONLINE = {
    "qstate": """  type: qstate.feast.QStateOnlineStore
  url: {router}
  feature_views:
    tweet_hourly: {{job: tweets, operator: per_tweet_1h}}""",
    "redis": """  type: redis
  connection_string: 127.0.0.1:{redis}""",
}
# wrk: /get-online-features bodies of {batch} random tweets, built once and cycled
SERVE_BUILD = """local ids = {}
    for k = 1, {batch} do ids[k] = '"' .. pick() .. '"' end
    reqs[n] = wrk.format("POST", "/get-online-features",
                         {["Content-Type"] = "application/json"},
                         '{"features": ["tweet_hourly:impressions", "tweet_hourly:clicks"], '
                         .. '"entities": {"tweet_id": [' .. table.concat(ids, ",") .. ']}}')"""


def name(i: int) -> str:
    return f"tw-{i}"


def values(i: int) -> tuple[int, int]:
    return i * 7919 % 100_000, i % 37


def load(storage: Storage, shards: list[ShardProcess], keys: int, start: int) -> None:
    """Every key's hour from ``start``, committed as batch 0 (the watermark past its end)."""
    save_spec(storage, SPEC)
    coord = Coordinator(storage, SPEC.job, [s.address for s in shards])
    coord.register(SPEC)
    by_p: dict[int, list[int]] = {}
    for i in range(keys):
        by_p.setdefault(partition_of(name(i), P), []).append(i)
    written = {}
    for p, ids in by_p.items():
        t = pa.table({"key": [name(i) for i in ids], "start": [start] * len(ids),
                      "end": [start + HOUR] * len(ids), "tag": pa.nulls(len(ids), pa.int64()),
                      "impressions": [values(i)[0] for i in ids],
                      "clicks": [values(i)[1] for i in ids]}).cast(deltas.delta_schema(SPEC))
        deltas.write_delta(storage, PartitionId(SPEC.job, SPEC.operator, p), 0, t)
        written[p] = {0: t.num_rows}
    Committer(coord).commit(SPEC, 0, start + HOUR + 10_000, written)
    coord.stop()


def served(url: str, keys: int) -> dict[str, tuple[int, int]]:
    """What the router answers for every key: the values the Redis store is given."""
    out: dict[str, tuple[int, int]] = {}
    with Client(url, timeout=60) as c:
        for lo in range(0, keys, 1000):
            chunk = [name(i) for i in range(lo, min(keys, lo + 1000))]
            imp = c.multi_get(SPEC.job, SPEC.operator, "impressions", chunk)
            clicks = c.multi_get(SPEC.job, SPEC.operator, "clicks", chunk)
            for a, b in zip(imp, clicks, strict=True):
                assert a.latest is not None and b.latest is not None, a.key
                out[a.key] = (int(a.latest.value or 0), int(b.latest.value or 0))
    return out


def repository(at: Path, store: str, parquet: Path, **where: object) -> Any:
    from feast import FeatureStore

    at.mkdir(parents=True)
    (at / "feature_store.yaml").write_text(
        f"project: bench_{store}\nregistry: {at}/registry.db\nprovider: local\n"
        f"online_store:\n{ONLINE[store].format(**where)}\noffline_store:\n  type: file\n"
        "entity_key_serialization_version: 3\n")
    (at / "features.py").write_text(FEATURES_PY.format(parquet=parquet))
    fs = FeatureStore(repo_path=str(at))
    scope: dict[str, Any] = {}
    exec(FEATURES_PY.format(parquet=parquet), scope)
    fs.apply([scope["tweet"], scope["history"], scope["tweet_hourly"]])
    return fs


def feature_rows(fs: Any, ids: list[str]) -> list[tuple[int, int]]:
    got = fs.get_online_features(features=FEATURES,
                                 entity_rows=[{"tweet_id": k} for k in ids]).to_dict()
    return list(zip(got["impressions"], got["clicks"], strict=True))


def timed(fs: Any, batches: list[list[str]]) -> Result:
    """Each batch of ids one get_online_features call, timed: p50, p99, mean in ms."""
    for ids in batches[:100]:  # warm-up
        feature_rows(fs, ids)
    took: list[float] = []
    for ids in batches:
        t = time.perf_counter()
        fs.get_online_features(features=FEATURES,
                               entity_rows=[{"tweet_id": k} for k in ids])
        took.append(1000 * (time.perf_counter() - t))
    return {"p50": results.quantile(took, 0.5), "p99": results.quantile(took, 0.99),
            "mean": statistics.fmean(took)}


def serve(repo: Path, logs: Path, cpus: str) -> tuple[Child, str]:
    port = free_port()
    feast = Path(sys.executable).parent / "feast"
    # under the guard: feast serve's gunicorn forks its worker, which no lifeline reaches
    child = Child(f"feast-serve-{repo.name}", guarded(pinned(
        [str(feast), "-c", str(repo), "serve", "-h", "127.0.0.1", "-p", str(port),
         "--no-access-log", "--max-requests", "0"], cpus)), logs / f"serve-{repo.name}.log")
    child.start()
    wait_for_port("127.0.0.1", port, 120, child.proc)
    return child, f"http://127.0.0.1:{port}"


def serve_load(url: str, keys: int, batch: int, args: argparse.Namespace, tmp: Path) -> Result:
    pick = f"function pick() return 'tw-' .. math.random(0, {keys - 1}) end"
    lua = (WRK_LUA.replace("{seed}", "46").replace("{pick}", pick).replace("{count}", "64")
           .replace("{build}", SERVE_BUILD).replace("{batch}", str(batch)))
    run_wrk(url, lua, 2, tmp, 8, args.client_cpus)  # warm-up
    return run_wrk(url, lua, args.duration, tmp, 8, args.client_cpus)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=2000, help="get_online_features calls timed "
                    "per store, entity count and round")
    ap.add_argument("--duration", type=int, default=10, help="seconds of wrk per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server-cpus", default="1")
    ap.add_argument("--client-cpus", default="0")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/feast.md"))
    return ap.parse_args()


def say(text: str) -> None:
    print(f"[bench_feast] {text}", file=sys.stderr, flush=True)


def main() -> None:
    args = parse_args()
    pin_self(args.client_cpus)
    tmp = Path(tempfile.mkdtemp(prefix="qstate-feast-bench-"))
    logs = tmp / "logs"
    storage = Storage(str(tmp / "storage"))
    children: list[Child] = []
    redis_proc = None
    rng = random.Random(46)
    try:
        for i in range(2):
            shard = ShardProcess.make(f"f{i}", tmp / "shards", storage.uri, logs)
            shard.args = pinned(shard.args, args.server_cpus)
            children.append(shard.start_and_wait())
        start = (int(time.time() * 1000) // HOUR - 1) * HOUR  # the last hour, over
        load(storage, children[:2], args.keys, start)  # type: ignore[arg-type]
        router = RouterProcess.make(storage.uri, logs, "router")
        router.args = pinned(router.args, args.server_cpus)
        children.append(router.start_and_wait())
        say(f"reading {args.keys:,} keys back from the router")
        truth = served(router.url, args.keys)
        parquet = tmp / "tweets.parquet"
        pq.write_table(pa.table({
            "tweet_id": list(truth), "impressions": [v[0] for v in truth.values()],
            "clicks": [v[1] for v in truth.values()],
            "event_timestamp": [datetime.fromtimestamp((start + HOUR) / 1000, UTC)]
            * len(truth)}), parquet)
        redis_proc, redis_port = start_redis(tmp)
        pin(redis_proc.pid, args.server_cpus)
        repos = {"qstate": tmp / "repo-qstate", "redis": tmp / "repo-redis"}
        stores = {"qstate": repository(repos["qstate"], "qstate", parquet, router=router.url),
                  "redis": repository(repos["redis"], "redis", parquet, redis=redis_port)}
        say("feast materialize into Redis")
        t = time.perf_counter()
        stores["redis"].materialize(datetime.fromtimestamp(start / 1000, UTC),
                                    datetime.fromtimestamp((start + 2 * HOUR) / 1000, UTC))
        materialized_s = time.perf_counter() - t
        sample = [name(i) for i in rng.sample(range(args.keys), min(1000, args.keys))]
        want = [truth[k] for k in sample]
        same = {s: sum(a == b for a, b in zip(feature_rows(stores[s], sample), want,
                                              strict=True)) for s in STORES}
        say(f"answers equal to the router's on a sample: {same}")
        calls: dict[tuple[str, int], list[Result]] = {}
        http: dict[tuple[str, int], list[Result]] = {}
        for rnd in range(args.rounds):
            order = STORES if rnd % 2 == 0 else STORES[::-1]
            for n in SIZES:
                batches = [[name(rng.randrange(args.keys)) for _ in range(n)]
                           for _ in range(args.calls)]
                for s in order:
                    r = timed(stores[s], batches)
                    calls.setdefault((s, n), []).append(r)
                    say(f"round {rnd + 1}: get_online_features, {n} entities, {s}: "
                        f"p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms")
            for s in order:
                server, url = serve(repos[s], logs, args.server_cpus)
                try:
                    for n in SIZES:
                        r = serve_load(url, args.keys, n, args, tmp)
                        http.setdefault((s, n), []).append(r)
                        say(f"round {rnd + 1}: feast serve, {n} entities, {s}: "
                            f"{r['rps']:,.0f} req/s, p99 {r['p99']:.1f} ms")
                finally:
                    server.stop()
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
        for c in reversed(children):
            c.stop()
    write(args, calls, http, same, len(sample), materialized_s)


def best(runs: list[Result], key: str) -> float:
    """The rounds' median of ``key`` (two rounds: their mean)."""
    return statistics.median(r[key] for r in runs)


def write(args: argparse.Namespace, calls: dict[tuple[str, int], list[Result]],
          http: dict[tuple[str, int], list[Result]], same: dict[str, int], sampled: int,
          materialized_s: float) -> None:
    pinning = (f"servers (shards, router, Redis, feast serve) on CPU {args.server_cpus}, "
               f"this process and wrk on CPU {args.client_cpus}")
    text = [f"\n## get_online_features and feast serve: qstate vs Feast on Redis, "
            f"{args.keys:,} keys\n",
            f"`{results.command('loadtest.bench_feast')}` ({time.strftime('%Y-%m-%d %H:%M')}, "
            f"2 cores; taskset: {pinning}; feast {_version('feast')}, redis-py "
            f"{_version('redis')}; medians of {args.rounds} rounds)\n",
            f"Same values: a sample of {sampled} keys read through each store equals the "
            f"router's answers: qstate {same['qstate']}/{sampled}, Redis "
            f"{same['redis']}/{sampled}. `feast materialize` of {args.keys:,} rows into "
            f"Redis: {materialized_s:.1f} s (qstate: nothing to materialize).\n",
            f"`FeatureStore.get_online_features` ({args.calls:,} calls a run, both features, "
            "random tweets, timed one by one in this process):\n",
            "| entities | qstate p50 ms | qstate p99 ms | Redis p50 ms | Redis p99 ms | "
            "qstate p99 ≤ Redis p99 |", "|---|---|---|---|---|---|"]
    missed = []
    for n in SIZES:
        q, r = calls[("qstate", n)], calls[("redis", n)]
        ok = best(q, "p99") <= best(r, "p99")
        if not ok:
            missed.append(f"{n} entities ({best(q, 'p99'):.2f} ms vs {best(r, 'p99'):.2f} ms)")
        text.append(f"| {n} | {best(q, 'p50'):.2f} | **{best(q, 'p99'):.2f}** | "
                    f"{best(r, 'p50'):.2f} | **{best(r, 'p99'):.2f}** | "
                    f"{'yes' if ok else 'no'} |")
    sizes = " and ".join(map(str, SIZES))
    verdict = f"**not met** for {', '.join(missed)}" if missed else f"**met** for {sizes} entities"
    text += ["", "Goal (issue 46): qstate's `get_online_features` p99 ≤ Feast-on-Redis's p99 "
             f"in the same run: {verdict}."]
    text += ["", f"`feast serve` (one worker; `wrk -t1 -c8 -d{args.duration}s` "
             "`/get-online-features` of both features):\n",
             "| entities a request | qstate req/s | qstate p50 / p99 ms | Redis req/s | "
             "Redis p50 / p99 ms | non-2xx + errors |", "|---|---|---|---|---|---|"]
    for n in SIZES:
        q, r = http[("qstate", n)], http[("redis", n)]
        bad = sum(x["non2xx"] + x["errors"] for x in q + r)
        text.append(f"| {n} | **{best(q, 'rps'):,.0f}** | {best(q, 'p50'):.1f} / "
                    f"{best(q, 'p99'):.1f} | **{best(r, 'rps'):,.0f}** | {best(r, 'p50'):.1f}"
                    f" / {best(r, 'p99'):.1f} | {bad:.0f} |")
    text.append("")
    results.append(args.out, "\n".join(text))


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    os.environ.setdefault("FEAST_USAGE", "False")
    main()
