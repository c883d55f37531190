"""A whole qstate deployment under failure: broker, 2 shards, router, the tweets job as a
separate process (so its driver can be killed), and a generator that keeps sending.

A shard or the job can be (re)started with a fault point armed (``QSTATE_FAULT``,
``qstate.core.process.faults``): it kills itself at a named step of a batch N chosen a few batches
ahead of what the job has done, and the state it leaves is read from the shards (their
Describe, their commit markers on disk, their metrics) and Spark's checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import orjson
import pandas as pd
from confluent_kafka import Consumer, TopicPartition

from loadtest.truth import window_counts
from qstate.client import Client
from qstate.core.address import partition_of
from qstate.core.config import DEFAULTS
from qstate.core.errors import NotFound, Overloaded, Unavailable
from qstate.core.records.assignment import Assignment, load_assignment
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.generate import produce
from qstate.embedded.kafka import KafkaBroker
from qstate.embedded.procs import Child, RouterProcess, ShardProcess, qstate_command
from qstate.jobs.runtime.launch import MERGED
from tests.helpers import FAR, http_windows, metric, shard_metrics_url, wait_until

HOUR = 3_600_000
BOUNDARY = 1_767_229_200_000  # 2026-01-01T01:00Z
# tweet ids the generator draws from: make test checks every scenario's windows over 20K
# (each check reads every key with new events through the router); python -m loadtest.chaos
# runs the same scenarios over 100K (CHAOS_KEYS=100000)
KEYS = int(os.environ.get("CHAOS_KEYS", "20000"))
ORIGIN = BOUNDARY + 5 * 60_000  # event time of the first event; runs < 55 min stay in this hour
LATE_AT = BOUNDARY - 4 * 60_000  # late events: an hour and minutes long closed
TOPIC = "tweet-events"
P = 8
# Shorter than the default (the disk-lost scenario waits for it to expire), but longer than a
# shard's restart on a busy two-core CI machine: its gRPC grace (2 s) and a Python start
# under load took 5.4 s there, and a restart within the lease must not move partitions.
LEASE_S = 10.0
JOB = "tweets"
AHEAD = 3  # a fault names the batch this far past the job's newest (recorded, or started)


def newest(path: Path) -> int:
    """The greatest numbered file in ``path`` (Spark's offsets/commits logs), -1 if none."""
    names = [int(p.name.split(".")[0]) for p in path.glob("[0-9]*")] if path.exists() else []
    return max(names, default=-1)


class Generator(threading.Thread):
    """~rate events/s over ``keys`` tweet ids, event time = ORIGIN + elapsed, up to 3 s out
    of order; once ``late`` is set, 1% of events are late (in windows already closed)."""

    def __init__(self, bootstrap: str, log: Path, rate: int = 5000, keys: int = 0) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.log, self.rate = bootstrap, log, rate
        self.keys = keys or KEYS
        self.running = threading.Event()
        self.late = threading.Event()
        self.stopped = threading.Event()
        self.idle = threading.Event()
        self.rng = random.Random(7)
        self.t0 = time.monotonic()
        self.sent = 0
        self.error: Exception | None = None

    def events(self):
        while not self.stopped.is_set():
            if not self.running.is_set():
                return
            now = ORIGIN + int((time.monotonic() - self.t0) * 1000)
            late = self.late.is_set() and self.rng.random() < 0.01
            t = LATE_AT - self.rng.randint(0, 60_000) if late else now - self.rng.randint(0, 3000)
            kind = "url-click" if self.rng.random() < 0.1 else "impression"
            self.sent += 1
            yield {"tweet_id": f"tw-{self.rng.randrange(self.keys)}", "event": kind, "time": t}

    def run(self) -> None:
        while not self.stopped.is_set():
            self.running.wait(0.2)
            if self.running.is_set():
                self.idle.clear()
                try:
                    produce(self.bootstrap, TOPIC, self.events(), rate=self.rate,
                            log_path=self.log, progress=False)
                except Exception as exc:  # the truth would be unknowable: fail the test
                    self.error = exc
                    self.running.clear()
            self.idle.set()

    def pause(self) -> None:
        self.running.clear()
        self.idle.wait(180)


@dataclass
class Deployment:
    root: Path
    broker: KafkaBroker
    shards: list[ShardProcess] = field(default_factory=list)
    router: RouterProcess | None = None
    job: Child | None = None

    @property
    def storage(self) -> str:
        return str(self.root / "storage")

    def shard(self, i: int, fault: str = "") -> ShardProcess:
        env = {**os.environ, "QSTATE_SNAPSHOT_EVERY": "5", "QSTATE_FAULT": fault}
        return ShardProcess.make(f"c{i}", self.root / "shards", self.storage, self.root / "logs",
                                 port=self.shards[i].port if len(self.shards) > i else 0,
                                 env=env)

    def start(self) -> None:
        self.shards = [self.shard(i).start_and_wait() for i in range(2)]
        self.router = RouterProcess.make(self.storage, self.root / "logs").start_and_wait()
        self.start_job()

    def stop(self) -> None:
        for c in [self.job, self.router, *self.shards]:
            if c is not None:
                c.stop()

    def start_job(self, fault: str = "") -> None:
        self.job = Child("job", qstate_command(
            "job", "tweets", "--bootstrap", self.broker.bootstrap, "--storage", self.storage,
            "--checkpoints", str(self.root / "ckpt"), "--partitions", str(P),
            "--shards", ",".join(s.address for s in self.shards), "--no-live",
            "--max-rows-per-trigger", "50000", "--metrics-port", "0"),
            self.root / "logs" / "job.log",
            env={**os.environ, "QSTATE_LEASE_S": str(LEASE_S), "QSTATE_FAULT": fault}).start()

    def kill_job(self) -> None:
        """kill -9 the driver and its JVM (its process group), no clean-up; also what is
        left of a driver that killed itself (its JVM, exiting)."""
        assert self.job is not None and self.job.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.job.pid, signal.SIGKILL)
        self.job.proc.wait()

    def stop_job(self, timeout: float = 60) -> None:
        """SIGTERM to the driver (it stops its query, delivers what it recorded and stops
        Spark); kill -9 what is left after ``timeout``."""
        assert self.job is not None and self.job.proc is not None
        if self.job.alive():
            self.job.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.job.proc.wait(timeout)
        self.kill_job()

    # ---- fault points ------------------------------------------------------------
    def arm_shard(self, i: int, point: str, operator: str) -> int:
        """Restart shard ``i`` with ``point@N:operator`` armed, N ``AHEAD`` batches past what
        the job has recorded; returns N once the server is back, owns partitions of
        ``operator`` and N is still ahead (the job stalls on a shard that is away, so this
        takes one attempt unless the restart outlived the lease)."""
        for _ in range(3):
            n = self.recorded(operator) + AHEAD
            self.shards[i].stop()
            self.shards[i] = self.shard(i, f"{point}@{n}:{operator}").start_and_wait()
            wait_until(lambda: self.held(i, operator), 60,
                       f"{self.shards[i].name} serving partitions of {operator}")
            if self.recorded(operator) < n:
                return n
        raise AssertionError(f"the job kept passing the batch armed on {self.shards[i].name}")

    def arm_job(self, point: str, operator: str) -> int:
        """Stop the job and start it with ``point@N:operator`` armed, N ``AHEAD`` batches past
        the newest one Spark has started (its offset log); returns N."""
        self.stop_job()
        n = newest(self.checkpoint / "offsets") + AHEAD
        self.start_job(f"{point}@{n}:{operator}")
        return n

    def disarm(self) -> None:
        """Back to the deployment every scenario starts from: each shard and the job running
        with no fault armed (a scenario's ``finally``, whatever it left)."""
        for i, s in enumerate(self.shards):
            if not s.alive() or (s.env or {}).get("QSTATE_FAULT"):
                s.kill()
                self.shards[i] = self.shard(i).start_and_wait()
        if self.job is None or not self.job.alive() or (self.job.env or {}).get("QSTATE_FAULT"):
            if self.job is not None:
                self.kill_job()
            self.start_job()

    # ---- observation ------------------------------------------------------------
    @property
    def checkpoint(self) -> Path:
        """Spark's checkpoint of the job's merged query (offsets/, commits/)."""
        return self.root / "ckpt" / JOB / MERGED

    def recorded(self, operator: str) -> int:
        """The newest batch the driver recorded (its manifest), -1 before the first."""
        return max(manifest_batches(Storage(self.storage), JOB, operator), default=-1)

    def held(self, i: int, operator: str) -> dict[int, int]:
        """Partition -> last batch of the partitions of ``operator`` shard ``i`` serves
        (held and not restoring); {} when it does not answer."""
        clients = ShardClients()
        try:
            d = clients.describe(self.shards[i].address, timeout=5)
        except grpc.RpcError:
            return {}
        finally:
            clients.close()
        return {p.partition: p.last_batch for p in d.partitions
                if p.job == JOB and p.operator == operator and not p.restoring}

    def last_batches(self, operator: str) -> dict[int, int]:
        """Partition -> last batch over every shard."""
        return {p: b for i in range(len(self.shards)) for p, b in self.held(i, operator).items()}

    def shard_metric(self, i: int, name: str, operator: str, **labels: str) -> float:
        return metric(shard_metrics_url(self.storage, self.shards[i]), name, job=JOB,
                      operator=operator, **labels)

    def assignment(self) -> Assignment:
        """The job's assignment in force (the newest epoch in storage)."""
        return load_assignment(Storage(self.storage), JOB)

    def epoch(self) -> int:
        return self.assignment().epoch

    def committed_offsets(self) -> dict[int, int]:
        """Kafka offsets of the last batch the job's (merged) query committed."""
        last = newest(self.checkpoint / "commits")
        if last < 0:
            return {}
        lines = (self.checkpoint / "offsets" / str(last)).read_bytes().split(b"\n")
        return {int(k): v for k, v in orjson.loads(lines[2])[TOPIC].items()}

    def topic_ends(self) -> dict[int, int]:
        c = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "chaos"})
        try:
            md = c.list_topics(TOPIC, timeout=10).topics[TOPIC]
            return {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
                    for p in md.partitions}
        finally:
            c.close()

    def drain(self, timeout: float = 300) -> None:
        """Until both queries committed every offset of the topic."""
        ends = self.topic_ends()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.job is not None and not self.job.alive():
                raise AssertionError(f"the job died: {(self.root / 'logs' / 'job.log')}")
            if self.committed_offsets() == ends:
                return
            time.sleep(0.5)
        raise AssertionError(f"not drained in {timeout}s: {ends} vs {self.committed_offsets()}")

    def sample_keys(self, keys: int = 100_000) -> list[str]:
        """Two keys per partition: answering again means every partition answers."""
        out: dict[int, list[str]] = {}
        for i in range(keys):
            k = f"tw-{i}"
            out.setdefault(partition_of(k, P), [])
            if len(out[partition_of(k, P)]) < 2:
                out[partition_of(k, P)].append(k)
            if len(out) == P and all(len(v) == 2 for v in out.values()):
                break
        return [k for v in out.values() for k in v]

    def time_to_answer(self, since: float) -> float:
        """Seconds from ``since`` until every sampled key answers (200, or 404 with a batch);
        fails beyond the bound the settings promise: the lease expires, the partitions are
        restored, the router re-reads the assignment."""
        keys = self.sample_keys()
        assert self.router is not None
        cfg = DEFAULTS
        bound = LEASE_S + cfg.heartbeat_s + cfg.restore_timeout_s + 2 * cfg.routing_refresh_s
        deadline = since + bound
        with httpx.Client(base_url=self.router.url, timeout=2) as c:
            while time.monotonic() < deadline:
                try:
                    codes = [c.get(f"/v1/state/tweets/per_tweet_1h/impressions/{k}").status_code
                             for k in keys]
                except httpx.HTTPError:
                    codes = [0]
                if all(code in (200, 404) for code in codes):
                    return time.monotonic() - since
                time.sleep(0.1)
        raise AssertionError(f"keys did not answer again within {bound:.0f}s")


class Reader(threading.Thread):
    """Reads the sampled keys (two per partition) through the router over and over while a
    failure happens. Every answer must be a 200 or 404, or a 503 carrying Retry-After (or no
    answer while the router itself is down); a window's value never goes down unless the
    answer says it is of an older batch; ``highest`` is later held to ground truth (above it
    would be counted twice)."""

    def __init__(self, url: Callable[[], str], keys: list[str],
                 operator: str = "per_tweet_1h") -> None:
        super().__init__(daemon=True)
        self.url, self.keys, self.operator = url, keys, operator
        self.stop = threading.Event()
        self.answers: Counter[int] = Counter()  # status -> count; 0: no connection
        self.wrong: list[str] = []
        # answers of an older batch than one this reader saw before for the key: after a
        # planned move, an answer from the old owner once the new one committed (a kill's
        # restore may answer older meanwhile, a planned move never)
        self.backwards: list[str] = []
        self.highest: dict[tuple[str, int], int] = {}
        self._last: dict[str, tuple[int, dict[int, int]]] = {}  # key -> (batch, windows)

    def run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self.stop.is_set():
                for k in self.keys:
                    try:  # the router of the moment (a scenario may replace it)
                        r = c.get(f"{self.url()}/v1/state/{JOB}/{self.operator}/impressions/{k}",
                                  params={"from": str(-FAR), "to": str(FAR)})
                    except httpx.HTTPError:
                        self.answers[0] += 1
                        continue
                    self.answers[r.status_code] += 1
                    if r.status_code == 200:
                        self._check(k, r.json())
                    elif r.status_code == 503 and not r.headers.get("retry-after"):
                        self.wrong.append(f"{k}: 503 without Retry-After")
                    elif r.status_code not in (404, 503):
                        self.wrong.append(f"{k}: {r.status_code} {r.text[:200]}")
                self.stop.wait(0.05)

    def _check(self, key: str, answer: dict) -> None:
        batch = answer["batch"]
        windows = {w["start"]: w["value"] for w in answer["windows"]}
        prev_batch, prev = self._last.get(key, (-1, {}))
        if batch >= prev_batch:
            self.wrong += [f"{key}@{s}: {windows.get(s, 0)} at batch {batch} after {v} at "
                           f"batch {prev_batch}" for s, v in prev.items()
                           if windows.get(s, 0) < v]
            self._last[key] = (batch, windows)
        else:
            self.backwards.append(f"{key}: batch {batch} after batch {prev_batch}")
        for s, v in windows.items():
            self.highest[(key, s)] = max(self.highest.get((key, s), 0), v)

    def finish(self) -> None:
        self.stop.set()
        self.join(30)


class ClientReader(Reader):
    """A ``Reader`` through qstate's ``Client``: ``direct``, each key asked where the cluster
    map says (the router of its owner's node), else at the router. No retries: a 503 is an
    answer (``Unavailable``; its Retry-After the plain ``Reader`` checks). A key with events
    before the reads began (``existing``) that answers 404 is wrong: an empty answer. Each
    pass over the keys that all answered 200 is timed (``clean``), for when reading
    recovered."""

    def __init__(self, url: str, keys: list[str], existing: set[str], direct: bool,
                 operator: str = "per_tweet_1h") -> None:
        super().__init__(lambda: url, keys, operator)
        self.existing, self.direct = existing, direct
        self.clean: list[float] = []

    def run(self) -> None:
        with Client(self.url(), retries=0, timeout=5, direct=self.direct) as c:
            while not self.stop.is_set():
                ok = 0
                for k in self.keys:
                    try:
                        a = c.get(JOB, self.operator, "impressions", k, from_=-FAR, to=FAR)
                    except (Unavailable, Overloaded):
                        self.answers[503] += 1
                        continue
                    except NotFound as exc:
                        self.answers[404] += 1
                        if k in self.existing:
                            self.wrong.append(f"{k}: 404 though it has events: {exc}")
                        continue
                    except httpx.HTTPError:
                        self.answers[0] += 1
                        continue
                    self.answers[200] += 1
                    ok += 1
                    if a.found or k not in self.existing:
                        self._check(k, a.model_dump())
                    else:
                        self.wrong.append(f"{k}: not found at batch {a.batch} though it has "
                                          "events")
                if ok == len(self.keys):
                    self.clean.append(time.monotonic())
                self.stop.wait(0.05)

    def recovered_after(self, since: float) -> float | None:
        """Seconds from ``since`` to the end of the first pass after it that all answered."""
        later = [t for t in self.clean if t > since]
        return later[0] - since if later else None


Windows = dict[tuple[str, int], int]


STATES = (("per_tweet_1h", "impressions"), ("per_tweet_1h", "clicks"),
          ("per_tweet_1m", "impressions"))


@dataclass
class Touched:
    """What changed in one state's truth since the last check: which keys, and the oldest
    window start among the windows that changed (windows start in ``[since, ...)``)."""

    keys: set[str] = field(default_factory=set)
    since: int | None = None

    def add(self, key: str, start: int) -> None:
        self.keys.add(key)
        self.since = start if self.since is None else min(self.since, start)


class _Truth:
    """Ground truth of one delivery log, kept up to date by reading only the lines appended
    since the last look: counts of disjoint sets of events add up, so the sum over the new
    lines is the truth over the whole log (the log only grows; the module's scenarios run
    one after another over the same generator). It also notes, per state, which windows
    the new lines changed (``touched``), so a check can compare those only."""

    def __init__(self) -> None:
        self.offset = 0
        self.states: dict[tuple[str, str], Windows] = {s: {} for s in STATES}
        self.touched: dict[tuple[str, str], Touched] = {s: Touched() for s in STATES}
        self.keys: set[str] = set()

    def read(self, log: Path) -> None:
        with open(log, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # complete lines only
        if not end:
            return
        self.offset += end
        events = pd.DataFrame.from_records(
            [orjson.loads(line) for line in data[:end].splitlines() if line.strip()])
        self.keys.update(events["tweet_id"].unique())
        on_time = events[events["time"] >= BOUNDARY]  # late ones were all before BOUNDARY - 3 min
        for state, df in (
                (STATES[0], window_counts(on_time, "tweet_id", "time", HOUR,
                                          where={"event": "impression"})),
                (STATES[1], window_counts(on_time, "tweet_id", "time", HOUR,
                                          where={"event": "url-click"})),
                (STATES[2], window_counts(on_time, "tweet_id", "time", 60_000, 10_000,
                                          where={"event": "impression"}))):
            into, touched = self.states[state], self.touched[state]
            for k, start, n in zip(df["tweet_id"], df["start"], df["count"], strict=True):
                w = (k, int(start))
                into[w] = into.get(w, 0) + int(n)
                touched.add(k, int(start))

    def take_touched(self) -> dict[tuple[str, str], Touched]:
        """What changed since the last call; the next call starts afresh."""
        out, self.touched = self.touched, {s: Touched() for s in STATES}
        return out


_TRUTHS: dict[Path, _Truth] = {}


def truth(log: Path) -> tuple[Windows, Windows, Windows, list[str]]:
    """(impressions per hour, clicks per hour, impressions per sliding minute, every key) of
    every event in ``log``."""
    t = _TRUTHS.setdefault(log, _Truth())
    t.read(log)
    return (dict(t.states[STATES[0]]), dict(t.states[STATES[1]]), dict(t.states[STATES[2]]),
            sorted(t.keys))


def compare(d: Deployment, log: Path, touched_only: bool = False) -> dict[str, int]:
    """(key, window)s of every state against ground truth: counts lost and doubled.

    ``touched_only``: only the windows that changed in the truth since the previous such
    check, i.e. the keys with new events and, for each, the windows from the oldest one
    changed on (the router's ``from``). A scenario's failure and recovery act on the batches
    it ran, all of them after the previous check drained the topic; the module's last test
    compares every window once more (``test_every_window_exact_after_every_scenario``)."""
    assert d.router is not None
    t = _TRUTHS.setdefault(log, _Truth())
    t.read(log)
    touched = t.take_touched()
    result = {"lost": 0, "doubled": 0, "windows": 0}
    for state in STATES:
        want, since = t.states[state], None
        keys = sorted(t.keys)
        if touched_only:
            keys, since = sorted(touched[state].keys), touched[state].since
            want = {w: v for w, v in want.items()
                    if w[0] in touched[state].keys and since is not None and w[1] >= since}
        # the whole history of a key is hundreds of sliding windows: fewer keys a request
        got = {k: v for k, v in http_windows(d.router.url, "tweets", *state, keys, since=since,
                                             chunk=250 if touched_only else 50).items() if v}
        for w in set(want) | set(got):
            diff = int(got.get(w, 0)) - want.get(w, 0)
            result["lost" if diff < 0 else "doubled"] += abs(diff)
        result["windows"] += len(want)
    return result


RESULTS: list[tuple[str, dict, float]] = []


def scenario(world, name: str, inject: Callable[[Deployment], float],
             recovered: Callable[[Deployment], None] | None = None) -> None:
    """Under load: ``inject`` the failure (returns when it happened), wait until every key
    answers again, ``recovered`` checks what recovery did (None, a random-timing kill: a few
    more seconds of load instead), then drain and compare with ground truth."""
    d, gen = world
    took: dict[str, float] = {}
    mark = time.monotonic()

    def phase(label: str) -> None:  # where a scenario's time goes (printed: pytest -s)
        nonlocal mark
        took[label], mark = time.monotonic() - mark, time.monotonic()

    gen.running.set()
    reader = Reader(lambda: d.router.url if d.router else "http://127.0.0.1:9",
                    d.sample_keys())
    reader.start()
    try:
        if recovered is None:
            time.sleep(6)  # load before a kill at a random moment (a fault point waits for N)
        t = inject(d)
        phase("inject")
        tta = d.time_to_answer(t)
        phase("answering")
        if recovered is None:
            time.sleep(4)
        else:
            recovered(d)
        phase("recovered")
        reader.finish()
        gen.pause()
        assert gen.error is None, gen.error
        d.drain()
        phase("drain")
        want = truth(gen.log)
        phase("truth")
        res = compare(d, gen.log, touched_only=True)
        phase("compare")
        RESULTS.append((name, res, tta))
        assert res["windows"] > 1000
        assert (res["lost"], res["doubled"]) == (0, 0), res
        # what readers saw during the failure: never wrong, never above the final count
        assert reader.answers[200] > 0 and not reader.wrong, (reader.answers, reader.wrong[:5])
        above = {w: v for w, v in reader.highest.items() if v > want[0].get(w, 0)}
        assert not above, list(above.items())[:5]
    finally:
        reader.finish()
        d.disarm()
        phase("disarm")
        print(f"chaos {name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in took.items()),
              flush=True)


def every_window_exact(world) -> None:
    """The last check of a module: the topic drained, every window of every state against
    ground truth (the scenarios compared only what each touched)."""
    d, gen = world
    gen.pause()
    assert gen.error is None, gen.error
    d.drain()
    res = compare(d, gen.log)
    RESULTS.append(("every window, after every scenario", res, 0.0))
    assert res["windows"] > 1000
    assert (res["lost"], res["doubled"]) == (0, 0), res


def died_by_sigkill(child: Child | None, timeout: float, what: str) -> None:
    assert child is not None and child.proc is not None
    try:
        code = child.proc.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{what} did not die within {timeout:.0f}s: the fault point "
                             f"was not reached") from exc
    assert code == -signal.SIGKILL, f"{what} exited with {code}, not by SIGKILL"
