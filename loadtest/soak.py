"""Soak: ``qstate run`` as shipped, checked once a minute (issue 9: overload without collapse).

    python -m loadtest.soak --minutes 60          # loadtest/results/soak.md and soak.png

It starts ``python -m qstate run`` (what ``make run`` starts) with its default rates in a
fresh home, in its own process group, and at every sample records:

- the watermark age of every operator (the router's ``/v1/jobs/{job}``) and the events not
  read yet (the job's ``qstate_job_lag_events``);
- reassignments after start-up (``qstate_job_reassignments_total``; the goal is 0);
- the router's latency over 100 reads of random tweet keys (p50, p99) and every answer that
  was neither 200 nor 404;
- a marker: ``kcat`` produces ``MARKER_EVENTS`` impressions of a fresh tweet id stamped now;
  the time until the router answers exactly that count is the freshness sample, and every
  earlier marker is read again and must still be exact (not lost, not counted twice).

``--hog-at``/``--hog-minutes`` saturate both cores with busy processes for a while, to show a
busy shard is not declared dead. At the end a Ctrl-C goes to the whole process group, the way
a terminal sends it, and the time until every process is gone is recorded.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Annotated, Any

import httpx
import typer
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from loadtest import results
from qstate.core.config import DEFAULTS
from qstate.core.windows import floor_to
from qstate.embedded.ports import free_port, free_ports

__all__ = ["MARKER_EVENTS", "DemoRun", "Sample", "Soak", "Summary", "write_results"]

log = logging.getLogger(__name__)
console = Console(stderr=True)
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "loadtest" / "results" / "soak.md"
MARKER_EVENTS = 3
TWEET_KEYS = 100_000  # `qstate run`'s default --tweet-keys
OPERATORS = {"tweets": ("per_tweet_1h", "per_tweet_1m"), "ads": ("campaign_views_10s",)}
# what `qstate run` starts, told apart by command line (the roles a Ctrl-C must stop)
ROLES = {"broker": "kafka.Kafka", "shard": "qstate shard", "router": "qstate router",
         "generate-tweets": "generate tweets", "generate-ads": "generate ads",
         "jobs": "job tweets ads", "spark": "SparkSubmit", "spark-python": "pyspark.daemon"}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, grandchildren...)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class DemoRun:
    """``python -m qstate run`` in a fresh home with free ports, as its own process group."""

    home: Path
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # QSTATE_ settings beside the defaults
    http: int = field(default_factory=free_port)
    grpc: int = field(default_factory=free_port)
    kafka: int = field(default_factory=free_port)
    shard: int = field(default_factory=lambda: free_ports(2))  # shard-0's; shard-1 the next
    job_metrics: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    roles: dict[int, str] = field(default_factory=dict)  # pid -> role, as seen while running

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka}"

    @property
    def log_path(self) -> Path:
        return self.home / "run.log"

    def start(self) -> DemoRun:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "QSTATE_HOME": str(self.home / "home"),
               "QSTATE_KAFKA_BOOTSTRAP": self.bootstrap, "QSTATE_HTTP_PORT": str(self.http),
               "QSTATE_GRPC_PORT": str(self.grpc), "QSTATE_SHARD_PORT": str(self.shard),
               "QSTATE_JOB_METRICS_PORT": str(self.job_metrics),
               "QSTATE_SHARD_METRICS_PORT": "0",  # any free ones: beside another qstate run
               **self.env}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "qstate", "run", *self.args],
                                         cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def see(self) -> dict[int, str]:
        """Record the roles of the processes running now."""
        assert self.proc is not None
        for pid in descendants(self.proc.pid):
            cmd = _cmdline(pid)
            role = next((r for r, mark in ROLES.items() if mark in cmd), None)
            if role:
                self.roles[pid] = role
        return self.roles

    def memory(self) -> dict[str, float]:
        """Resident MiB of each process running now, by role: processes of one role told
        apart by start order (``shard-0``, ``shard-1``); Spark's Python workers, which come
        and go, summed."""
        out: dict[str, float] = {}
        by_role: dict[str, list[int]] = {}
        for pid, role in sorted(self.see().items()):
            by_role.setdefault(role, []).append(pid)
        for role, pids in by_role.items():
            sizes = [(pid, mb) for pid in pids if (mb := rss_mb(pid)) is not None]
            if role == "spark-python" or len(pids) == 1:
                if sizes:
                    out[role] = sum(mb for _, mb in sizes)
            else:
                out.update({f"{role}-{i}": mb for i, (pid, mb) in enumerate(sizes)})
        return out

    def disk(self) -> dict[str, float]:
        """MiB on disk of each shard server's partitions (their RocksDB files), by the role
        names ``memory`` gives: what a shard's memory is compared with. Its dot-folders
        (``.scratch``: a snapshot being taken, of hard links to the same files;
        ``.savepoints``) are not the live state."""
        shards = self.home / "home" / "shards"
        out: dict[str, float] = {}
        for folder in sorted(shards.glob("shard-*")) if shards.is_dir() else []:
            files: dict[tuple[int, int], int] = {}  # (device, inode) -> size: links once
            for job in folder.iterdir():
                if job.name.startswith(".") or not job.is_dir():
                    continue
                # os.walk passes over a folder removed while it walks (a partition moved)
                for root, _, names in os.walk(job):
                    for name in names:
                        try:
                            st = os.lstat(os.path.join(root, name))
                        except OSError:
                            continue  # a file compacted away while summing
                        if S_ISREG(st.st_mode):
                            files[(st.st_dev, st.st_ino)] = st.st_size
            out[folder.name] = sum(files.values()) / (1 << 20)
        return out

    def ctrl_c(self, bound_s: float = 10.0) -> tuple[int | None, float, dict[int, str]]:
        """SIGINT to the whole group, as a terminal sends it; returns (exit code, seconds until
        every process seen was gone, processes still alive after ``bound_s``: those are
        killed, they are ours)."""
        assert self.proc is not None
        pid = self.proc.pid
        return self._stop(lambda: os.killpg(pid, signal.SIGINT), bound_s)

    def kill9(self, bound_s: float = 10.0) -> tuple[int | None, float, dict[int, str]]:
        """SIGKILL to ``qstate run`` alone (the OOM killer, a closed session): what
        ``ctrl_c`` returns; its children must go by themselves."""
        assert self.proc is not None
        proc = self.proc
        return self._stop(proc.kill, bound_s)

    def _stop(self, send: Callable[[], None], bound_s: float
              ) -> tuple[int | None, float, dict[int, str]]:
        assert self.proc is not None
        seen = descendants(self.proc.pid) | set(self.roles)
        send()
        t0 = time.monotonic()
        try:
            rc: int | None = self.proc.wait(max(bound_s, 90))
        except subprocess.TimeoutExpired:
            rc = None
        while any(alive(p) for p in seen) and time.monotonic() - t0 < bound_s:
            time.sleep(0.05)
        took = time.monotonic() - t0
        left = {p: self.roles.get(p, _cmdline(p)[:80]) for p in seen if alive(p)}
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return rc, took, left


@dataclass
class Sample:
    minute: float
    watermark_age_s: dict[str, float]  # job/operator -> now - watermark
    batches: dict[str, int]  # job/operator -> last batch
    behind: float  # events not read yet, every topic
    reassignments: float
    read_p50_ms: float
    read_p99_ms: float
    bad_answers: int  # reads answered neither 200 nor 404
    marker_visible_s: float | None  # None: not exact within the marker deadline
    markers_exact: int  # read back exact, or gone once past retention (``marker_ok``)
    markers_total: int
    markers_expired: int = 0  # of markers_exact, those gone past retention
    rss_mb: dict[str, float] = field(default_factory=dict)  # role -> resident MiB
    disk_mb: dict[str, float] = field(default_factory=dict)  # shard-i -> MiB of its folder


@dataclass
class Summary:
    samples: list[Sample]
    lag_slope_per_min: float  # events behind, least-squares slope after warm-up
    age_slope_per_min: float  # max watermark age, same
    reassignments: float
    bad_answers: int
    markers_wrong: int
    freshness_p50_s: float
    freshness_p99_s: float
    rss_slope_mb_per_min: dict[str, float] = field(default_factory=dict)  # after warm-up
    disk_slope_mb_per_min: dict[str, float] = field(default_factory=dict)  # same, on disk
    warmup_min: float = 0.0
    stop_s: float | None = None
    left_running: dict[int, str] = field(default_factory=dict)


def newest_end(event_ms: int, window: dict[str, Any]) -> int:
    """End of the newest window of an operator (``window`` as ``/v1/jobs`` describes it)
    that holds an event at ``event_ms``: the last of its windows retention drops. A session
    or unwindowed state has none (never dropped by time here)."""
    if window.get("kind") not in ("tumbling", "sliding"):
        return 1 << 62
    size = window["size_ms"]
    return floor_to(event_ms, window.get("slide_ms") or size) + size


def marker_ok(value: int, end_ms: int, cutoff_ms: int | None) -> bool:
    """A marker's count read back is right if exact, or absent once retention may have
    dropped every window holding it: a shard drops a window that ended at or before its
    watermark minus the retention (``cutoff_ms``, the operator's as ``/v1/jobs`` answered
    just after the read; None: no watermark yet), and ``end_ms`` is the newest such
    window's end (``newest_end``). Any other count is lost or counted twice."""
    if value == MARKER_EVENTS:
        return True
    return value == 0 and cutoff_ms is not None and end_ms <= cutoff_ms


def _slope(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


class Soak:
    """Samples a running demo; ``run`` drives the whole soak."""

    def __init__(self, demo: DemoRun, marker_deadline_s: float = 45.0) -> None:
        self.demo = demo
        self.http = httpx.Client(base_url=demo.url, timeout=10)
        self.marker_deadline_s = marker_deadline_s
        self.markers: list[str] = []
        self.expired = 0  # of the right markers at the last sample, those past retention
        self.produced: dict[str, int] = {}  # marker -> its events' time (ms)
        self.wrong: set[str] = set()  # markers ever read wrong: wrong for the rest of the run
        self.started = time.monotonic()
        self.rng = random.Random(7)

    def close(self) -> None:
        self.http.close()

    # ---- readings ---------------------------------------------------------------------
    def operators(self) -> dict[str, dict]:
        out = {}
        for job in OPERATORS:
            try:
                r = self.http.get(f"/v1/jobs/{job}")
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                out.update({f"{job}/{o['name']}": o for o in r.json().get("operators", [])})
        return out

    def job_metric(self, name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.demo.job_metrics}/metrics", timeout=10).text
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == name)

    def wait_ready(self, timeout_s: float = 300) -> float:
        """Until every operator has committed a batch and the job's metrics answer."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.demo.running():
                raise RuntimeError(f"qstate run exited:\n{self.demo.tail()}")
            self.demo.see()
            ops = self.operators()
            if len(ops) == sum(map(len, OPERATORS.values())) and \
                    all(o["last_batch"] >= 0 for o in ops.values()):
                try:
                    self.job_metric("qstate_job_lag_events")
                    return time.monotonic() - self.started
                except httpx.HTTPError:
                    pass
            time.sleep(1)
        raise TimeoutError(f"not ready within {timeout_s}s:\n{self.demo.tail()}")

    def reads(self, n: int = 100) -> tuple[list[float], int]:
        latencies, bad = [], 0
        for _ in range(n):
            key = f"tw-{self.rng.randrange(TWEET_KEYS)}"
            t0 = time.perf_counter()
            try:
                r = self.http.get(f"/v1/state/tweets/per_tweet_1h/impressions/{key}")
                status = r.status_code
            except httpx.HTTPError:
                status = 0
            latencies.append((time.perf_counter() - t0) * 1000)
            bad += status not in (200, 404)
        return latencies, bad

    def marker_values(self, keys: list[str]) -> dict[str, dict[str, int]]:
        """operator -> key -> latest count of each marker key (0 when absent)."""
        out: dict[str, dict[str, int]] = {}
        for op in OPERATORS["tweets"]:
            out[op] = {}
            for i in range(0, len(keys), DEFAULTS.max_batch_keys):
                r = self.http.post(f"/v1/state/tweets/{op}/impressions:batchGet",
                                   json={"keys": keys[i:i + DEFAULTS.max_batch_keys]})
                r.raise_for_status()
                out[op].update({a["key"]: (a["windows"][0]["value"] if a.get("windows") else 0)
                                for a in r.json()["results"]})
        return out

    def produce_marker(self) -> str:
        key = f"soak-marker-{len(self.markers):04d}"
        now_ms = int(time.time() * 1000)
        lines = "".join(f"{key}|" + json.dumps({"tweet_id": key, "event": "impression",
                                                "time": now_ms}) + "\n"
                        for _ in range(MARKER_EVENTS))
        subprocess.run(["kcat", "-P", "-b", self.demo.bootstrap, "-t", "tweet-events",
                        "-K", "|"], input=lines.encode(), check=True, timeout=30)
        self.markers.append(key)
        self.produced[key] = now_ms
        return key

    def marker(self) -> tuple[float | None, int]:
        """Produce a marker, time it until exact; then count the exact ones among all."""
        key = self.produce_marker()
        t0 = time.monotonic()
        visible = None
        while time.monotonic() - t0 < self.marker_deadline_s:
            try:
                values = self.marker_values([key])
            except httpx.HTTPError:
                values = {}
            if values and all(v[key] == MARKER_EVENTS for v in values.values()):
                visible = time.monotonic() - t0
                break
            time.sleep(0.1)
        values = self.marker_values(self.markers)
        ops = self.operators()  # after the read: a watermark at least the read's
        cutoffs = {op: o["watermark"] - o["retention_ms"] if o["watermark"] > 0 else None
                   for op, o in ops.items()}

        def ok(op: str, k: str) -> bool:  # unknown operator or watermark: only exact
            o = ops.get(f"tweets/{op}")
            end = newest_end(self.produced[k], o["window"]) if o else 0
            return marker_ok(values[op][k], end, cutoffs.get(f"tweets/{op}"))

        # a marker lost before retention could drop it stays lost when, later, it could have
        self.wrong.update(k for k in self.markers if not all(ok(op, k) for op in values))
        right = [k for k in self.markers if k not in self.wrong]
        self.expired = sum(any(values[op][k] == 0 for op in values) for k in right)
        return visible, len(right)

    def sample(self) -> Sample:
        self.demo.see()
        now = time.time()
        ops = self.operators()
        latencies, bad = self.reads()
        visible, exact = self.marker()
        return Sample(
            minute=(time.monotonic() - self.started) / 60,
            # no watermark yet (0) is not an age
            watermark_age_s={k: now - o["watermark"] / 1000 for k, o in ops.items()
                             if o["watermark"] > 0},
            batches={k: o["last_batch"] for k, o in ops.items()},
            behind=self.job_metric("qstate_job_lag_events"),
            reassignments=self.job_metric("qstate_job_reassignments_total"),
            read_p50_ms=results.quantile(latencies, 0.5),
            read_p99_ms=results.quantile(latencies, 0.99),
            bad_answers=bad, marker_visible_s=visible, markers_exact=exact,
            markers_total=len(self.markers), markers_expired=self.expired,
            rss_mb=self.demo.memory(),
            disk_mb=self.demo.disk())

    def run(self, minutes: float, interval_s: float = 60, warmup_min: float = 5,
            hog_at: float | None = None, hog_minutes: float = 1.0,
            on_sample: Callable[[Sample, bool], None] | None = None) -> Summary:
        """Sample every ``interval_s`` for ``minutes`` once ready; ``hog_at`` (minutes after
        ready) saturates every core for ``hog_minutes``."""
        self.wait_ready()
        ready = time.monotonic()
        samples: list[Sample] = []
        hog: list[subprocess.Popen[bytes]] = []
        end = ready + minutes * 60
        try:
            while time.monotonic() < end:
                tick = time.monotonic()
                since = (tick - ready) / 60
                if hog_at is not None and not hog and hog_at <= since < hog_at + hog_minutes:
                    hog = cpu_hog()
                elif hog and since >= (hog_at or 0) + hog_minutes:
                    stop(hog)
                    hog = []
                if not self.demo.running():
                    raise RuntimeError(f"qstate run exited:\n{self.demo.tail()}")
                samples.append(self.sample())
                if on_sample:
                    on_sample(samples[-1], bool(hog))
                time.sleep(max(0.0, interval_s - (time.monotonic() - tick)))
        finally:
            stop(hog)
        return summarize(samples, warmup_min)


def summarize(samples: list[Sample], warmup_min: float) -> Summary:
    steady = [s for s in samples if s.minute >= warmup_min] or samples
    xs = [s.minute for s in steady]
    fresh = [s.marker_visible_s for s in samples if s.marker_visible_s is not None]
    last = samples[-1] if samples else None
    return Summary(
        samples=samples,
        lag_slope_per_min=_slope(xs, [s.behind for s in steady]),
        age_slope_per_min=_slope(xs, [max(s.watermark_age_s.values(), default=0)
                                      for s in steady]),
        reassignments=last.reassignments if last else 0,
        bad_answers=sum(s.bad_answers for s in samples),
        markers_wrong=(last.markers_total - last.markers_exact) if last else 0,
        freshness_p50_s=results.quantile(fresh, 0.5),
        freshness_p99_s=results.quantile(fresh, 0.99), warmup_min=warmup_min,
        rss_slope_mb_per_min=_slopes(steady, "rss_mb"),
        disk_slope_mb_per_min=_slopes(steady, "disk_mb"))


def _slopes(samples: list[Sample], what: str) -> dict[str, float]:
    """Least-squares MiB/min of each process's ``rss_mb`` or shard's ``disk_mb``."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for s in samples:
        for name, mb in getattr(s, what).items():
            xs, ys = series.setdefault(name, ([], []))
            xs.append(s.minute)
            ys.append(mb)
    return {name: _slope(xs, ys) for name, (xs, ys) in sorted(series.items())}


def cpu_hog(n: int | None = None) -> list[subprocess.Popen[bytes]]:
    """Busy loops, one more than there are cores: every core saturated."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(n or (os.cpu_count() or 2) + 1)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def write_results(summary: Summary, out: Path, command: str,
                  settings: dict[str, str] | None = None) -> None:
    """The table (markdown) and a plot of lag and watermark age over time (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary.samples
    png = out.with_suffix(".png")
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    ax1.plot([x.minute for x in s], [x.behind for x in s], marker=".")
    ax1.set_ylabel("events behind")
    ax1.set_title("qstate run: lag over time")
    for op in sorted({k for x in s for k in x.watermark_age_s}):
        ax2.plot([x.minute for x in s], [x.watermark_age_s.get(op, float("nan")) for x in s],
                 marker=".", label=op)
    ax2.plot([x.minute for x in s], [x.marker_visible_s or float("nan") for x in s],
             marker="x", label="marker visible after (s)")
    ax2.set_ylabel("seconds")
    ax2.legend(fontsize=8)
    roles = sorted({r for x in s for r in x.rss_mb})
    for role in roles:
        ax3.plot([x.minute for x in s], [x.rss_mb.get(role, float("nan")) for x in s],
                 marker=".", label=role)
    shards = sorted({r for x in s for r in x.disk_mb})
    for shard in shards:
        ax3.plot([x.minute for x in s], [x.disk_mb.get(shard, float("nan")) for x in s],
                 linestyle="--", label=f"{shard} on disk")
    ax3.set_ylabel("resident MiB (on disk: dashed)")
    ax3.set_xlabel("minutes since start")
    ax3.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    ops = sorted({k for x in s for k in x.watermark_age_s})
    rows = [
        "| min | " + " | ".join(f"{op} wm age s" for op in ops) +
        " | behind | reassign. | read p50 / p99 ms | bad answers | marker visible s "
        "| markers exact | " + " | ".join(f"{r} MiB" for r in roles) +
        "".join(f" | {d} disk MiB" for d in shards) + " |",
        "|---" * (len(ops) + 7 + len(roles) + len(shards)) + "|",
    ]
    for x in s:
        vis = f"{x.marker_visible_s:.2f}" if x.marker_visible_s is not None else "not in time"
        rows.append(f"| {x.minute:.1f} | " +
                    " | ".join(f"{x.watermark_age_s.get(op, float('nan')):.1f}" for op in ops) +
                    f" | {x.behind:,.0f} | {x.reassignments:.0f} | {x.read_p50_ms:.1f} / "
                    f"{x.read_p99_ms:.1f} | {x.bad_answers} | {vis} | "
                    f"{x.markers_exact}/{x.markers_total}"
                    f"{f' ({x.markers_expired} expired)' if x.markers_expired else ''} | " +
                    " | ".join(f"{x.rss_mb.get(r, float('nan')):.0f}" for r in roles) +
                    "".join(f" | {x.disk_mb.get(d, float('nan')):.0f}" for d in shards) + " |")
    stop_line = (f"{summary.stop_s:.1f} s, left running: {summary.left_running or 'none'}"
                 if summary.stop_s is not None else "not measured")
    out.write_text("\n".join([
        "# Soak: `qstate run` as shipped",
        "",
        f"Command: `{command}`",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M')} on this machine "
        f"({os.cpu_count()} cores). Plot: [{png.name}]({png.name}).",
        "",
        *(["Settings beside `qstate run`'s defaults: " + ", ".join(
            f"`{k}={v}`" for k, v in sorted(settings.items())), ""] if settings else []),
        f"- lag trend after warm-up: {summary.lag_slope_per_min:+,.0f} events/min; "
        f"watermark age trend {summary.age_slope_per_min:+.2f} s/min",
        f"- reassignments: {summary.reassignments:.0f}; bad answers: {summary.bad_answers}; "
        f"markers not exact: {summary.markers_wrong}" + (
            " (a marker reading 0 once retention dropped every window holding it is right: "
            "expired)" if any(x.markers_expired for x in s) else ""),
        f"- freshness (marker produced -> exact through HTTP): p50 "
        f"{summary.freshness_p50_s:.2f} s, p99 {summary.freshness_p99_s:.2f} s",
        f"- Ctrl-C to the process group: every process gone after {stop_line}",
        "- resident memory after warm-up (first → last sample, trend): " + "; ".join(
            f"{r} {_first_last(s, 'rss_mb', r, summary.warmup_min)} MiB, "
            f"{summary.rss_slope_mb_per_min.get(r, 0):+.1f} MiB/min" for r in roles),
        "- each shard's folder on disk after warm-up (first → last sample, trend): " + "; ".join(
            f"{d} {_first_last(s, 'disk_mb', d, summary.warmup_min)} MiB, "
            f"{summary.disk_slope_mb_per_min.get(d, 0):+.1f} MiB/min" for d in shards),
        "",
        *rows,
        "",
    ]))


def _first_last(samples: list[Sample], what: str, name: str, warmup_min: float) -> str:
    have = [getattr(x, what)[name] for x in samples
            if name in getattr(x, what) and x.minute >= warmup_min]
    return f"{have[0]:.0f} → {have[-1]:.0f}" if have else "n/a"


def main(
    minutes: Annotated[float, typer.Option(help="How long to sample, after start-up.")] = 60,
    interval: Annotated[float, typer.Option(help="Seconds between samples.")] = 60,
    warmup: Annotated[float, typer.Option(help="Minutes left out of the lag trend.")] = 5,
    hog_at: Annotated[float | None, typer.Option(
        help="Minute (after start-up) at which to saturate every core.")] = None,
    hog_minutes: Annotated[float, typer.Option(help="How long the CPU hog runs.")] = 1.0,
    retention_minutes: Annotated[float | None, typer.Option(
        min=0.1, help="How long closed windows are kept (QSTATE_RETENTION_MS for the demo); unset: "
        "qstate's default, 24 h, which an hour's soak never reaches, so the state on disk "
        "grows all along.")] = None,
    out: Annotated[Path, typer.Option(help="Results file.")] = RESULTS,
) -> None:
    """Run ``qstate run`` for MINUTES and record lag, freshness and exactness."""
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    command = "python -m loadtest.soak " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="qstate-soak-") as tmp:
        settings = ({"QSTATE_RETENTION_MS": str(int(retention_minutes * 60_000))}
                    if retention_minutes is not None else {})
        demo = DemoRun(Path(tmp), env=settings).start()
        soak = Soak(demo)

        def show(s: Sample, hogging: bool) -> None:
            ages = ", ".join(f"{k} {v:.0f}s" for k, v in s.watermark_age_s.items())
            console.print(f"[{s.minute:5.1f} min]{' (cpu hog)' if hogging else ''} "
                          f"behind {s.behind:,.0f}; watermark age {ages}; reassignments "
                          f"{s.reassignments:.0f}; read p99 {s.read_p99_ms:.1f} ms; marker "
                          f"{s.marker_visible_s}; exact {s.markers_exact}/{s.markers_total} "
                          f"({s.markers_expired} expired); "
                          "MiB " + ", ".join(f"{k} {v:.0f}" for k, v in s.rss_mb.items()) +
                          "; on disk " + ", ".join(f"{k} {v:.0f}" for k, v in s.disk_mb.items()))
        try:
            summary = soak.run(minutes, interval, warmup, hog_at, hog_minutes, show)
        finally:
            soak.close()
            rc, took, left = demo.ctrl_c()
        summary.stop_s, summary.left_running = took, left
        write_results(summary, out, command, settings)
        console.print(f"wrote {out} (exit code of qstate run: {rc})")
        ok = (summary.reassignments == 0 and summary.bad_answers == 0
              and summary.markers_wrong == 0 and not left)
        raise typer.Exit(0 if ok else 1)


if __name__ == "__main__":
    typer.run(main)
