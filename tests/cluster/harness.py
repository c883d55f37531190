"""qstate on several hosts: Linux network namespaces on one machine (``loadtest.netns``).

Topology (each a host with its own address on one bridge; the test runs on the bridge's)::

    master   Spark standalone master (REST port off)
    worker-1 Spark worker (its executors) + shard server shard-1, local data on its disk
    worker-2 Spark worker (its executors) + shard server shard-2, local data on its disk
             + router-1 / router-2, the node's router (QSTATE_NODE as its shard's): it reads the
             host's partitions in-process, and the cluster map names it their read address
    driver   `qstate job tweets --master spark://master:7077 --driver-host <its address>`
    router   `qstate router --host <its address> --no-local-reads`, and `qstate coordinator
             tweets` (the standby: moves partitions while the driver is down)
    kafka    the Apache Kafka broker

Checkpoint storage (deltas, snapshots, the assignment, Spark's checkpoints) is one folder
every host sees, as a shared filesystem or object store would be. Nothing binds 127.0.0.1:
every process binds and advertises its host's address from its flags and ``QSTATE_*``
settings. The internal shard API runs as in production: TLS (a certificate for the name
``qstate-shard``, checked through ``QSTATE_TLS_SERVER_NAME`` as shards are dialled by
address) and the cluster token. The router's public side is plain HTTP with
``QSTATE_ALLOW_INSECURE`` (tests/security covers TLS and client tokens there).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pyspark

from loadtest.netns import Host, Network
from qstate.embedded.kafka import KafkaBroker
from qstate.embedded.ports import wait_for_port
from qstate.embedded.procs import Child, RouterProcess, ShardProcess, qstate_command
from tests.chaos.harness import JOB, LEASE_S, Deployment, P
from tests.helpers import wait_until

__all__ = ["SHARD_PORT", "WORKERS", "Cluster"]

WORKERS = 2
SHARD_PORT = 7100
SHARD_METRICS_PORT = 9465
JOB_METRICS_PORT = 9464
MASTER_PORT = 7077
MASTER_UI_PORT = 8080
KAFKA_PORT = 9092
SPARK_HOME = str(Path(pyspark.__file__).parent)  # the pip package: bin/, jars/, no sbin/
SPARK_CLASS = f"{SPARK_HOME}/bin/spark-class"
SERVER_NAME = "qstate-shard"
# A dead worker noticed in 10 s, not 60. Both sides must know it: the master drops a worker
# silent this long, and a worker beats every timeout/4 by its own setting (60 s by default,
# beating every 15 s, so a master told 10 s drops every worker again and again).
WORKER_TIMEOUT = "-Dspark.worker.timeout=10"


@dataclass
class Cluster(Deployment):
    net: Network = field(default_factory=Network)
    hosts: dict[str, Host] = field(default_factory=dict)
    workers: list[Child] = field(default_factory=list)
    master: Child | None = None
    standby: Child | None = None
    node_routers: dict[int, RouterProcess] = field(default_factory=dict)  # worker i -> its own
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    # ---- set-up ------------------------------------------------------------------
    @classmethod
    def build(cls, root: Path) -> Cluster:
        """The network, its hosts and the broker (the rest: :meth:`start`)."""
        net = Network(prefix="qsc", subnet="10.231.7").open()
        hosts = {n: net.add(n) for n in
                 ("master", *(f"worker-{i}" for i in range(1, WORKERS + 1)), "driver",
                  "router", "kafka")}
        broker = KafkaBroker(root / "broker", port=KAFKA_PORT, host=hosts["kafka"].address,
                             launcher=hosts["kafka"].command())
        c = cls(root, broker, net=net, hosts=hosts)
        subprocess.run(qstate_command("certs", "--out", str(c.certs), "--host", SERVER_NAME),
                       check=True, capture_output=True, timeout=60)
        return c

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts['master'].address}:{MASTER_PORT}"

    def env(self, host: str, **extra: str) -> dict[str, str]:
        """The settings every process of ``host`` starts with."""
        return {**os.environ,
                "QSTATE_HOME": str(self.root / "hosts" / host),  # the host's local disk
                "QSTATE_STORAGE": self.storage,  # shared by all hosts
                "QSTATE_METRICS_HOST": self.hosts[host].address,
                "QSTATE_CLUSTER_TOKEN": self.token,
                "QSTATE_TLS_CA": str(self.certs / "ca.pem"),
                "QSTATE_TLS_SERVER_NAME": SERVER_NAME,
                "QSTATE_LEASE_S": str(LEASE_S),
                "QSTATE_SNAPSHOT_EVERY": "5",
                "SPARK_HOME": SPARK_HOME,
                **extra}

    def child(self, name: str, host: str, args: list[str], **env: str) -> Child:
        return Child(name, self.hosts[host].command(*args), self.root / "logs" / f"{name}.log",
                     self.env(host, **env))

    def start(self) -> None:
        self.broker.start()
        self.start_master()
        for i in range(1, WORKERS + 1):
            self.start_worker(i)
        self.shards = [self.start_shard(i) for i in range(1, WORKERS + 1)]
        for i in range(1, WORKERS + 1):
            self.start_node_router(i)
        self.start_router()
        # beside the router: moves a dead shard's partitions while the driver is down
        self.standby = self.child("standby", "router", qstate_command("coordinator", JOB)).start()
        self.start_job()

    def start_master(self) -> None:
        host = self.hosts["master"]
        self.master = self.child("master", "master", [
            SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", host.address,
            "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)],
            # no REST submission server
            SPARK_MASTER_OPTS=f"-Dspark.master.rest.enabled=false {WORKER_TIMEOUT}",
            SPARK_LOG_DIR=str(self.root / "logs")).start()
        wait_for_port(host.address, MASTER_PORT, 60, self.master.proc)

    def start_worker(self, i: int) -> Child:
        name = f"worker-{i}"
        local = self.root / "hosts" / name
        w = self.child(f"spark-{name}", name, [
            SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", self.master_url,
            "--host", self.hosts[name].address, "--cores", "2", "--memory", "2g",
            "--work-dir", str(local / "spark-work"), "--webui-port", "0"],
            SPARK_LOCAL_DIRS=str(local / "spark-local"), SPARK_WORKER_OPTS=WORKER_TIMEOUT).start()
        if len(self.workers) < i:
            self.workers.append(w)
        else:
            self.workers[i - 1] = w
        wait_until(lambda: self.alive_workers() >= i, 60, f"{name} registered with the master")
        return w

    def alive_workers(self) -> int:
        try:
            r = httpx.get(f"http://{self.hosts['master'].address}:{MASTER_UI_PORT}/json/",
                          timeout=2)
            return int(r.json()["aliveworkers"])
        except (httpx.HTTPError, ValueError, KeyError):
            return 0

    def start_shard(self, i: int) -> ShardProcess:
        name = f"worker-{i}"
        address = self.hosts[name].address
        shard = ShardProcess(
            f"shard-{i}", self.hosts[name].command(*qstate_command(
                "shard", "--id", f"shard-{i}", "--host", address, "--port", str(SHARD_PORT),
                "--metrics-port", str(SHARD_METRICS_PORT))),
            self.root / "logs" / f"shard-{i}.log",
            self.env(name, QSTATE_TLS_CERT=str(self.certs / "server.pem"),
                     QSTATE_TLS_KEY=str(self.certs / "server-key.pem"), QSTATE_NODE=name),
            host=address, port=SHARD_PORT)
        return shard.start_and_wait(60)

    def shard(self, i: int, fault: str = "") -> ShardProcess:
        raise NotImplementedError("a cluster's shard i is start_shard(i + 1)")

    def start_router(self) -> None:
        address = self.hosts["router"].address
        self.router = RouterProcess(
            "router", self.hosts["router"].command(*qstate_command(
                "router", "--host", address, "--http-port", "8000", "--grpc-port", "50051",
                "--no-local-reads")),
            self.root / "logs" / "router.log",
            # a node of its own (the namespaces share one hostname): no shard's node
            self.env("router", QSTATE_ALLOW_INSECURE="true", QSTATE_NODE="router"),
            host=address, http_port=8000, grpc_port=50051).start_and_wait(60)

    def start_node_router(self, i: int) -> RouterProcess:
        """Worker host ``i``'s router: local reads of its shard's files, on the map."""
        name = f"worker-{i}"
        address = self.hosts[name].address
        r = RouterProcess(
            f"router-{i}", self.hosts[name].command(*qstate_command(
                "router", "--host", address, "--http-port", "8000", "--grpc-port", "50051")),
            self.root / "logs" / f"router-{i}.log",
            self.env(name, QSTATE_ALLOW_INSECURE="true", QSTATE_NODE=name),
            host=address, http_port=8000, grpc_port=50051).start_and_wait(60)
        self.node_routers[i] = r
        return r

    def start_job(self, fault: str = "") -> None:
        self.job = self.child("job", "driver", qstate_command(
            "job", "tweets", "--bootstrap", self.broker.bootstrap,
            "--checkpoints", str(self.root / "ckpt"), "--partitions", str(P),
            "--master", self.master_url, "--driver-host", self.hosts["driver"].address,
            "--no-live", "--max-rows-per-trigger", "50000",
            "--metrics-port", str(JOB_METRICS_PORT)), QSTATE_FAULT=fault).start()

    def stop(self) -> None:
        """The job first (it stops its executors), then every host with what runs on it."""
        if self.job is not None:
            self.job.stop(60)
        self.net.close()

    # ---- faults ------------------------------------------------------------------
    def kill_host(self, name: str) -> int:
        """kill -9 every process of host ``name`` at once (its power cut); how many."""
        return self.hosts[name].kill_all()

    def restart_worker_host(self, i: int) -> None:
        """Worker host ``i`` back: its Spark worker, its shard server (same disk) and its
        router."""
        self.start_worker(i)
        self.shards[i - 1] = self.start_shard(i)
        self.start_node_router(i)

    # ---- observation -------------------------------------------------------------
    def owners(self) -> dict[str, str]:
        """Shard id -> address, of the current assignment."""
        return self.assignment().servers

    def executor_hosts(self) -> set[str]:
        """Worker hosts that launched an executor of the job (their work folders)."""
        return {name for name in self.hosts if name.startswith("worker-")
                and any((self.root / "hosts" / name / "spark-work").glob("app-*/*/stderr"))}

    def dropped_workers(self) -> int:
        """Times the master dropped a worker it heard nothing from (its log says)."""
        log = self.root / "logs" / "master.log"
        return log.read_text(errors="replace").count("because we got no heartbeat")

    def tails(self, lines: int = 15) -> str:
        """The last lines of the job's, the master's and the workers' logs (for a failure)."""
        out = []
        for name in ("job", "master", *(f"spark-worker-{i}" for i in range(1, WORKERS + 1))):
            log = self.root / "logs" / f"{name}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            kept = [ln for ln in text.splitlines() if not ln.startswith(("\tat ", "    at "))]
            out.append(f"--- logs/{name}.log\n" + "\n".join(kept[-lines:]))
        return "\n".join(out)

    def job_metrics(self) -> str:
        """Where the driver serves /metrics."""
        return f"http://{self.hosts['driver'].address}:{JOB_METRICS_PORT}"

    def shard_metrics(self, i: int) -> str:
        return f"http://{self.hosts[f'worker-{i}'].address}:{SHARD_METRICS_PORT}"


def wait_started(c: Cluster, timeout: float = 300) -> None:
    """Until the job has committed a batch of both operators (watermark past the hour)."""
    from tests.chaos.harness import BOUNDARY

    assert c.router is not None
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(f"{c.router.url}/v1/jobs/{JOB}", timeout=2)
            ops = r.json().get("operators", []) if r.status_code == 200 else []
        except httpx.HTTPError:
            ops = []
        if len(ops) == 2 and all(o["watermark"] > BOUNDARY for o in ops):
            return
        assert c.job is not None and c.job.alive(), f"the job exited:\n{c.tails()}"
        assert time.monotonic() < deadline, f"the job did not start on the cluster:\n{c.tails()}"
        time.sleep(1)
