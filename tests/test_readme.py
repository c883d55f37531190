"""README, run: its settings table is the settings (``python -m qstate.core.config`` prints the
table to paste), and its fenced ``bash`` blocks, found by their section, run as a user runs
them in a terminal at a fresh checkout (``.venv/bin/qstate``, ``.qstate/`` beside it), against
one real deployment this module starts: the session's broker, shard servers and router, and
the ``tweets`` example job counting events this test produces. What each block prints, and
what is read back after it, is compared with truth computed from those events' delivery
reports (partition and offset) and Spark's own progress, never with a shape.

The blocks that begin no Spark job (state inspect, savepoints and a read through one, client
tokens, development certificates) run in ``make test``; the rescale, fork and rollback, which
each start ``qstate job`` (a Spark of its own) and wait for it, run under ``make soak``.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import signal
import stat
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Producer

from qstate.core.address import partition_of
from qstate.core.config import Settings, settings_table
from qstate.core.transport.security import cluster_token
from qstate.embedded.lifeline import die_with_parent
from qstate.embedded.ports import free_port, wait_for_port
from qstate.jobs.job import JobContext
from qstate.jobs.runtime.launch import RunningJob, start_job
from tests.helpers import json_documents, wait_until
from tests.jobs.test_fork_rollback import Event  # the events produced, as Kafka acknowledged them

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

JOB, FORK, TOPIC = "tweets", "tweets_v2", "tweet-events"  # the README's names, as written
P = 16  # make run's partition count, which the README's rescale doubles
KEYS = [f"tw-{i}" for i in range(1, 13)]
HOUR, MINUTE, SLIDE = 3_600_000, 60_000, 10_000
FAR = 1 << 62
# blocks this module does not run, and why (a test elsewhere runs what they start)
NOT_RUN = {"Two commands": "make run and make test themselves (tests/test_run_smoke.py starts "
                           "make run), and a tour of make run's endpoints whose watches never "
                           "end (docs/querying.md's tour, run by tests/clients/test_docs.py)",
           "Development": "make targets and benchmarks"}


def test_the_settings_table_is_in_the_readme() -> None:
    assert settings_table() in README


def bash_blocks(text: str) -> dict[str, list[str]]:
    """Each ``##``/``###`` heading's fenced bash blocks, in order (a subsection's are its
    own); a block's continued lines (``\\``) joined."""
    out: dict[str, list[str]] = {}
    heading = ""
    for m in re.finditer(r"^#{2,3} ([^\n]+)$|^```bash\n(.*?)^```$", text, re.M | re.S):
        if m.group(1) is not None:
            heading = m.group(1)
        else:
            out.setdefault(heading, []).append(m.group(2).replace("\\\n", " "))
    return out


BLOCKS = bash_blocks(README)


def commands(block: str) -> list[str]:
    """A block's command lines (comments and blank lines left out)."""
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_has_the_blocks_this_test_runs() -> None:
    first = {h: [commands(b)[0].split("  #")[0].strip() for b in bs] for h, bs in BLOCKS.items()}
    assert first == {
        "Two commands": ["make run", "curl -s http://127.0.0.1:8000/v1/state/tweets/"
                                     "per_tweet_1h/impressions/tw-1"],
        "Failures": [".venv/bin/qstate state inspect"],
        "Adding and removing shard servers, replicas": [
            ".venv/bin/qstate state rescale tweets --partitions 32",
            ".venv/bin/qstate savepoint create tweets --name before-v2",
            ".venv/bin/qstate job tweets --name tweets_v2 --from-savepoint tweets@before-v2 "
            "--metrics-port 0"],
        "TLS and the internal API": [
            ".venv/bin/qstate certs --out certs --host shard-0.example --host router.example"],
        "Client tokens": [
            "TOKEN=$(.venv/bin/qstate token add grafana --scope tweets "
            "--scope ads/campaign_views_10s)"],
        "Development": ["make test-fast"]}
    assert set(NOT_RUN) < set(first)


# -- truth: the events produced, as Kafka acknowledged them ---------------------------------


def hourly(events: list[Event], kind: str) -> dict[tuple[str, int], int]:
    """(key, hour start) -> events of ``kind``: per_tweet_1h's truth."""
    return dict(Counter((e.key, e.time // HOUR * HOUR) for e in events if e.kind == kind))


def minutely(events: list[Event]) -> dict[tuple[str, int], int]:
    """(key, window start) -> impressions in the sliding minute (10 s slide) from there:
    per_tweet_1m's truth."""
    out: Counter[tuple[str, int]] = Counter()
    for e in events:
        if e.kind == "impression":
            last = e.time // SLIDE * SLIDE
            out.update((e.key, s) for s in range(last - MINUTE + SLIDE, last + 1, SLIDE))
    return dict(out)


def truth(events: list[Event]) -> dict[str, dict[tuple[str, int], int]]:
    return {"per_tweet_1h/impressions": hourly(events, "impression"),
            "per_tweet_1h/clicks": hourly(events, "url-click"),
            "per_tweet_1m/impressions": minutely(events)}


def ends(events: list[Event]) -> dict[int, int]:
    """Partition -> the offset after the last event there (where a batch that read them all
    ended)."""
    out: dict[int, int] = {}
    for e in events:
        out[e.partition] = max(out.get(e.partition, 0), e.offset + 1)
    return out


def last_records(events: list[Event]) -> dict[int, int]:
    return {p: end - 1 for p, end in ends(events).items()}


# -- a terminal at a fresh checkout -----------------------------------------------------------


@dataclass
class Server:
    """A block's line that runs until stopped (a router, a job), as in a terminal of its own."""

    proc: subprocess.Popen
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> int | None:
        """SIGTERM to its whole group (what systemd or a terminal's Ctrl-C reaches); its
        exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@dataclass
class Terminal:
    """Runs commands as typed at ``home`` (a checkout: ``.venv`` is the repository's, and
    ``.qstate/`` holds the deployment's cluster token, where ``make run`` keeps its own);
    ``env`` says where the deployment is, as ``QSTATE_`` settings, and carries the shell
    variables a block sets to its next commands."""

    home: Path
    env: dict[str, str]
    servers: list[Server] = field(default_factory=list)

    def run(self, lines: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        kept = self.home / ".env"
        script = "set -a\n" + "\n".join(lines) + f"\nenv -0 > {kept}\n"
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=self.home,
                           env={**self.env, **env}, capture_output=True, text=True,
                           timeout=300)
        if r.returncode == 0:  # what the block set (TOKEN=...) for its next lines
            now = dict(v.split("=", 1) for v in kept.read_text().split("\0") if "=" in v)
            for k in env:  # settings given for these lines alone stay theirs
                now.pop(k)
                if k in self.env:
                    now[k] = self.env[k]
            self.env = now
        return r

    def start(self, line: str, name: str, **env: str) -> Server:
        log = self.home / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(["bash", "-c", line], cwd=self.home,
                                    env={**self.env, **env},
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=die_with_parent())
        server = Server(proc, log)
        self.servers.append(server)
        return server

    def close(self) -> None:
        for s in reversed(self.servers):
            s.stop()


def said(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"


# -- the deployment ---------------------------------------------------------------------------


@dataclass
class Deployment:
    terminal: Terminal
    router_url: str
    shard_ids: set[str]
    producer: Producer
    v1: RunningJob | None = None  # the tweets job, in this process's Spark
    events: list[Event] = field(default_factory=list)
    clock: int = 0  # the next event's time: every event after the one before (none late)

    def produce(self, n: int, salt: int) -> list[Event]:
        """``n`` events of the tweets example's shape, each with where Kafka put it."""
        out: list[Event] = []

        def delivered(err: object, msg: Any) -> None:
            assert err is None, err
            body = orjson.loads(msg.value())
            out.append(Event(body["tweet_id"], body["event"], body["time"], msg.partition(),
                             msg.offset()))

        for i in range(n):
            key = KEYS[(i * 5 + salt) % len(KEYS)] if i % 4 else KEYS[0]  # tw-1 leads
            kind = "url-click" if (i + salt) % 3 == 0 else "impression"
            self.producer.produce(TOPIC, orjson.dumps(
                {"tweet_id": key, "event": kind, "time": self.clock}), key.encode(),
                on_delivery=delivered)
            self.clock += 37
        assert self.producer.flush(30) == 0 and len(out) == n
        self.events += out
        return out

    def settle(self) -> int:
        """Until the in-process job counted everything produced; its last batch, as Spark's
        offset log numbers it."""
        assert self.v1 is not None
        self.v1.process_all_available()
        progress = self.v1.queries["merged"].lastProgress
        assert progress is not None
        return int(progress.batchId)

    def stop_v1(self) -> None:
        if self.v1 is not None:
            self.v1.stop()
            self.v1 = None

    def read(self, job: str, url: str | None = None, **params: Any
             ) -> tuple[dict[str, dict[tuple[str, int], int]], set[int]]:
        """Every window of every key of the tweets operators through a router's batchGet
        (``params``: savepoint, min_batch); and the batches the answers reflect."""
        got: dict[str, dict[tuple[str, int], int]] = {}
        batches: set[int] = set()
        with httpx.Client(base_url=url or self.router_url, timeout=30) as c:
            for path in truth([]):
                def answer(path: str = path) -> httpx.Response | None:
                    r = c.post(f"/v1/state/{job}/{path}:batchGet", json={"keys": KEYS},
                               params={"from": -FAR, "to": FAR, **params})
                    assert r.status_code in (200, 503), r.text
                    return r if r.status_code == 200 else None  # 503: a savepoint opening

                r = wait_until(answer, 60, f"{job}/{path} answering {params}")
                assert isinstance(r, httpx.Response)
                got[path] = {(a["key"], w["start"]): w["value"]
                             for a in r.json()["results"] for w in a["windows"] if w["value"]}
                batches |= {a["batch"] for a in r.json()["results"]}
        return got, batches

    def position(self, job: str, partition: int, offset: int) -> int | None:
        """The batch of ``job`` that counted the record (None: not yet, or the job is not
        known yet: a job registers its operators as it starts)."""
        r = httpx.get(f"{self.router_url}/v1/jobs/{job}/position", timeout=10,
                      params={"topic": TOPIC, "partition": partition, "offset": offset})
        assert r.status_code in (200, 503) or r.json()["error"] == "UnknownOperator", r.text
        return int(r.json()["batch"]) if r.status_code == 200 else None

    def counted(self, job: str, server: Server, events: list[Event]) -> int:
        """Wait until ``job`` (run by ``server``) counted every one of ``events``; the
        newest batch that did."""
        def batches() -> list[int] | None:
            assert server.proc.poll() is None, server.tail()
            got = [self.position(job, p, o) for p, o in last_records(events).items()]
            return None if None in got else [b for b in got if b is not None]

        found = wait_until(batches, 240, f"{job} counting the events produced")
        assert isinstance(found, list)
        return max(found)

    def partitions(self, job: str) -> dict[str, int]:
        r = httpx.get(f"{self.router_url}/v1/jobs/{job}", timeout=10)
        assert r.status_code == 200, r.text
        return {o["name"]: o["partitions"] for o in r.json()["operators"]}


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory, spark, broker, storage_uri: str, shards,
           router) -> Iterator[Deployment]:  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("checkout")
    (home / ".venv").symlink_to(ROOT / ".venv")
    # the cluster token where `make run` keeps the host's: the session shards' own
    token = home / ".qstate" / "cluster-token"
    token.parent.mkdir()
    token.write_text(cluster_token(Settings()))
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("QSTATE_")}
    env.update(QSTATE_KAFKA_BOOTSTRAP=broker.bootstrap, QSTATE_STORAGE=storage_uri,
               # the jobs' /metrics port (make run's hold the default one): a job's own, so
               # that a fork beside it must take another, as the README's does
               QSTATE_JOB_METRICS_PORT=str(free_port()),
               COLUMNS="250")  # a terminal wide enough for state inspect's table
    ctx = JobContext(broker.bootstrap, storage_uri, home / ".qstate" / "checkpoints" / JOB, P,
                     "500 milliseconds", shards=[s.address for s in shards])
    d = Deployment(Terminal(home, env), router.url, {s.name for s in shards},
                   Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}),
                   # the hour before this one (within retention): every event in one hour
                   clock=(int(time.time() * 1000) // HOUR - 1) * HOUR + 1_000)
    d.v1 = start_job(spark, JOB, ctx)  # makes the topic
    try:
        for salt in (0, 1):  # two batches at least: the newest is not the first
            d.produce(120, salt)
            d.settle()
        yield d
    finally:
        d.terminal.close()
        d.stop_v1()


SCALE = "Adding and removing shard servers, replicas"  # the rescale, savepoint and fork blocks


def table(out: str, job: str) -> list[list[str]]:
    """The cells of ``job``'s rows of a table rich printed."""
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in out.splitlines()
            if line.startswith("│")]
    return [r for r in rows if r[0] == job]


def test_state_inspect_shows_every_partition_ready_at_the_jobs_batch(
        readme: Deployment) -> None:
    batch = readme.settle()
    [block] = BLOCKS["Failures"]
    r = readme.terminal.run(commands(block))
    assert r.returncode == 0, said(r)
    rows = table(r.stdout, JOB)
    assert sorted((op, int(p)) for _, op, p, *_ in rows) == sorted(
        (op, p) for op in ("per_tweet_1h", "per_tweet_1m") for p in range(P)), r.stdout
    assert {(owner in readme.shard_ids, state) for _, _, _, owner, state, *_ in rows} == {
        (True, "ready")}, r.stdout
    # a batch is committed to every partition of an operator, those without data too
    assert {int(row[5]) for row in rows} == {batch}, r.stdout  # the "last batch" column
    for op in ("per_tweet_1h", "per_tweet_1m"):
        assert re.search(rf"^{JOB}/{op} epoch \d+, {P} partitions, newest batch {batch},",
                         r.stdout, re.M), r.stdout


def test_a_savepoint_keeps_the_job_at_its_batch_and_answers_as_of_it(
        readme: Deployment) -> None:
    d = readme
    batch = d.settle()
    kept = list(d.events)
    create, listing = commands(BLOCKS[SCALE][1])
    r = d.terminal.run([create])
    assert r.returncode == 0, said(r)
    m = re.fullmatch(rf"savepoint {JOB}@before-v2 at batch (\d+) \(2 operators, offsets "
                     rf"{TOPIC}:(\S+)\)\n", r.stdout)
    assert m is not None, said(r)
    offsets = {int(p): int(o) for p, o in (po.split("=") for po in m[2].split(","))}
    assert (int(m[1]), {p: o for p, o in offsets.items() if o}) == (batch, ends(kept))
    r = d.terminal.run([listing])
    assert re.fullmatch(rf"before-v2\tbatch {batch}\t\S+Z\tcomplete\n", r.stdout), said(r)
    # the saved windows go on changing: more events in the same hour and minutes
    d.produce(160, 2)
    assert d.settle() > batch
    saved, batches = d.read(JOB, savepoint="before-v2")
    assert saved == truth(kept) and batches == {batch}
    live, _ = d.read(JOB)
    assert live == truth(d.events) != saved
    # deleted once no job will begin from it (the fork block's last line): gone for reads
    [delete] = [c for c in commands(BLOCKS[SCALE][2]) if "savepoint delete" in c]
    r = d.terminal.run([delete])
    assert r.stdout == f"deleted savepoint {JOB}@before-v2\n", said(r)
    assert d.terminal.run([listing]).stdout == ""
    # a partition no read opened as of it yet finds it gone (one open stays open while read:
    # service/shard/savepoints.py)
    opened = {partition_of(k, P) for k in KEYS}
    other = next(k for k in (f"tw-{i}" for i in itertools.count(13))
                 if partition_of(k, P) not in opened)
    gone = httpx.get(f"{d.router_url}/v1/state/{JOB}/per_tweet_1h/impressions/{other}",
                     params={"savepoint": "before-v2"}, timeout=10)
    assert gone.status_code == 404 and "before-v2" in gone.json()["message"], gone.text


def latest(events: list[Event], key: str) -> dict[str, int]:
    """``key``'s per_tweet_1h impressions window as an answer shows it."""
    [(start, n)] = [(s, n) for (k, s), n in hourly(events, "impression").items() if k == key]
    return {"start": start, "end": start + HOUR, "value": n}


def test_a_client_token_reads_what_its_scopes_cover_and_nothing_else(
        readme: Deployment) -> None:
    d = readme
    d.settle()
    add, serve, *reads = commands(BLOCKS["Client tokens"][0])
    r = d.terminal.run([add])
    assert r.returncode == 0, said(r)
    token = d.terminal.env["TOKEN"]
    stored = d.terminal.home / ".qstate" / "tokens.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert hashlib.sha256(token.encode()).hexdigest() in stored.read_text()
    assert token not in stored.read_text()
    # the README's ports beside make run's router, free ones here
    http_port, grpc_port = free_port(), free_port()
    router = d.terminal.start(serve.replace("8001", str(http_port))
                              .replace("50052", str(grpc_port)), "router-tokens")
    wait_for_port("127.0.0.1", http_port, 30, router.proc)
    r = d.terminal.run([c.replace("localhost:8001", f"localhost:{http_port}") for c in reads])
    assert r.returncode == 0, said(r)
    allowed, refused = json_documents(r.stdout)
    assert (allowed["key"], allowed["windows"]) == ("tw-1", [latest(d.events, "tw-1")])
    assert (refused.get("error"), "'grafana'" in refused.get("message", "")) == (
        "Forbidden", True), refused
    assert router.stop() == 0, router.tail()


def test_development_certificates_make_the_router_speak_tls(readme: Deployment) -> None:
    import grpc

    from qstate.proto import qstate_pb2 as pb
    from qstate.proto import qstate_pb2_grpc as pb_grpc

    d = readme
    d.settle()
    r = d.terminal.run(commands(BLOCKS["TLS and the internal API"][0]))
    assert r.returncode == 0, said(r)
    made = dict(line.split("=", 1) for line in r.stdout.split())
    assert set(made) == {"QSTATE_TLS_CERT", "QSTATE_TLS_KEY", "QSTATE_TLS_CA"}, said(r)
    home = d.terminal.home
    assert stat.S_IMODE((home / made["QSTATE_TLS_KEY"]).stat().st_mode) == 0o600
    # a router serving with them; the session's shards speak plain text, so it is not given
    # the CA (with it, it would dial them over TLS)
    http_port, grpc_port = free_port(), free_port()
    router = d.terminal.start(f".venv/bin/qstate router --http-port {http_port} --grpc-port "
                              f"{grpc_port}", "router-tls",
                              QSTATE_TLS_CERT=made["QSTATE_TLS_CERT"],
                              QSTATE_TLS_KEY=made["QSTATE_TLS_KEY"])
    wait_for_port("127.0.0.1", http_port, 30, router.proc)
    ca, want = made["QSTATE_TLS_CA"], latest(d.events, "tw-1")
    path = f"/v1/state/{JOB}/per_tweet_1h/impressions/tw-1"

    def curl(name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return d.terminal.run([f"curl -s --resolve {name}:{http_port}:127.0.0.1 {' '.join(args)} "
                               f"https://{name}:{http_port}{path}"])

    for name in ("router.example", "127.0.0.1"):  # a --host, and what it always names
        got = curl(name, "--cacert", ca)
        assert got.returncode == 0 and orjson.loads(got.stdout)["windows"] == [want], said(got)
    assert curl("elsewhere.example", "--cacert", ca).returncode == 60  # not its name
    assert curl("router.example").returncode == 60  # nor a CA the system trusts
    got = d.terminal.run([f".venv/bin/qstate get {JOB} per_tweet_1h impressions tw-1 --ca {ca}"],
                         QSTATE_ROUTER_URL=f"https://127.0.0.1:{http_port}")
    assert got.returncode == 0 and json_documents(got.stdout)[0]["windows"] == [want], said(got)
    creds = grpc.ssl_channel_credentials((home / ca).read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{grpc_port}", creds, options=[
            ("grpc.ssl_target_name_override", "router.example")]) as channel:
        v = pb_grpc.QueryableStateStub(channel).Get(pb.GetRequest(
            job=JOB, operator="per_tweet_1h", state="impressions", key="tw-1"), timeout=10)
    assert [(w.start_ms, w.int_value) for w in v.windows] == [(want["start"], want["value"])]
    assert router.stop() == 0, router.tail()


@pytest.mark.long  # three starts of `qstate job`, a Spark each: `make soak`
def test_rescale_savepoint_fork_and_rollback_as_the_readme_runs_them(
        readme: Deployment) -> None:
    d, term = readme, readme.terminal
    rescale, restart = commands(BLOCKS[SCALE][0])
    create, _ = commands(BLOCKS[SCALE][1])
    fork, rollback, delete = commands(BLOCKS[SCALE][2])
    d.settle()
    d.stop_v1()  # "the job stopped"
    before = list(d.events)
    d.produce(200, 3)  # read once it runs again
    # the wait for the driver's lease to stay still, shortened: it stopped cleanly
    r = term.run([rescale], QSTATE_LEASE_S="2")
    assert r.returncode == 0, said(r)
    for op in ("per_tweet_1h", "per_tweet_1m"):
        assert f"{JOB}/{op}: {P} → {2 * P} partitions, every one serving" in r.stderr, said(r)
    wait_until(lambda: d.partitions(JOB) == {"per_tweet_1h": 2 * P, "per_tweet_1m": 2 * P},
               30, "the router routing by the new count")
    assert d.read(JOB)[0] == truth(before)  # the state as it was, at the new count
    v1 = term.start(restart, "job-rescaled")
    batch = d.counted(JOB, v1, d.events)
    assert d.read(JOB, min_batch=batch)[0] == truth(d.events)

    r = term.run([create])
    assert r.returncode == 0, said(r)
    m = re.fullmatch(rf"savepoint {JOB}@before-v2 at batch (\d+) .*", r.stdout.strip())
    assert m is not None and int(m[1]) == batch, said(r)
    saved = set(d.events)
    later = d.produce(200, 4)
    v2 = term.start(fork, "job-fork")
    # the fork's first batch comes after the savepoint's, from where its batch ended
    assert d.counted(FORK, v2, later) == batch + 1
    assert d.partitions(FORK) == {"per_tweet_1h": 2 * P, "per_tweet_1m": 2 * P}
    assert d.read(FORK, min_batch=batch + 1)[0] == truth(d.events)
    newest = d.counted(JOB, v1, later)
    assert d.read(JOB, min_batch=newest)[0] == truth(d.events)
    assert v2.stop() == 0, v2.tail()
    assert v1.stop() == 0, v1.tail()

    d.produce(200, 5)  # while the job is stopped
    v1 = term.start(rollback, "job-rollback")
    # everything after the savepoint read again, in one batch numbered after those the shards
    # held (docs/upgrading.md), and counted once over shards that had counted some of it
    again = d.counted(JOB, v1, [e for e in d.events if e not in saved])
    assert again > newest
    assert {d.position(JOB, p, o) for p, o in last_records(later).items()} == {again}
    assert d.read(JOB, min_batch=again)[0] == truth(d.events)
    assert list((term.home / ".qstate" / "checkpoints" / JOB).glob(
        "merged.before-tweets.before-v2-*")), "the old Spark checkpoint is kept aside"
    assert v1.stop() == 0, v1.tail()
    r = term.run([delete])
    assert r.stdout == f"deleted savepoint {JOB}@before-v2\n", said(r)
