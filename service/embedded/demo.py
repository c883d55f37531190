"""`qstate run`: the whole pipeline on one machine with embedded defaults (docs/architecture.md §6).

Broker, two shard servers, the router, both generators and both example jobs, each a child
process we hold by PID; Ctrl-C or SIGTERM stops them all, newest first.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.text import Text

from qstate.core.records.assignment import list_servers
from qstate.core.records.storage import Storage
from qstate.core.transport.files import write_file
from qstate.core.transport.kafka import client_config
from qstate.core.transport.security import host_token, host_token_path
from qstate.embedded import guide
from qstate.embedded.kafka import KafkaBroker
from qstate.embedded.lifeline import holders
from qstate.embedded.ports import free_port, wait_for_port
from qstate.embedded.procs import Child, RouterProcess, ShardProcess, qstate_command
from qstate.embedded.prometheus import Target, targets_path, write_targets

__all__ = ["TOPICS", "Demo", "DemoConfig", "Status"]

# lines as they are, never broken at the console's width: a command or URL in the guide is
# copied from a log or a pipe (80 columns to rich) as often as from a terminal
console = Console(soft_wrap=True)
TOPICS = ("tweet-events", "ad-events")
# The jobs and generators are batch work: on the demo's one machine they take the CPU the
# router, shards and broker leave, so reads and commits wait less behind Spark tasks
# (docs/architecture.md §6). Their throughput is what is left, as it would be anyway.
BATCH_NICE = 10


@dataclass
class DemoConfig:
    home: Path
    bootstrap: str
    storage: str
    embedded_broker: bool = True
    http_port: int = 8000
    grpc_port: int = 50051
    shard_base_port: int = 7100
    shard_metrics_base_port: int = 9465  # and the next one; 0: any free ones
    tweets_rate: int = 5000
    tweet_keys: int = 100_000
    ads_rate: int = 1000
    partitions: int = 16
    duration_s: float | None = None
    router_workers: int = 1
    job_metrics_port: int = 0  # 0: a free one
    event_log: Path | None = None  # a folder: each generator logs its acknowledged events


class Demo:
    def __init__(self, cfg: DemoConfig) -> None:
        self.cfg = cfg
        self.children: list[Child] = []
        self.broker: KafkaBroker | None = None
        self.stop_event = threading.Event()
        self.job_metrics = ""
        self.targets: list[Target] = []

    def _spawn(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def ports(self) -> list[int]:
        """The fixed ports the demo binds (0s are free ones, found at start)."""
        cfg = self.cfg
        fixed = [int(cfg.bootstrap.rsplit(":", 1)[1])] if cfg.embedded_broker else []
        fixed += [cfg.shard_base_port, cfg.shard_base_port + 1, cfg.http_port, cfg.grpc_port,
                  cfg.job_metrics_port]
        if cfg.shard_metrics_base_port:
            fixed += [cfg.shard_metrics_base_port, cfg.shard_metrics_base_port + 1]
        return [p for p in fixed if p]

    def start(self) -> None:
        cfg, logs = self.cfg, self.cfg.home / "logs"
        host, port = cfg.bootstrap.rsplit(":", 1)
        if cfg.embedded_broker:
            console.print(f"starting dev broker on {cfg.bootstrap} (data in {cfg.home/'broker'})")
            self.broker = KafkaBroker(cfg.home / "broker", int(port), host,
                                    log_path=logs / "broker.log").start()
        else:
            wait_for_port(host, int(port), 10)
        # The shard API is closed even in the demo: the host's token (or the one set), given
        # to the processes it starts through their environment, never printed, and kept in
        # a file only its user may read, for tools run beside it (state inspect).
        token = os.environ.get("QSTATE_CLUSTER_TOKEN", "")
        if token:
            cfg.home.mkdir(parents=True, exist_ok=True)
            write_file(host_token_path(cfg.home), token.encode(), secret=True)
        else:
            token = host_token(cfg.home)
        env = {**os.environ, "QSTATE_CLUSTER_TOKEN": token}
        shards: list[ShardProcess] = []
        for i in range(2):
            s = ShardProcess.make(f"shard-{i}", cfg.home / "shards", cfg.storage, logs,
                                  port=cfg.shard_base_port + i, env=env,
                                  metrics_port=cfg.shard_metrics_base_port + i
                                  if cfg.shard_metrics_base_port else 0)
            self._spawn(s.start_and_wait())
            shards.append(s)
        router = RouterProcess.make(cfg.storage, logs, env=env)
        router.http_port, router.grpc_port = cfg.http_port, cfg.grpc_port
        router.args = qstate_command("router", "--http-port", str(cfg.http_port),
                                     "--grpc-port", str(cfg.grpc_port), "--storage", cfg.storage,
                                     "--workers", str(cfg.router_workers))
        self._spawn(router.start_and_wait())
        mapping = cfg.home / "ads-campaigns.json"
        if cfg.event_log:
            cfg.event_log.mkdir(parents=True, exist_ok=True)
        for name, rate, keys in (("tweets", cfg.tweets_rate, cfg.tweet_keys),
                                 ("ads", cfg.ads_rate, 100)):
            log = ("--log", str(cfg.event_log / f"{name}.jsonl")) if cfg.event_log else ()
            self._spawn(Child(f"generate-{name}", qstate_command(
                "generate", name, "--bootstrap", cfg.bootstrap, "--rate", str(rate),
                "--keys", str(keys), "--disorder-ms", "2000", "--mapping", str(mapping),
                "--no-progress", *log), logs / f"generate-{name}.log", nice=BATCH_NICE).start())
        deadline = time.monotonic() + 30
        while not mapping.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.job_metrics = f"127.0.0.1:{cfg.job_metrics_port or free_port()}"
        self._spawn(Child("jobs", qstate_command(
            "job", "tweets", "ads", "--bootstrap", cfg.bootstrap, "--storage", cfg.storage,
            "--checkpoints", str(cfg.home / "checkpoints"), "--option", f"mapping={mapping}",
            "--shards", ",".join(s.address for s in shards), "--partitions",
            str(cfg.partitions), "--metrics-port", self.job_metrics.rsplit(":", 1)[1],
            "--no-live"), logs / "jobs.log", env, nice=BATCH_NICE).start())
        self.targets = [Target("router", "router", f"127.0.0.1:{cfg.http_port}"),
                        *(Target("shard", s.name, self._shard_metrics(s)) for s in shards),
                        Target("job", "jobs", self.job_metrics)]
        self.write_targets()
        console.print(guide.endpoints(self.targets, targets_path(cfg.home)), markup=False,
                      highlight=False)

    def _shard_metrics(self, shard: ShardProcess, timeout: float = 30.0) -> str:
        """host:port of a shard's /metrics: it registers the address in storage once up."""
        deadline = time.monotonic() + timeout
        while True:
            info = next((i for i in list_servers(Storage(self.cfg.storage))
                         if i.id == shard.name and i.pid == shard.pid), None)
            if info is not None or time.monotonic() > deadline:
                return info.metrics if info is not None else ""
            time.sleep(0.1)

    def write_targets(self) -> None:
        """Prometheus's targets file (deploy/prometheus/prometheus.yml reads it): written
        once every process is started (the demo restarts none: a child that dies ends it)."""
        write_targets(targets_path(self.cfg.home), [t for t in self.targets if t.address])

    def stop(self) -> None:
        for child in reversed(self.children):
            # generators flush on SIGINT; everything else stops on its own stop signal
            child.stop(timeout=30, sig=signal.SIGINT if child.name.startswith("generate")
                       else None)
        if self.broker is not None:
            self.broker.stop()
        # no targets left behind for a Prometheus still running: they are gone
        targets_path(self.cfg.home).unlink(missing_ok=True)

    def _failed(self) -> Child | None:
        return next((c for c in self.children if not c.alive()), None)

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop_event.set())
        held = holders(self.ports())
        if held:  # e.g. an earlier run's processes: say which, not "shard-0 exited (3)"
            console.print("[red]cannot start: ports it needs are in use[/red]")
            for h in held:
                console.print(f"  {h}", markup=False, highlight=False)
            console.print("Stop those processes (an earlier `qstate run`?), or give other "
                          "ports (QSTATE_HTTP_PORT, QSTATE_GRPC_PORT, QSTATE_SHARD_PORT, ...: "
                          "qstate run --help).", markup=False, highlight=False)
            return 2
        try:
            self.start()
            return self._watch()
        finally:
            console.print("stopping...")
            self.stop()
            console.print("all processes stopped")

    def _watch(self) -> int:
        cfg = self.cfg
        url = f"http://127.0.0.1:{cfg.http_port}"
        status = Status(cfg.bootstrap, url, f"http://{self.job_metrics}/metrics")
        shown = warned = False
        started = time.monotonic()
        with Live(Text("starting Spark..."), console=console, refresh_per_second=2) as live:
            while not self.stop_event.wait(1.0):
                dead = self._failed()
                if dead is not None:
                    code = dead.proc.returncode if dead.proc else None
                    console.print(f"[red]{dead.name} exited ({code}); see {dead.log_path}[/red]")
                    return 1
                line, key = status.poll()
                live.update(line)
                warning = None if warned else status.falling_behind()
                if warning:
                    warned = True
                    console.print(f"[yellow]{warning}[/yellow]")
                if key and not shown:
                    shown = True
                    console.print(guide.queries(url, cfg.grpc_port, key, cfg.home), style="green",
                                  markup=False, highlight=False)
                if cfg.duration_s and time.monotonic() - started > cfg.duration_s:
                    return 0
        return 0


class Status:
    """events/s per topic (broker high watermarks), last batch and watermark age per job."""

    def __init__(self, bootstrap: str, url: str, job_metrics: str) -> None:
        self.consumer = Consumer(client_config(bootstrap, None, **{"group.id": "qstate-status"}))
        self.http = httpx.Client(base_url=url, timeout=0.5)
        self.job_metrics = job_metrics
        self.last: dict[str, tuple[float, int]] = {}
        self.history: list[tuple[float, float]] = []  # (monotonic time, events behind)

    def falling_behind(self, window_s: float = 60.0, floor: float = 100_000) -> str | None:
        """A warning when the jobs have been behind by more than ``floor`` events for
        ``window_s`` and the backlog kept growing: this machine cannot keep up with the
        generators, so answers will only get older."""
        now = time.monotonic()
        self.history = [(t, b) for t, b in self.history if now - t <= window_s + 5]
        old = [b for t, b in self.history if now - t >= window_s]
        if not old or len(self.history) < 10:
            return None
        first, last = old[-1], self.history[-1][1]
        if min(b for _, b in self.history) > floor and last > first:
            return (f"the jobs are falling behind the generators on this machine ({last:,.0f} "
                    f"events behind, {first:,.0f} a minute ago): answers get older. "
                    f"Try lower rates, e.g. qstate run --tweets-rate 2500 --ads-rate 500")
        return None

    def _job_metrics(self) -> tuple[dict[str, float], list[str]]:
        """Events not read yet per topic (``qstate_job_lag_events``) and the jobs whose
        queries failed (``qstate_job_up`` 0)."""
        try:
            text = self.http.get(self.job_metrics).text
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        except (httpx.HTTPError, ValueError):  # the job not up yet, or restarting
            return {}, []
        return ({s.labels["topic"]: s.value for s in samples
                 if s.name == "qstate_job_lag_events"},
                [s.labels["job"] for s in samples if s.name == "qstate_job_up" and not s.value])

    def _rate(self, topic: str) -> float:
        try:
            md = self.consumer.list_topics(topic, timeout=0.5).topics[topic]
            total = sum(self.consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                            timeout=0.5)[1]
                        for p in md.partitions)
        except Exception:
            return 0.0
        now = time.monotonic()
        prev = self.last.get(topic)
        self.last[topic] = (now, total)
        return (total - prev[1]) / (now - prev[0]) if prev and now > prev[0] else 0.0

    def poll(self) -> tuple[Text, str | None]:
        line = Text()
        behind, failed = self._job_metrics()
        for job in failed:
            line.append(f"job {job} FAILED (see logs/jobs.log)  ", style="bold red")
        if behind:
            now = time.monotonic()
            self.history = [(t, b) for t, b in self.history if now - t <= 120]
            self.history.append((now, sum(behind.values())))
        for topic in TOPICS:
            line.append(f"{topic} {self._rate(topic):,.0f} ev/s")
            if topic in behind:
                line.append(f" ({behind[topic]:,.0f} behind)",
                            style="yellow" if behind[topic] else "")
            line.append("  ")
        key = None
        for job in ("tweets", "ads"):
            try:
                ops = self.http.get(f"/v1/jobs/{job}").json().get("operators", [])
            except (httpx.HTTPError, ValueError):
                ops = []
            for op in ops:
                if op["last_batch"] >= 0:
                    age = time.time() - op["watermark"] / 1000
                    line.append(f"| {job}/{op['name']} batch {op['last_batch']} "
                                f"watermark {age:,.0f}s ago ", style="cyan")
        try:
            r = self.http.get("/v1/state/tweets/per_tweet_1h/impressions/tw-1")
            if r.status_code == 200:
                key = "tw-1"
        except httpx.HTTPError:
            pass
        return line, key
