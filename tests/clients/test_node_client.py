"""The Node example client (clients/node/query.mjs) against a real router over gRPC.

Its answers must equal both the Python stub's answers for the same requests and the values
written into the delta files, through a router reading shards in-process and one reading
them over gRPC (local reads on and off; the router's metric says which path served).
Its watch resumes after a cut connection while batches commit, each event checked against
the contract as the Python clients' are (tests/watching.py).
Needs node and npm; node_modules come from the project's own package-lock.json (`npm ci`)
when missing or out of date.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from qstate.core.answer import WatchEvent
from qstate.core.records import savepoint
from qstate.embedded.ports import free_port
from qstate.exit_codes import Exit
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.helpers import wait_until
from tests.shop import BATCHES, BIG, KEYS, MANY, ROUTES, WINDOW, Shop, avg_ms, own_shop, views
from tests.watching import OP, STATE, WATCHED, Event, OwnJob, Proxy, Watch, resume_after_a_cut

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
SCRIPT = NODE_DIR / "query.mjs"

# --- ground truth: exactly what the fixture writes into the delta files --------------------

def truth_window(state: str, key: str, batch: int) -> dict[str, Any]:
    w: dict[str, Any] = {"start_ms": str(batch * WINDOW), "end_ms": str((batch + 1) * WINDOW)}
    if state == "views":
        w["int_value"] = str(views(key, batch))
    else:
        w["double_value"] = avg_ms(batch)
    return w


def truth_value(state: str, key: str, batches: range | None = None) -> dict[str, Any]:
    last = BATCHES - 1
    found = key != "nope"
    return {"job": "shop", "operator": "views_1m", "state": state, "key": key,
            "found": found, "batch": str(last), "watermark_ms": str(last * WINDOW),
            "windows": [truth_window(state, key, b)
                        for b in (batches if batches is not None else [last])] if found
            else []}


# --- fixtures -------------------------------------------------------------------------------

def _installed_matches_pins() -> bool:
    pins = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
    for name, version in pins.items():
        manifest = NODE_DIR / "node_modules" / name / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text())["version"] != version:
            return False
    return True


@pytest.fixture(scope="module")
def node() -> str:
    """Path of `node`, with clients/node/node_modules installed from the lock file."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("the Node client test needs node and npm on PATH (Node >= 18): "
                    "install Node.js, then run `make node-setup`")
    if not _installed_matches_pins():
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"`npm ci` in {NODE_DIR} failed (exit {r.returncode}):\n"
                        f"{r.stdout}\n{r.stderr}")
        assert _installed_matches_pins(), "npm ci did not install the pinned versions"
    return node


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cluster(route: str, shop: Shop) -> Any:
    """A router of the shop deployment, reading shards in-process or over gRPC."""
    return shop.routers[route]


@pytest.fixture
def stub(cluster):
    with grpc.insecure_channel(cluster.grpc_address) as ch:
        yield qpb_grpc.QueryableStateStub(ch)


def run_node(node: str, addr: str, *args: str, via_env: bool = True,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**({**os.environ, "QSTATE_GRPC": addr} if via_env else {
        k: v for k, v in os.environ.items() if k != "QSTATE_GRPC"}), **(env or {})}
    cmd = [node, str(SCRIPT), *args] + ([] if via_env else ["--addr", addr])
    # run from elsewhere: the script must find the .proto relative to itself
    return subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, timeout=60)


def node_json(node: str, addr: str, *args: str, via_env: bool = True) -> dict[str, Any]:
    r = run_node(node, addr, *args, via_env=via_env)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
    return json.loads(r.stdout)


def as_dict(msg) -> dict[str, Any]:
    """The Python stub's answer in the Node client's JSON shape (int64 as strings)."""
    return MessageToDict(msg, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)


# --- tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["page-0", "page-7", "ünï/cødé key", "a" * 1024, BIG])
@pytest.mark.parametrize("state", ["views", "avg_ms"])
def test_get_latest_window(node, shop, route, cluster, stub, state: str, key: str) -> None:
    with shop.served_by(route, 2):  # the router's read path, for both clients
        got = node_json(node, cluster.grpc_address, "get", "shop", "views_1m", state, key)
        py = as_dict(stub.Get(qpb.GetRequest(job="shop", operator="views_1m", state=state,
                                             key=key), timeout=5))
    assert got == py == truth_value(state, key)


def test_get_range_and_exact_int64(node, cluster, stub) -> None:
    for state, key, lo, hi, batches in [
        ("views", "page-3", "0", "120000", range(0, 2)),     # [0, 120000): windows 0 and 1
        ("views", BIG, "60000", "10000000000000", range(1, 3)),
        ("avg_ms", "page-3", "0", "10000000000000", range(0, 3)),
    ]:
        got = node_json(node, cluster.grpc_address, "get", "shop", "views_1m", state, key,
                        "--from", lo, "--to", hi, via_env=False)
        py = as_dict(stub.Get(qpb.GetRequest(job="shop", operator="views_1m", state=state,
                                             key=key, from_ms=int(lo), to_ms=int(hi)),
                              timeout=5))
        assert got == py == truth_value(state, key, batches)
    # the count past 2**53 survives as a decimal string, digit for digit
    big = node_json(node, cluster.grpc_address, "get", "shop", "views_1m", "views", BIG)
    assert int(big["windows"][0]["int_value"]) == 2**62 + 2 * (BATCHES - 1) + 1


def test_multiget_matches_stub_and_truth_and_marks_misses(node, shop, route, cluster,
                                                          stub) -> None:
    keys = [*KEYS[:40], "a" * 1024, BIG, "nope"]  # "nope" was never written
    with shop.served_by(route, 2 * len(keys)):
        got = node_json(node, cluster.grpc_address, "multiget", "shop", "views_1m", "views",
                        *keys)
        py = as_dict(stub.MultiGet(qpb.MultiGetRequest(job="shop", operator="views_1m",
                                                       state="views", keys=keys), timeout=5))
    assert got == py == {"results": [truth_value("views", k) for k in keys]}
    assert got["results"][-1]["found"] is False

    ranged = node_json(node, cluster.grpc_address, "multiget", "shop", "views_1m", "avg_ms",
                       "page-1", "page-2", "--from", "60000", "--to", "180000")
    py = as_dict(stub.MultiGet(qpb.MultiGetRequest(
        job="shop", operator="views_1m", state="avg_ms", keys=["page-1", "page-2"],
        from_ms=60_000, to_ms=180_000), timeout=5))
    assert ranged == py == {"results": [truth_value("avg_ms", k, range(1, 3))
                                        for k in ["page-1", "page-2"]]}


@pytest.mark.parametrize(("args", "code", "rc"), [
    (("get", "nojob", "views_1m", "views", "k"), "NOT_FOUND", Exit.NOT_FOUND),
    (("get", "shop", "views_1m", "views", "absent-key"), "NOT_FOUND", Exit.NOT_FOUND),
    (("get", "shop", "views_1m", "clicks", "page-1"), "NOT_FOUND", Exit.NOT_FOUND),
    (("get", "b/d", "views_1m", "views", "k"), "INVALID_ARGUMENT", Exit.BAD_REQUEST),
])
def test_errors_exit_with_documented_code(node, cluster, stub, args, code: str,
                                          rc: int) -> None:
    r = run_node(node, cluster.grpc_address, *args)
    assert r.returncode == rc, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert r.stderr.startswith(f"{code}: ")
    # the Python stub sees the same status for the same request
    with pytest.raises(grpc.RpcError) as err:
        stub.Get(qpb.GetRequest(job=args[1], operator=args[2], state=args[3], key=args[4]),
                 timeout=5)
    assert err.value.code().name == code
    assert err.value.details() in r.stderr


def test_top_matches_stub_and_truth(node, shop, cluster, stub) -> None:
    last = BATCHES - 1
    got = node_json(node, cluster.grpc_address, "top", "shop", "views_1m", "views", "--n", "7")
    py = as_dict(stub.Top(qpb.TopRequest(job="shop", operator="views_1m", state="views", n=7),
                          timeout=5))
    board = sorted(KEYS + MANY, key=lambda k: (-views(k, last), k))[:7]
    assert got == py == {
        "job": "shop", "operator": "views_1m", "state": "views",
        "start_ms": str(last * WINDOW), "end_ms": str((last + 1) * WINDOW),
        "batch": str(last), "watermark_ms": str(last * WINDOW),
        "entries": [{"key": k, "int_value": str(views(k, last))} for k in board]}
    asc = node_json(node, cluster.grpc_address, "top", "shop", "views_1m", "views", "--n", "3",
                    "--asc", "--window", "60000")
    assert [e["key"] for e in asc["entries"]] == sorted(
        KEYS + MANY, key=lambda k: (views(k, 1), k))[:3]
    too_many = run_node(node, cluster.grpc_address, "top", "shop", "views_1m", "views", "--n",
                       "100000")
    assert (too_many.returncode, too_many.stderr.split(":")[0]) == (Exit.BAD_REQUEST,
                                                                    "INVALID_ARGUMENT")


def test_unreachable_router_exits_as_qstate_get_does(node) -> None:
    r = run_node(node, f"127.0.0.1:{free_port()}", "get", "shop", "views_1m", "views", "k")
    assert (r.returncode, r.stderr.split(":")[0]) == (Exit.UNREACHABLE, "UNAVAILABLE")


def test_bad_usage_exits_as_a_bad_request(node) -> None:
    r = run_node(node, "127.0.0.1:1", "get", "shop", "views_1m", "views", "k", "--from", "5")
    assert r.returncode == Exit.BAD_REQUEST and "--from and --to go together" in r.stderr


def test_the_exit_code_table_is_the_pythons() -> None:
    """query.mjs keeps a copy of service/exit_codes.py's table: the same numbers."""
    text = (NODE_DIR / "query.mjs").read_text()
    table = text[text.index("const EXIT = {"):]
    table = table[:table.index("};")]
    node = {k: int(v) for k, v in re.findall(r"(\w+): (\d+)", table)}
    assert node == {"NOT_FOUND": Exit.NOT_FOUND, "INVALID_ARGUMENT": Exit.BAD_REQUEST,
                    "USAGE": Exit.BAD_REQUEST, "UNAVAILABLE": Exit.UNAVAILABLE,
                    "RESOURCE_EXHAUSTED": Exit.UNAVAILABLE, "UNREACHABLE": Exit.UNREACHABLE,
                    "UNAUTHENTICATED": Exit.NOT_ALLOWED, "PERMISSION_DENIED": Exit.NOT_ALLOWED,
                    "OTHER": Exit.OTHER}


def test_min_batch_reads_your_writes_or_says_how_far_the_state_is(node, cluster) -> None:
    args = ("get", "shop", "views_1m", "views", "page-3")
    have = node_json(node, cluster.grpc_address, *args, "--min-batch", str(BATCHES - 1))
    assert have["batch"] == str(BATCHES - 1)
    ahead = run_node(node, cluster.grpc_address, *args, "--min-batch", "999999")
    assert ahead.returncode == Exit.UNAVAILABLE and ahead.stderr.startswith("UNAVAILABLE: ") and \
        "not yet at min_batch 999999" in ahead.stderr, ahead.stderr
    bad = run_node(node, cluster.grpc_address, *args, "--min-batch=-1")
    assert bad.returncode == Exit.BAD_REQUEST and "not a batch number" in bad.stderr


def test_savepoint_reads_as_of_its_batch(node, cluster, shop: Shop) -> None:
    """A savepoint of the shop (its last batch): the first read is UNAVAILABLE (exit 3)
    while the shard opens the partition, then the value as of the savepoint's batch."""
    if "node-reads" not in {s.name for s in savepoint.list_savepoints(shop.storage, "shop")}:
        savepoint.create(shop.storage, "shop", "node-reads")  # once for both routes
    args = ("get", "shop", "views_1m", "views", "page-3", "--savepoint", "node-reads")

    def read() -> dict[str, Any] | None:
        r = run_node(node, cluster.grpc_address, *args)
        assert r.returncode in (0, Exit.UNAVAILABLE), r.stderr
        return json.loads(r.stdout) if r.returncode == 0 else None
    got = wait_until(read, 60, "the savepoint's partition open")
    assert got["batch"] == str(BATCHES - 1)  # type: ignore[index]
    assert got["windows"][0]["int_value"] == str(views("page-3", BATCHES - 1))  # type: ignore[index]
    bad = run_node(node, cluster.grpc_address, *args[:-1], "nope")
    assert bad.returncode == Exit.NOT_FOUND and "no savepoint 'nope'" in bad.stderr, bad.stderr


# --- watch: Server-Sent Events over HTTP ----------------------------------------------------

def run_watch(node: str, url: str, *args: str,
              via_env: bool = True) -> subprocess.CompletedProcess[str]:
    """`node query.mjs watch ...` against the router at ``url`` ($QSTATE_ROUTER_URL, or
    --url when not ``via_env``)."""
    env = {k: v for k, v in os.environ.items() if k != "QSTATE_ROUTER_URL"}
    if via_env:
        env["QSTATE_ROUTER_URL"] = url
    cmd = [node, str(SCRIPT), "watch", *args] + ([] if via_env else ["--url", url])
    return subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, timeout=60)


def watch_events(node: str, url: str, *args: str, via_env: bool = True) -> list[dict[str, Any]]:
    r = run_watch(node, url, *args, via_env=via_env)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
    lines = r.stdout.splitlines()
    assert all(line.startswith("{") for line in lines), r.stdout  # one JSON line per event
    return [json.loads(line) for line in lines]


def truth_event(**fields: Any) -> dict[str, Any]:
    """A watch event of the shop's views as of its last batch (``changes`` and ``top`` given);
    committed_at is when a shard applied the batch, which no ground truth knows."""
    last = BATCHES - 1
    return {"job": "shop", "operator": "views_1m", "state": "views", "batch": last,
            "watermark": last * WINDOW, "coalesced": False, "snapshot": True, **fields}


def test_watch_keys_prints_the_snapshot_of_exactly_those_keys(node, cluster) -> None:
    last = BATCHES - 1
    keys = ["page-3", "ünï/cødé key", BIG]  # a key to URL-encode; a count past 2**53
    [ev] = watch_events(node, cluster.url, "shop", "views_1m", "views", *keys,
                        "--max-events", "1")
    committed_at = ev.pop("committed_at")
    assert committed_at is None or isinstance(committed_at, int)
    changes = ev.pop("changes")
    assert ev == truth_event(top=None)
    assert sorted(c["key"] for c in changes) == sorted(keys)
    assert {c["key"]: c for c in changes} == {k: {
        "job": "shop", "operator": "views_1m", "state": "views", "key": k, "found": True,
        "batch": last, "watermark": last * WINDOW,
        "windows": [{"start": last * WINDOW, "end": (last + 1) * WINDOW,
                     "value": views(k, last)}],
        "next_from": None} for k in keys}
    # printed as the router sent it: the big count digit for digit
    assert {c["key"]: c for c in changes}[BIG]["windows"][0]["value"] == 2**62 + 2 * last + 1


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_watch_top_prints_the_current_board(node, cluster, order: str) -> None:
    last = BATCHES - 1
    sign = -1 if order == "desc" else 1
    board = sorted(KEYS + MANY, key=lambda k: (sign * views(k, last), k))[:3]
    [ev] = watch_events(node, cluster.url, "shop", "views_1m", "views", "--top", "3",
                        *(["--asc"] if order == "asc" else []), "--max-events", "1",
                        via_env=order == "desc")
    ev.pop("committed_at")
    assert ev == truth_event(changes=[], top={
        "job": "shop", "operator": "views_1m", "state": "views",
        "window": {"start": last * WINDOW, "end": (last + 1) * WINDOW}, "order": order,
        "batch": last, "watermark": last * WINDOW,
        "entries": [{"key": k, "value": views(k, last)} for k in board]})


@pytest.mark.parametrize(("args", "code", "rc"), [
    (("shop", "nope_1m", "views", "page-1"), "NOT_FOUND", Exit.NOT_FOUND),  # unknown: 404
    (("shop", "views_1m", "clicks", "--top", "3"), "NOT_FOUND", Exit.NOT_FOUND),
    (("shop", "views_1m", "views", "--top", "100000"), "INVALID_ARGUMENT",
     Exit.BAD_REQUEST),  # 400
    (("shop", "views_1m", "views", *KEYS[:101]), "INVALID_ARGUMENT",
     Exit.BAD_REQUEST),  # at most 100 keys
])
def test_watch_refused_exits_with_documented_code(node, cluster, args, code: str,
                                                  rc: int) -> None:
    r = run_watch(node, cluster.url, *args, "--max-events", "1")
    assert r.returncode == rc, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert r.stderr.startswith(f"{code}: "), r.stderr


def test_watch_gives_up_after_max_reconnects(node) -> None:
    """Nothing listens at the URL: the first connection and 2 reconnections fail, then it
    exits 4 (out of reach), as the Python client's max_reconnects does."""
    r = run_watch(node, "http://127.0.0.1:1", "shop", "views_1m", "views", "k",
                  "--max-reconnects", "2")
    assert r.returncode == Exit.UNREACHABLE, r.stderr
    assert r.stderr.count("connection lost") == 3, r.stderr
    assert r.stderr.count("reconnecting in") == 2, r.stderr
    assert "giving up after 3 failed connections in a row" in r.stderr, r.stderr


def test_watch_bad_usage_exits_as_a_bad_request(node) -> None:
    for args, says in [(("shop", "views_1m", "views"), "watch: wrong arguments"),
                       (("shop", "views_1m", "views", "k", "--top", "3"), "wrong arguments"),
                       (("shop", "views_1m", "views", "k", "--asc"), "--asc goes with --top"),
                       (("shop", "views_1m", "views", "k", "--max-events", "0"), "not a count"),
                       (("shop", "views_1m", "views", "k", "--max-reconnects", "x"),
                        "not a count of reconnections")]:
        r = run_watch(node, "http://127.0.0.1:1", *args)
        assert r.returncode == Exit.BAD_REQUEST and says in r.stderr, (args, r.stderr)


class NodeWatch(Watch):
    """`node query.mjs watch` of ``keys``: its stdout lines, one event each, read on a thread;
    its stderr (what it says as it reconnects) in ``log``."""

    resumes = True

    def __init__(self, node: str, url: str, job: str, keys: Sequence[str], log: Path) -> None:
        super().__init__()
        self.log = log
        env = {k: v for k, v in os.environ.items() if k != "QSTATE_ROUTER_URL"}
        with open(log, "w") as err:
            self.proc = subprocess.Popen([node, str(SCRIPT), "watch", "--url", url, job, OP,
                                          STATE, *keys], stdout=subprocess.PIPE, stderr=err,
                                         text=True, cwd="/", env=env)
        self._start(self._lines)

    def _lines(self) -> Iterator[Event]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            yield Event.of(WatchEvent.model_validate_json(line))

    def _close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def watch_shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    """A shop of this module's own, where a test commits batches (the session's stays at
    BATCHES)."""
    with own_shop(tmp_path_factory.mktemp("node-watch")) as s:
        yield s


def test_watch_resumes_after_its_connection_is_cut_while_batches_commit(
        node, watch_shop: Shop, tmp_path: Path) -> None:
    """Through a proxy the test cuts (tests/watching.py): nothing missed, nothing twice, the
    values it printed last are the truth as of the batch it last printed."""
    job, router = OwnJob(watch_shop), watch_shop.routers["local"]
    proxy = Proxy(router.url.removeprefix("http://"))
    log = tmp_path / "node-watch.err"
    try:
        c = resume_after_a_cut(job, router.url, proxy, lambda _: NodeWatch(
            node, proxy.url, job.name, WATCHED, log))
    finally:
        proxy.close()
    said = log.read_text()
    # it said so, and resumed after the batch it had printed last (from_batch)
    assert "watch: connection lost" in said and \
        f"resuming after batch {c.resumed_from}" in said, said
