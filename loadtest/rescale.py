"""Live rescale while clients read: shard servers join and drain, an owner dies with
replicas=2, and a reader hammering every key counts 503s and wrong answers (issue 11).

    python -m loadtest.rescale --keys 2000 --partitions 8

A world of real processes on this host: shard servers (`qstate shard`), two routers (one
reading co-located shards in-process, one over gRPC only), and a coordinator in this
process that commits a batch of every key every ``--interval`` seconds (delta files and
manifests in checkpoint storage, exactly as a job's sink does; no Spark, so only the
rescale is measured). One reader per router asks ``batchGet`` for every key, without pause.

Scenarios:
- **join-drain**: 2 servers; a third joins (its share moves to it make-before-break); then
  one drains (SIGTERM: its partitions move away, then it exits by itself): 2 servers again.
- **replica-loss**: ``replicas=2`` over 3 servers; one is kill -9'd; the router answers its
  partitions from their followers until a follower is promoted.
- **partitions-double**: the committer (the job) stops, `qstate state rescale --partitions
  2P` runs as a process, the committer starts again at 2P (as a job restarted with
  ``--partitions 2P`` does).

Each answer is checked against ground truth as of its own batch: a key's latest window is
that batch's window, holding the value that batch wrote (``views``). At the end every
window of a sample of keys is compared over the whole range. Appends a table to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from loadtest import results
from qstate.control.coordinator import Coordinator
from qstate.core.address import PartitionId, partition_of
from qstate.core.records import delta as deltas
from qstate.core.records.assignment import Assignment, load_assignment
from qstate.core.records.operator import OperatorSpec, WindowSpec, load_spec, save_spec
from qstate.core.records.storage import Storage
from qstate.embedded.procs import RouterProcess, ShardProcess, qstate_command
from qstate.jobs.runtime.commit import Committer

__all__ = ["Outcome", "Tally", "World", "double_partitions", "join_drain", "replica_loss",
           "views"]

JOB, OP, STATE = "rescale", "views_1m", "views"
WINDOW = 60_000
WEEK_MS = 7 * 24 * 3600 * 1000
console = Console(stderr=True)


def views(key: str, batch: int) -> int:
    """What batch ``batch`` wrote for ``key`` in its window: the ground truth."""
    return zlib.crc32(f"{key}/{batch}".encode()) % 1_000_000 + 1


def _board_order(batch: int, key: str) -> tuple[int, str]:
    """A leaderboard's order of batch ``batch``'s window: most views first, ties by key."""
    return -views(key, batch), key


@dataclass
class Tally:
    """What the readers saw."""

    requests: int = 0
    reads: int = 0  # key answers checked
    refused: Counter[int] = field(default_factory=Counter)  # HTTP status (0: no answer)
    wrong: int = 0
    examples: list[str] = field(default_factory=list)  # of refusals and wrong answers
    older: int = 0  # answers at an older batch than one seen before for the key (allowed)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, what: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(what[:300])


class Reader(threading.Thread):
    """``batchGet`` of every key from one router, again and again, each answer checked."""

    def __init__(self, router: str, url: str, keys: list[str], tally: Tally,
                 allow_stale: bool = False) -> None:
        super().__init__(name=f"reader-{router}", daemon=True)
        self.router, self.url, self.keys, self.tally = router, url, keys, tally
        self.params = {"allow_stale": "true"} if allow_stale else {}
        self.stop = threading.Event()
        self.seen: dict[str, int] = {}

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as c:
            while not self.stop.is_set():
                for i in range(0, len(self.keys), 1000):
                    self._one(c, self.keys[i:i + 1000])

    def _one(self, c: httpx.Client, keys: list[str]) -> None:
        t = self.tally
        try:
            r = c.post(f"/v1/state/{JOB}/{OP}/{STATE}:batchGet", json={"keys": keys},
                       params=self.params)
        except httpx.HTTPError as exc:
            with t.lock:
                t.requests += 1
                t.refused[0] += 1
                t.note(f"{self.router}: no answer: {exc!r}")
            return
        with t.lock:
            t.requests += 1
            if r.status_code != 200:
                t.refused[r.status_code] += 1
                t.note(f"{self.router}: {r.status_code}: {r.text}")
                return
            for item in r.json()["results"]:
                t.reads += 1
                key, b, ws = item["key"], item["batch"], item["windows"]
                if not (item["found"] and len(ws) == 1 and ws[0]["start"] == b * WINDOW
                        and ws[0]["value"] == views(key, b)):
                    t.wrong += 1
                    t.note(f"{self.router}: wrong: {key} at batch {b}: {ws} "
                           f"(truth {views(key, b)})")
                if b < self.seen.get(key, -1):
                    t.older += 1
                self.seen[key] = max(b, self.seen.get(key, -1))


@dataclass
class World:
    root: Path
    keys: int = 2000
    partitions: int = 8
    replicas: int = 1
    # readers let a follower answer while the owner cannot (allow_stale=true)
    allow_stale: bool = False
    interval_s: float = 0.2
    lease_s: float = 5.0
    storage: Storage = field(init=False)
    spec: OperatorSpec = field(init=False)
    shards: dict[str, ShardProcess] = field(default_factory=dict)
    routers: list[RouterProcess] = field(default_factory=list)
    coordinator: Coordinator | None = None
    committed: int = -1
    _stop: threading.Event = field(default_factory=threading.Event)
    _committer: threading.Thread | None = None
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.storage = Storage(str(self.root / "storage"))
        self.spec = OperatorSpec(JOB, OP, "page", {STATE: "long"}, self.partitions,
                                 WindowSpec("tumbling", WINDOW), WEEK_MS, self.replicas)
        self.names = [f"page-{i}" for i in range(self.keys)]
        self._by_partition: dict[int, list[str]] = {}

    def add_shard(self, name: str) -> ShardProcess:
        s = ShardProcess.make(name, self.root / "data", self.storage.uri, self.root / "logs")
        self.shards[name] = s.start_and_wait()
        return s

    def start(self, servers: int) -> None:
        save_spec(self.storage, self.spec)
        for i in range(servers):
            self.add_shard(f"s{i}")
        self.resume()
        self.routers = [
            RouterProcess.make(self.storage.uri, self.root / "logs", "router-local")
            .start_and_wait(),
            RouterProcess.make(self.storage.uri, self.root / "logs", "router-grpc", None,
                               "--no-local-reads").start_and_wait()]

    def resume(self) -> None:
        """The job (re)starts: a coordinator and a batch every ``interval_s``, partitioned
        by the spec in storage."""
        spec = load_spec(self.storage, JOB, OP)
        assert spec is not None
        self.spec, self._by_partition = spec, {}
        for k in self.names:
            self._by_partition.setdefault(partition_of(k, spec.partitions), []).append(k)
        # the servers registered in storage: one that starts later is found by itself
        self.coordinator = Coordinator(self.storage, JOB, None, lease_s=self.lease_s,
                                       heartbeat_s=0.2)
        self.coordinator.register(self.spec)
        self.commit(self.committed + 1)
        self._stop = threading.Event()
        self._committer = threading.Thread(target=self._commit_loop, name="committer",
                                           daemon=True)
        self._committer.start()

    def pause(self) -> None:
        """The job stops: no more batches, no coordinator (its lease stops changing)."""
        self._stop.set()
        if self._committer is not None:
            self._committer.join(60)
        if self.coordinator is not None:
            self.coordinator.stop()

    def commit(self, batch: int) -> None:
        """Batch ``batch``: one window of every key (``views``), committed like a job's sink."""
        assert self.coordinator is not None
        start, written = batch * WINDOW, {}
        for p, keys in self._by_partition.items():
            t = pa.table({"key": keys, "start": [start] * len(keys),
                          "end": [start + WINDOW] * len(keys),
                          "tag": pa.nulls(len(keys), pa.int64()),
                          STATE: [views(k, batch) for k in keys]}
                         ).cast(deltas.delta_schema(self.spec))
            deltas.write_delta(self.storage, PartitionId(JOB, OP, p), batch, t)
            written[p] = {0: t.num_rows}
        Committer(self.coordinator).commit(self.spec, batch, start, written)
        self.committed = batch

    def _commit_loop(self) -> None:
        batch = self.committed
        while not self._stop.wait(self.interval_s):
            batch += 1
            try:
                self.commit(batch)
            except Exception as exc:  # noted: the scenario fails on it
                self.errors.append(f"batch {batch}: {exc!r}")
                return

    def assignment(self) -> Assignment:
        return load_assignment(self.storage, JOB)

    def settled(self, servers: set[str]) -> bool:
        """Partitions spread evenly over exactly ``servers``, each with its copies and no
        move under way."""
        a = self.assignment()
        owners = a.owners.get(OP, [])
        loads = Counter(owners)
        copies = min(self.replicas, len(servers)) - 1
        return set(loads) == servers and max(loads.values()) - min(loads.values()) <= 1 \
            and all(len(a.followers_of(OP, p)) == copies and
                    set(a.followers_of(OP, p)) <= servers for p in range(len(owners)))

    def wait_settled(self, servers: set[str], timeout: float = 120) -> float:
        t0 = time.monotonic()
        while not self.settled(servers):
            if self.errors:
                raise RuntimeError(f"the committer failed: {self.errors}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"not settled on {sorted(servers)} in {timeout:.0f}s: "
                                   f"{self.assignment()}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def logs(self, lines: int = 40) -> str:
        """The last ``lines`` of each server's log: what a failed run leaves to read once
        its folder is gone (a CI machine's)."""
        return "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace")
                                                       .splitlines()[-lines:])
                         for f in sorted((self.root / "logs").glob("*.log")))

    def follower_reads(self) -> float:
        total = 0.0
        for r in self.routers:
            text = httpx.get(f"{r.url}/metrics", timeout=10).text
            total += sum(s.value for f in text_string_to_metric_families(text)
                         for s in f.samples if s.name == "qstate_router_shard_reads_total"
                         and s.labels.get("path") == "follower")
        return total

    @contextlib.contextmanager
    def hammered(self, tally: Tally) -> Iterator[None]:
        """Readers on every router for the block's length."""
        readers = [Reader(r.name, r.url, self.names, tally, self.allow_stale)
                   for r in self.routers]
        for r in readers:
            r.start()
        try:
            yield
        finally:
            for r in readers:
                r.stop.set()
            for r in readers:
                r.join(30)

    def exact(self, sample: int = 100, n: int = 25) -> int:
        """Every window of a sample of keys, over the whole range, and the top ``n`` of every
        key in the first, middle and last batch's window (a leaderboard reads every
        partition: a split one must not answer the keys that moved), through every router,
        after the committer stopped: mismatches (0 when exact)."""
        self.pause()
        keys = self.names[:: max(1, len(self.names) // sample)]
        truth = {(k, b * WINDOW): views(k, b) for k in keys for b in range(self.committed + 1)}
        bad = 0
        for r in self.routers:
            got: dict[tuple[str, int], int] = {}
            with httpx.Client(base_url=r.url, timeout=60) as c:
                for k in keys:
                    a = c.get(f"/v1/state/{JOB}/{OP}/{STATE}/{k}",
                              params={"from": "0", "to": str(1 << 50)})
                    a.raise_for_status()
                    got |= {(k, w["start"]): w["value"] for w in a.json()["windows"]}
                for b in sorted({0, self.committed // 2, self.committed}):
                    board = sorted(self.names, key=partial(_board_order, b))[:n]
                    t = c.get(f"/v1/top/{JOB}/{OP}/{STATE}",
                              params={"n": n, "window": str(b * WINDOW)})
                    t.raise_for_status()
                    got_board = [(e["key"], e["value"]) for e in t.json()["entries"]]
                    want_board = [(k, views(k, b)) for k in board]
                    bad += sum(g != w for g, w in zip(got_board, want_board, strict=False))
                    bad += abs(len(got_board) - len(want_board))
            bad += len(set(truth.items()) ^ set(got.items()))
        return bad

    def stop(self) -> None:
        self._stop.set()
        if self.coordinator is not None:
            self.coordinator.stop()
        for r in self.routers:
            r.stop()
        for s in self.shards.values():
            s.stop()


@dataclass
class Outcome:
    scenario: str
    tally: Tally
    follower_reads: float
    mismatches: int  # of the final range comparison
    batches: int
    steps: dict[str, float]  # what happened -> seconds it took
    epochs: int
    logs: str = ""  # the servers' logs when a reader was refused or answered wrong

    def row(self) -> str:
        t = self.tally
        steps = "; ".join(f"{k} {v:.1f} s" for k, v in self.steps.items())
        refused = sum(t.refused.values())
        return (f"| {self.scenario} | {t.reads:,} ({t.requests:,} requests) | {refused} "
                f"| {t.wrong} | {self.mismatches} | {t.older:,} | {self.follower_reads:,.0f} "
                f"| {self.batches} | {steps} |")


def _scenario(name: str, world: World, servers: int, hold_s: float,
              steps: Callable[[World, dict[str, float]], None]) -> Outcome:
    """Start ``world`` on ``servers`` shard servers, read for ``hold_s``, take ``steps``
    (each records how long it took), read for ``hold_s`` more; then check every window."""
    tally, took = Tally(), dict[str, float]()
    try:
        world.start(servers)
        world.wait_settled({f"s{i}" for i in range(servers)})
        epoch0 = world.assignment().epoch
        with world.hammered(tally):
            time.sleep(hold_s)
            steps(world, took)
            time.sleep(hold_s)
        return Outcome(name, tally, world.follower_reads(), world.exact(),
                       world.committed + 1, took, world.assignment().epoch - epoch0,
                       world.logs() if tally.refused or tally.wrong else "")
    finally:
        world.stop()


def join_drain(root: Path, keys: int, partitions: int, hold_s: float = 3.0,
               interval_s: float = 0.2) -> Outcome:
    """2 servers → a third joins → one drains → 2 servers, under readers and commits."""
    def steps(w: World, took: dict[str, float]) -> None:
        console.print("a third shard server joins")
        t0 = time.monotonic()
        w.add_shard("s2")
        w.wait_settled({"s0", "s1", "s2"})
        took["join: s2 up to owning its share"] = time.monotonic() - t0
        time.sleep(hold_s)
        console.print("s0 drains (SIGTERM)")
        t0 = time.monotonic()
        s0 = w.shards["s0"]
        s0.drain()
        took["drain: SIGTERM to s0 exited"] = time.monotonic() - t0
        if s0.proc is None or s0.proc.returncode != 0:
            raise RuntimeError("s0 did not drain and exit by itself")
        w.wait_settled({"s1", "s2"}, timeout=30)

    return _scenario("join (2→3) then drain (3→2)",
                     World(root, keys, partitions, interval_s=interval_s), 2, hold_s, steps)


def replica_loss(root: Path, keys: int, partitions: int, hold_s: float = 3.0,
                 interval_s: float = 0.2) -> Outcome:
    """replicas=2 over 3 servers; kill -9 one; readers that allow staleness go on against
    its followers."""
    def steps(w: World, took: dict[str, float]) -> None:
        console.print("s0 is killed (kill -9)")
        t0 = time.monotonic()
        w.shards["s0"].kill()
        w.wait_settled({"s1", "s2"})
        took[f"kill -9 s0 to its partitions promoted and copied (lease {w.lease_s:g} s)"] = \
            time.monotonic() - t0

    return _scenario("replicas=2, owner killed (3→2)",
                     World(root, keys, partitions, replicas=2, allow_stale=True,
                           interval_s=interval_s), 3,
                     hold_s, steps)


def double_partitions(root: Path, keys: int, partitions: int, hold_s: float = 3.0,
                      interval_s: float = 0.2) -> Outcome:
    """P → 2P with `qstate state rescale` while the job is down and readers read; then the
    job goes on at 2P."""
    def steps(w: World, took: dict[str, float]) -> None:
        console.print("the job stops; qstate state rescale")
        w.pause()
        t0 = time.monotonic()
        subprocess.run(qstate_command(
            "state", "rescale", JOB, "--partitions", str(2 * partitions), "--storage",
            w.storage.uri, "--lease-s", "2"), check=True)
        took["qstate state rescale (2 s of it: is the job down?)"] = time.monotonic() - t0
        time.sleep(hold_s)
        console.print(f"the job goes on at {2 * partitions} partitions")
        w.resume()
        if w.spec.partitions != 2 * partitions:
            raise RuntimeError(f"the spec says {w.spec.partitions} partitions")
        w.wait_settled({"s0", "s1"})

    return _scenario(f"partitions {partitions}→{2 * partitions}, job down",
                     World(root, keys, partitions, interval_s=interval_s), 2, hold_s, steps)


SCENARIOS: dict[str, Callable[[Path, int, int, float, float], Outcome]] = {
    "join-drain": join_drain, "replica-loss": replica_loss,
    "partitions-double": double_partitions}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--keys", type=int, default=2000, help="keys, each written every batch")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between batches")
    ap.add_argument("--hold", type=float, default=3.0,
                    help="seconds of reading before, between and after the steps")
    ap.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS),
                    help="which to run, in this order")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/rescale.md"))
    args = ap.parse_args()
    outcomes = []
    for name in args.scenarios:
        scenario = SCENARIOS[name]
        with tempfile.TemporaryDirectory(prefix=f"qstate-{name}-") as tmp, \
                console.status(f"{name}: running"):
            outcomes.append(scenario(Path(tmp), args.keys, args.partitions, args.hold,
                                     args.interval))
        console.print(outcomes[-1].row())
    text = "\n".join([
        f"\n## live rescale under reads, {args.keys:,} keys, P={args.partitions}\n",
        f"`{results.command('loadtest.rescale')}` ({time.strftime('%Y-%m-%d %H:%M')}); a "
        f"batch of every key every {args.interval:g} s; one reader per router (in-process "
        "and gRPC) asking batchGet for every key without pause\n",
        "| scenario | key answers | 503s / errors | wrong answers | final mismatches "
        "| answers older than one seen before | follower reads | batches | steps |",
        "|---|---|---|---|---|---|---|---|---|",
        *[o.row() for o in outcomes]])
    results.append(args.out, text + "\n")
    bad = [o for o in outcomes if o.tally.refused or o.tally.wrong or o.mismatches]
    for o in bad:
        console.print(f"[red]{o.scenario}: {o.tally.examples}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
