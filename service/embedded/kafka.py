"""The embedded broker: a single-node Apache Kafka in KRaft mode (one process, broker and
controller), started from the jars `make setup` fetched (``deploy/maven/kafka-broker.pom.xml``).

It is what `qstate run`, the tests (one per session) and the benchmarks talk to; a real
cluster is used instead by pointing ``QSTATE_KAFKA_BOOTSTRAP`` at it. The data directory
is formatted once and keeps its ports, so a restarted broker (``stop``/``kill`` then
``start``) comes back with its topics and offsets, as a Kafka node does.
"""

from __future__ import annotations

import base64
import logging
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from qstate.core.config import DEFAULTS
from qstate.core.errors import BrokerError
from qstate.core.process.jvm import java
from qstate.core.transport.kafka import client_config
from qstate.embedded.lifeline import die_with_parent
from qstate.embedded.ports import free_port

__all__ = ["KafkaBroker", "broker_classpath", "cluster_id"]

log = logging.getLogger(__name__)

_LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
"""


def cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64, as Kafka makes them, and like
    Kafka never one that starts with "-" (1 in 64 would: the format tool then reads it as an
    option and refuses to start, a rare flaky failure of every broker start-up)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def broker_classpath(jars: str) -> str:
    folder = Path(jars or DEFAULTS.kafka_jars_dir)
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise BrokerError(
            f"no Kafka broker jars in {folder}: run `make setup` (it fetches them from Maven "
            f"Central), or point QSTATE_KAFKA_JARS at a folder of kafka_2.13 and its "
            f"dependencies")
    return f"{folder}/*"


@dataclass
class KafkaBroker:
    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    log_path: Path | None = None
    heap: str = DEFAULTS.kafka_heap
    jars: str = ""
    proc: subprocess.Popen | None = field(default=None, repr=False)
    controller_port: int = 0
    # a command prefix the broker runs under, e.g. ``ip netns exec HOST`` to put it on an
    # emulated host (then give ``host`` and ``port``: no free port is probed for there)
    launcher: list[str] = field(default_factory=list)
    # clients authenticate with SASL/PLAIN as one of these users (name -> password); the
    # broker talks to itself over a plain listener of its own on loopback. Empty: plain text
    sasl_users: dict[str, str] = field(default_factory=dict)
    internal_port: int = 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def client_properties(self) -> dict[str, str]:
        """What a client sets to reach this broker (librdkafka's names), as the first user
        of ``sasl_users``; {} for a plain-text broker."""
        if not self.sasl_users:
            return {}
        user, password = next(iter(self.sasl_users.items()))
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": user, "sasl.password": password}

    # ---- lifecycle --------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> KafkaBroker:
        """Format (first time), start, and return once the broker answers a metadata
        request; BrokerError with the log's tail if it exits or does not answer in time."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._keep_ports()
        config = self._write_config()
        classpath = broker_classpath(self.jars)
        if not (self.data_dir / "logs" / "meta.properties").exists():
            self._format(classpath, config)
        log_path = self.log_path or self.data_dir / "broker.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [*self._java(classpath), "kafka.Kafka", str(config)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=die_with_parent())
        self._wait_ready(timeout, log_path)
        log.info("Kafka broker on %s ready in %.1fs", self.bootstrap, time.monotonic() - t0)
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM: a controlled shutdown (logs flushed, clean restart); killed if slow."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """kill -9: no shutdown at all, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- pieces -----------------------------------------------------------------
    def _keep_ports(self) -> None:
        """The ports of a data directory stay its own: the controller's is in its quorum
        state, and clients of a restarted broker expect the same bootstrap."""
        saved = self.data_dir / "ports.json"
        if saved.exists():
            ports = orjson.loads(saved.read_bytes())
            self.port = self.port or ports["port"]
            self.controller_port = ports["controller"]
            self.internal_port = ports.get("internal", 0)
        self.port = self.port or free_port(self.host)
        self.controller_port = self.controller_port or free_port("127.0.0.1")
        if self.sasl_users:
            self.internal_port = self.internal_port or free_port("127.0.0.1")
        saved.write_bytes(orjson.dumps({"port": self.port, "controller": self.controller_port,
                                        "internal": self.internal_port}))

    def _write_config(self) -> Path:
        logs = self.data_dir / "logs"
        c = self.controller_port
        listeners = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{c}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://127.0.0.1:{c}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        }
        if self.sasl_users:
            i = self.internal_port
            users = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
            listeners.update({
                "listeners": f"SASL_PLAINTEXT://{self.host}:{self.port},"
                             f"PLAINTEXT://127.0.0.1:{i},CONTROLLER://127.0.0.1:{c}",
                "advertised.listeners": f"SASL_PLAINTEXT://{self.host}:{self.port},"
                                        f"PLAINTEXT://127.0.0.1:{i}",
                "listener.security.protocol.map":
                    "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            })
        settings = {
            **listeners,
            "log.dirs": str(logs),
            "num.partitions": "4",
            # one node: every internal topic has one replica, and few partitions (a group
            # or transaction coordinator partition each costs start-up time)
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # after a kill -9 the controller waits out the dead broker's session before the
            # restarted one may register: keep that short on one node
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            # topics are made on purpose (qstate.core.transport.kafka.ensure_topic), never by a typo
            "auto.create.topics.enable": "false",
            # two cores: fewer threads than Kafka's defaults
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
        }
        config = self.data_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J)
        return config

    def _java(self, classpath: str) -> list[str]:
        return [*self.launcher, java(), f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-cp", classpath]

    def _format(self, classpath: str, config: Path) -> None:
        cluster = cluster_id()
        r = subprocess.run([*self._java(classpath), "kafka.tools.StorageTool", "format",
                            "-t", cluster, "-c", str(config)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise BrokerError(f"formatting Kafka storage in {self.data_dir} failed "
                              f"({r.returncode}): {r.stderr[-2000:] or r.stdout[-2000:]}")

    def _wait_ready(self, timeout: float, log_path: Path) -> None:
        # its own logger: refused connections while the broker starts are expected, not news
        admin = AdminClient(client_config(self.bootstrap, self.client_properties, **{
            "log.connection.close": False, "logger": logging.getLogger(f"{__name__}.admin")}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BrokerError(f"the Kafka broker exited with {self.proc.returncode}: "
                                  f"{_tail(log_path)}")
            try:
                if admin.list_topics(timeout=1).brokers:
                    return
            except KafkaException:
                pass
            time.sleep(0.2)
        self.kill()
        raise BrokerError(f"the Kafka broker on {self.bootstrap} did not answer within "
                          f"{timeout:.0f}s: {_tail(log_path)}")


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return f"(no log at {path})"
