"""Test helpers: served state read straight from the shard servers or through a router,
metrics scraped from a process, a shard's commit markers on its disk, waiting for a
condition."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.samples import Sample

from qstate.core.address import partition_of
from qstate.core.config import Settings
from qstate.core.records.assignment import ServerInfo, list_servers, load_assignment
from qstate.core.records.storage import Storage
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import ShardProcess
from qstate.partition.files import read_marker
from qstate.proto import shard_pb2 as pb


def read_all_windows(storage_uri: str, job: str, operator: str, state: str, keys: list[str],
                     partitions: int) -> tuple[dict[tuple[str, int], int | float], set[int]]:
    """(key, window start) -> value for every window of every key, plus the batches seen."""
    a = load_assignment(Storage(storage_uri), job)
    clients = ShardClients()
    by_addr: dict[str, list[pb.KeyQuery]] = {}
    for k in keys:
        p = partition_of(k, partitions)
        addr = a.owner(operator, p)
        assert addr is not None, f"partition {p} has no owner"
        by_addr.setdefault(addr, []).append(pb.KeyQuery(key=k, partition=p))
    out: dict[tuple[str, int], int | float] = {}
    batches: set[int] = set()
    for addr, kqs in by_addr.items():
        for i in range(0, len(kqs), 5000):
            rep = clients.stub(addr).MultiGet(pb.LookupRequest(
                job=job, operator=operator, state=state, keys=kqs[i:i + 5000], range=True,
                from_ms=-(1 << 62), to_ms=1 << 62), timeout=60)
            for r in rep.results:
                assert r.status in (pb.FOUND, pb.ABSENT), (r.key, r.status)
                batches.add(r.batch)
                for w in r.windows:
                    out[(r.key, w.start_ms)] = w.int_value if w.HasField("int_value") \
                        else w.double_value
    clients.close()
    return out, batches


Windows = dict[tuple[str, int], int | float]
FAR = 1 << 62


def http_windows(url: str, job: str, operator: str, state: str, keys: list[str],
                 latest: bool = False, since: int | None = None, chunk: int = 0) -> Windows:
    """(key, start) -> value via the router's batchGet: every window (those starting at
    ``since`` or later, when given), or only the latest. ``chunk`` keys a request (default:
    1000 for the latest window, 250 for ranges: a request a shard answers within the
    router's ``shard_timeout_s`` even where keys have hundreds of windows)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    out: Windows = {}
    params = {} if latest else {"from": str(-FAR if since is None else since), "to": str(FAR)}

    def fetch(c: httpx.Client, chunk: list[str]) -> list[dict]:
        out, ask = [], dict(params)
        while chunk:  # pages: answers cut at the request's window budget say where to go on
            r = c.post(f"/v1/state/{job}/{operator}/{state}:batchGet", json={"keys": chunk},
                       params=ask)
            assert r.status_code == 200, r.text
            results = list(r.json()["results"])
            out += results
            more = [a for a in results if a.get("next_from") is not None]
            chunk = [a["key"] for a in more]
            if more:
                ask = {**ask, "from": str(min(a["next_from"] for a in more))}
        return out

    # a few batches in flight: the router, the shards and this process work at once
    with httpx.Client(base_url=url, timeout=60) as c, ThreadPoolExecutor(4) as pool:
        size = chunk or (1000 if latest else 250)
        chunks = [keys[i:i + size] for i in range(0, len(keys), size)]
        for results in pool.map(lambda chunk: fetch(c, chunk), chunks):
            for item in results:
                for w in item["windows"]:
                    out[(item["key"], w["start"])] = w["value"]
    return out


def grpc_windows(address: str, job: str, operator: str, state: str, keys: list[str],
                 latest: bool = False) -> Windows:
    import grpc

    from qstate.proto import qstate_pb2 as qpb
    from qstate.proto import qstate_pb2_grpc as qpb_grpc

    out: Windows = {}
    rng: dict[str, Any] = {} if latest else {"from_ms": -FAR, "to_ms": FAR}
    with grpc.insecure_channel(address) as ch:
        stub = qpb_grpc.QueryableStateStub(ch)
        for i in range(0, len(keys), 1000):
            chunk, ask = keys[i:i + 1000], dict(rng)
            while chunk:  # pages, as in http_windows
                rep = stub.MultiGet(qpb.MultiGetRequest(job=job, operator=operator,
                                                        state=state, keys=chunk, **ask),
                                    timeout=60)
                for r in rep.results:
                    for w in r.windows:
                        out[(r.key, w.start_ms)] = (w.int_value if w.HasField("int_value")
                                                    else w.double_value)
                more = [r for r in rep.results if r.HasField("next_from_ms")]
                chunk = [r.key for r in more]
                if more:
                    ask = {**ask, "from_ms": min(r.next_from_ms for r in more)}
    return out


def latest_only(windows: Windows) -> Windows:
    """Keep each key's window with the greatest start."""
    best: dict[str, int] = {}
    for k, s in windows:
        best[k] = max(best.get(k, s), s)
    return {(k, s): v for (k, s), v in windows.items() if best[k] == s}


@dataclass(frozen=True)
class Scrape:
    """Every sample of one scrape of a /metrics page."""

    samples: list[Sample]

    def matching(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        """The first sample ``name`` with ``labels`` (among others), 0 when there is none."""
        found = self.matching(name, **labels)
        return float(found[0].value) if found else 0.0

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """Samples ``name`` summed by the values of their labels ``keys``."""
        out: dict[tuple[str, ...], float] = {}
        for s in self.matching(name):
            k = tuple(s.labels.get(key, "") for key in keys)
            out[k] = out.get(k, 0.0) + float(s.value)
        return out


def http_message(sock: socket.socket) -> bytes | None:
    """One whole HTTP/1.1 message (a request or an answer) read from ``sock``: its head and
    Content-Length bytes of body; None when the peer closed before it ended."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            return None
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        got = sock.recv(65536)
        if not got:
            return None
        body += got
    return head + b"\r\n\r\n" + body


def scrape(url: str) -> Scrape:
    """``url``/metrics, parsed."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return Scrape([s for f in text_string_to_metric_families(text) for s in f.samples])


def metric(url: str, name: str, **labels: str) -> float:
    """The value of one sample on ``url``/metrics (0 when absent)."""
    return scrape(url).value(name, **labels)


def wait_until(pred: Callable[[], object], timeout: float, what: str) -> object:
    """Poll ``pred`` until it returns something truthy; fail naming ``what`` after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def committed_batches(server_dir: Path, job: str, operator: str) -> dict[int, int]:
    """Partition -> last batch applied, from the commit markers a shard server keeps on its
    disk (``qstate.partition.files``): readable while the server is down, e.g. right after
    a fault point killed it."""
    out = {}
    folder = server_dir / job / operator
    for d in sorted(folder.iterdir()) if folder.exists() else []:
        try:
            out[int(d.name[1:])] = read_marker(d)[1]
        except FileNotFoundError:  # moved away (retired): not served from this disk
            continue
    return out


def shard_metrics_url(storage_uri: str, shard: ShardProcess, timeout: float = 30) -> str:
    """Where this incarnation of ``shard`` serves /metrics: it registers the address in
    storage once it serves (a restarted server: wait until the entry has its new pid)."""
    storage = Storage(storage_uri)

    def mine() -> ServerInfo | None:
        return next((i for i in list_servers(storage)
                     if i.address == shard.address and i.pid == shard.pid), None)

    info = wait_until(mine, timeout, f"{shard.name} registered in storage")
    assert isinstance(info, ServerInfo)
    return f"http://{info.metrics}"


def refused_then_answered(address: str, refused: Settings, answered: Settings,
                          code: grpc.StatusCode) -> str:
    """Describe on the shard at ``address`` as a caller with ``refused`` settings (it must
    fail with ``code``), then with ``answered`` ones: the server id that answered."""
    outsider, insider = ShardClients(refused), ShardClients(answered)
    try:
        with pytest.raises(grpc.RpcError) as err:
            outsider.describe(address, timeout=5)
        assert err.value.code() == code
        return insider.describe(address, timeout=5).server_id
    finally:
        outsider.close()
        insider.close()


def json_documents(out: str) -> list[Any]:
    """The JSON documents printed one after the other (indented, or one a line)."""
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(out):
        if out[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(out, i)
        docs.append(doc)
    return docs
