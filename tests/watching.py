"""What the watch tests share (docs/architecture.md §5, watch): a job of a test's own on a
shared shop, whose truth is what the test commits; a proxy the test cuts between a client and
a router; each kind of watcher read on a thread; and the contract every event is checked
against one by one, before it is merged into what the watcher holds (``Contract``).

The contract is the clients' and the hub's (service/client.py ``Client.watch``,
service/router/watch.py's docstring): the first event holds every value (``snapshot``); an
event's ``batch`` says every change up to it was sent; a client resumes after it, getting
what changed since when the router watched the keys through that batch, else every value
again (a snapshot); nothing is missed, though a value may come twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc
import httpx
from httpx_sse import connect_sse

from qstate.client import AsyncClient, Client
from qstate.control.coordinator import Coordinator
from qstate.core.address import partition_of
from qstate.core.answer import WatchEvent
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.transport.shard_client import ShardClients
from qstate.embedded.procs import RouterProcess
from qstate.jobs.runtime.commit import Committer
from qstate.proto import qstate_pb2 as qpb
from qstate.proto import qstate_pb2_grpc as qpb_grpc
from tests.batches import Written, deliver_to, record_values
from tests.helpers import wait_until
from tests.shop import BIG, WINDOW, P, Shop

OP, STATE = "views_1m", "views"
# watched: a key to URL-encode, one of 1 KiB, a count past 2**53 (exact end to end or not)
WATCHED = ["ünï/cødé key", "a" * 1024, BIG, *(f"page-{i}" for i in range(9))]
OTHERS = [f"item-{i}" for i in range(60)]  # written, never watched
EVENT_S = 20.0  # deadline of one awaited event

Latest = tuple[int, int] | None  # a key's latest window: (start, value); None: it has none


def short(keys: str | Iterable[str]) -> str:
    """Keys as a failure says them (the 1 KiB one cut short)."""
    one = [keys] if isinstance(keys, str) else list(keys)
    said = [k if len(k) <= 24 else f"{k[:8]}...({len(k)} chars)" for k in one]
    return said[0] if isinstance(keys, str) else repr(said)


def first_value(key: str) -> int:
    return 2**62 + 1 if key == BIG else sum(map(ord, key)) % 1000 + 1


class OwnJob:
    """A job of one test's own on a shared shop: its operator ``views_1m`` over the shop's
    shards (one-minute windows; a row replaces ``views``), the batches the test commits, and
    the truth as of each batch: what the test wrote. Batch 0 writes every key."""

    def __init__(self, shop: Shop, keys: Sequence[str] = (*WATCHED, *OTHERS)) -> None:
        self.name = f"w-{uuid.uuid4().hex[:12]}"
        self.spec = OperatorSpec(self.name, OP, "page", {STATE: "long"}, partitions=P,
                                 window=WindowSpec("tumbling", WINDOW))
        save_spec(shop.storage, self.spec)
        addresses = [s.address for s in shop.shards]
        self.coordinator = Coordinator(shop.storage, self.name, addresses)
        self.coordinator.register(self.spec)
        wait_until(lambda: self._ready(addresses), 30, f"the shards serving {self.name}")
        self.coordinator.stop()  # nothing moves while the test runs (as the shop's own job)
        self.window = 0
        self.history: list[dict[str, tuple[int, int]]] = []  # batch -> key -> its latest
        self.commit({k: first_value(k) for k in keys})

    def _ready(self, addresses: list[str]) -> bool:
        """Every partition held by its shard and not restoring (a commit that found one
        restoring would wait for it)."""
        clients = ShardClients()
        try:
            ready = {p.partition for a in addresses for p in clients.describe(a).partitions
                     if (p.job, p.operator) == (self.name, OP) and not p.restoring}
        finally:
            clients.close()
        return ready == set(range(P))

    @property
    def batch(self) -> int:
        """The last batch committed."""
        return len(self.history) - 1

    def commit(self, values: Mapping[str, int], new_window: bool = False) -> int:
        """The next batch: each key of ``values`` set to its value in the current window
        (``new_window``: in the next one, which becomes current). Returns the batch."""
        self.deliver(self.record(values, new_window))
        return self.batch

    def record(self, values: Mapping[str, int], new_window: bool = False) -> Written:
        """``commit``'s batch in storage, not delivered yet (``deliver``)."""
        if new_window:
            self.window += 1
        written = record_values(self.coordinator, self.spec, len(self.history),
                                self.window * WINDOW, values)
        # windows only move forward: a key written now has its latest window here
        self.history.append({**(self.history[-1] if self.history else {}),
                             **{k: (self.window * WINDOW, v) for k, v in values.items()}})
        return written

    def deliver(self, written: Written, to: str | None = None) -> None:
        """The recorded batch delivered to every owner (``to``: the owner at that address
        alone, as when partitions commit one after another)."""
        start = self.window * WINDOW
        if to is not None:
            deliver_to(self.coordinator, self.spec, self.batch, start, written, to)
        else:
            Committer(self.coordinator).deliver(self.spec, self.batch, start, written)

    def owner(self, key: str) -> str:
        """The address of the shard that owns ``key``'s partition."""
        _, owners = self.coordinator.owners_of(OP)
        return next(a for a, parts in owners.items() if partition_of(key, P) in parts)

    def at(self, batch: int) -> dict[str, tuple[int, int]]:
        """Each key's latest window as of ``batch``."""
        assert 0 <= batch <= self.batch, f"batch {batch}: {self.name} has 0..{self.batch}"
        return self.history[batch]

    def changed_at(self, key: str, batch: int) -> int:
        """The batch at or before ``batch`` at which ``key`` took the value it has then."""
        while batch > 0 and self.history[batch - 1].get(key) == self.history[batch].get(key):
            batch -= 1
        return batch

    def top(self, n: int, batch: int) -> list[tuple[str, int]]:
        """The board of the current window as of ``batch``: its ``n`` largest, ties by key."""
        now = self.at(batch)
        current = max(s for s, _ in now.values())
        return sorted(((k, v) for k, (s, v) in now.items() if s == current),
                      key=lambda kv: (-kv[1], kv[0]))[:n]


# ---- events, whatever brought them ----------------------------------------------------------

@dataclass(frozen=True)
class Change:
    key: str
    batch: int  # the batch its answer is as of
    latest: Latest


@dataclass(frozen=True)
class Event:
    """One watch event as any protocol delivers it."""

    batch: int
    snapshot: bool
    coalesced: bool
    committed_ms: int  # when a shard applied the oldest batch it carries a change of; 0: unknown
    changes: tuple[Change, ...] = ()
    top: tuple[tuple[str, int | float | None], ...] | None = None  # a board's entries

    @classmethod
    def of(cls, ev: WatchEvent) -> Event:
        """The JSON event (SSE, the Python clients, the Node client's lines)."""
        return cls(ev.batch, ev.snapshot, ev.coalesced, ev.committed_at or 0, tuple(
            Change(a.key, a.batch, (a.windows[-1].start or 0, a.windows[-1].value)
                   if a.windows else None) for a in ev.changes),  # type: ignore[arg-type]
            None if ev.top is None else tuple((e.key, e.value) for e in ev.top.entries))

    @classmethod
    def of_grpc(cls, ev: qpb.WatchEvent) -> Event:
        return cls(ev.batch, ev.snapshot, ev.coalesced, ev.committed_ms, tuple(
            Change(v.key, v.batch, (v.windows[-1].start_ms, v.windows[-1].int_value)
                   if v.windows else None) for v in ev.changes),
            tuple((e.key, e.int_value) for e in ev.top.entries) if ev.HasField("top") else None)

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self.changes]


class Ended(Exception):
    """The stream ended without an error: the router closed it."""


class Watch:
    """One watcher read on a thread; its events arrive in a queue the test waits on, with a
    deadline. ``resumes``: a client that reconnects by itself; else a raw stream, which a drop
    ends, and the test reconnects it."""

    resumes = False

    def __init__(self) -> None:
        self._events: queue.Queue[Event | BaseException] = queue.Queue()
        self._stopping = threading.Event()

    def _start(self, events: Callable[[], Iterable[Event]]) -> None:
        threading.Thread(target=self._run, args=(events,), daemon=True).start()

    def _run(self, events: Callable[[], Iterable[Event]]) -> None:
        try:
            for ev in events():
                self._events.put(ev)
            self._events.put(Ended())
        except BaseException as exc:  # a cut stream, a failed check; or closed on purpose
            if not self._stopping.is_set():
                self._events.put(exc)

    def _get(self, timeout: float) -> Event | BaseException:
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nothing from the watch within {timeout:.0f}s") from None

    def next(self, timeout: float = EVENT_S) -> Event:
        got = self._get(timeout)
        if isinstance(got, BaseException):
            raise got
        return got

    def ended(self, timeout: float = EVENT_S) -> BaseException:
        """How a raw stream ended (``Ended``, or the error of a cut), no event before."""
        got = self._get(timeout)
        assert isinstance(got, BaseException), f"an event where the stream should end: {got}"
        return got

    def close(self) -> None:
        self._stopping.set()
        self._close()

    def _close(self) -> None:
        raise NotImplementedError


def _sse_params(keys: Sequence[str], top: int | None,
                from_batch: int | None) -> list[tuple[str, str]]:
    out = [("key", k) for k in keys] + ([("top", str(top))] if top is not None else [])
    return out + ([("from_batch", str(from_batch))] if from_batch is not None else [])


class SseWatch(Watch):
    """GET /v1/watch as an EventSource reads it: each event's id must be its batch;
    ``last_event_id``: the header a reconnecting EventSource sends."""

    def __init__(self, url: str, job: str, keys: Sequence[str] = (), *, top: int | None = None,
                 from_batch: int | None = None, last_event_id: int | None = None) -> None:
        super().__init__()
        self._client = httpx.Client(base_url=url, timeout=httpx.Timeout(5, read=60))
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        self._start(lambda: self._read(f"/v1/watch/{job}/{OP}/{STATE}",
                                       _sse_params(keys, top, from_batch), headers))

    def _read(self, path: str, params: list[tuple[str, str]],
              headers: dict[str, str]) -> Iterator[Event]:
        with connect_sse(self._client, "GET", path, params=params, headers=headers) as es:
            if es.response.status_code != 200:
                raise AssertionError(f"watch answered {es.response.status_code}: "
                                     f"{es.response.read().decode()}")
            for sse in es.iter_sse():
                if not sse.data:  # a ping (qstate.client._watch_event)
                    continue
                ev = WatchEvent.model_validate_json(sse.data)
                assert sse.id == str(ev.batch), (sse.id, ev.batch)  # what EventSource resends
                yield Event.of(ev)

    def _close(self) -> None:
        self._client.close()


class GrpcWatch(Watch):
    """The gRPC ``Watch`` stream; ``from_batch``: resume after it."""

    def __init__(self, address: str, job: str, keys: Sequence[str] = (), *, top_n: int = 0,
                 from_batch: int | None = None) -> None:
        super().__init__()
        self._channel = grpc.insecure_channel(address)
        request = qpb.WatchRequest(job=job, operator=OP, state=STATE, keys=keys, top_n=top_n)
        if from_batch is not None:
            request.from_batch = from_batch
        self._call = qpb_grpc.QueryableStateStub(self._channel).Watch(request, timeout=300)
        self._start(lambda: (Event.of_grpc(ev) for ev in self._call))

    def _close(self) -> None:
        self._call.cancel()
        self._channel.close()


class ClientWatch(Watch):
    """``qstate.client.Client.watch``: it reconnects and resumes by itself."""

    resumes = True

    def __init__(self, url: str, job: str, keys: Sequence[str]) -> None:
        super().__init__()
        self._client = Client(url, backoff_s=0.05)
        self._start(lambda: (Event.of(ev) for ev in self._client.watch(job, OP, STATE, keys)))

    def _close(self) -> None:
        self._client.close()  # its next reconnection fails, which ends the thread


class AsyncClientWatch(Watch):
    """``qstate.client.AsyncClient.watch`` on an event loop of its own."""

    resumes = True

    def __init__(self, url: str, job: str, keys: Sequence[str]) -> None:
        super().__init__()
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None
        started = threading.Event()

        async def read() -> None:
            async with AsyncClient(url, backoff_s=0.05) as ac:
                async for ev in ac.watch(job, OP, STATE, keys):
                    self._events.put(Event.of(ev))

        def run() -> Iterator[Event]:
            self._task = self._loop.create_task(read())
            started.set()
            try:
                self._loop.run_until_complete(self._task)
            finally:
                self._loop.close()
            return iter(())

        self._start(run)
        started.wait(10)

    def _close(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)


# ---- the contract ---------------------------------------------------------------------------

class Contract:
    """Every event one watcher of ``keys`` gets, checked one by one, then merged into what it
    holds (``view``):

    - the first event of a connection is every value (``snapshot``) when it opens without a
      batch to resume from or the router cannot tell what changed since, else what changed;
      no other event is a snapshot, and within a connection ``batch`` never goes back;
    - each key at most once an event, each value the truth as of its answer's batch, which is
      the event's batch or later;
    - no value the watcher already holds, save in the first event of a resumed connection for
      a key that changed after the batch it resumed from ("a value may come twice": the event
      that brought it may say an earlier batch, partitions committing one after another);
    - after each event the watcher holds every change up to its ``batch`` (nothing missed).
    """

    def __init__(self, job: OwnJob, keys: Sequence[str]) -> None:
        self.job = job
        self.keys = list(keys)
        self.view: dict[str, Latest] = {}
        self.events: list[Event] = []  # every event taken, in order
        self.last: int | None = None  # the batch of the last one
        self._first = True  # the next event opens a connection ...
        self._snapshot = True  # ... and must (not) be a snapshot
        self.resumed_from: int | None = None  # the batch the last connection resumed after

    def resume(self, snapshot: bool) -> None:
        """The next event is the first of a connection resumed after ``last``: every value
        (``snapshot``) if the router cannot tell what changed since, else what did."""
        self._first, self._snapshot, self.resumed_from = True, snapshot, self.last

    def take(self, ev: Event) -> None:
        where = f"event {len(self.events)} (batch {ev.batch}, snapshot {ev.snapshot})"
        first, self._first = self._first, False
        if first:
            assert ev.snapshot == self._snapshot, \
                f"{where}: the contract says snapshot {self._snapshot} here"
        else:
            assert not ev.snapshot, f"{where}: a snapshot within a connection"
            assert self.last is not None and ev.batch >= self.last, \
                f"{where}: back from batch {self.last}"
        keys = ev.keys
        assert len(keys) == len(set(keys)), f"{where}: a key twice in one event: {short(keys)}"
        assert set(keys) <= set(self.keys), f"{where}: keys not watched: {short(keys)}"
        if ev.snapshot:
            assert sorted(keys) == sorted(self.keys), f"{where}: not every key: {short(keys)}"
        for c in ev.changes:
            truth = self.job.at(c.batch).get(c.key)
            assert c.batch >= ev.batch, f"{where}: {short(c.key)} as of {c.batch}, before the event"
            assert c.latest == truth, \
                f"{where}: {short(c.key)} is {c.latest}, truth at {c.batch}: {truth}"
            if not ev.snapshot and c.key in self.view and self.view[c.key] == c.latest:
                since = self.job.changed_at(c.key, c.batch)
                assert first and self.resumed_from is not None and since > self.resumed_from, \
                    f"{where}: {short(c.key)} again ({c.latest}), unchanged since batch {since}"
        if ev.snapshot:
            self.view = {}
        self.view.update({c.key: c.latest for c in ev.changes})
        for k in self.keys:  # every change up to ev.batch is here: no older value
            truths = {self.job.at(b).get(k) for b in range(ev.batch, self.job.batch + 1)}
            assert k in self.view and self.view[k] in truths, \
                f"{where}: {short(k)} holds {self.view.get(k)}, truth from batch " \
                f"{ev.batch}: {truths}"
        self.events.append(ev)
        self.last = ev.batch

    def through(self, w: Watch, batch: int) -> list[Event]:
        """Take ``w``'s events until one says every change up to ``batch`` was sent."""
        got: list[Event] = []
        while not got or got[-1].batch < batch:
            try:
                got.append(w.next())
            except AssertionError as exc:
                raise AssertionError(f"no event saying batch {batch} ({exc}; the last said "
                                     f"{self.last}, with {len(got)} since)") from None
            self.take(got[-1])
        return got

    def holds_the_truth(self) -> None:
        """What the watcher holds is the truth at the batch it last saw."""
        assert self.last is not None
        want = self.job.at(self.last)
        wrong = {short(k): (self.view.get(k), want.get(k)) for k in self.keys
                 if k not in self.view or self.view[k] != want.get(k)}
        assert not wrong, f"at batch {self.last}, key: (held, truth): {wrong}"


# ---- a connection the test cuts ---------------------------------------------------------------

class Proxy:
    """A TCP proxy between a client and a router that the test controls: ``cut()`` closes
    every connection through it and turns new ones away (accepted, then reset) until
    ``mend()``: to the client, the router is out of reach."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Condition()
        self._open = True
        self._live: set[socket.socket] = set()
        self.refused = 0  # connections turned away while cut
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                if not self._open:
                    self.refused += 1
                    self._lock.notify_all()
                    # a reset, as from a port nothing listens on
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                    conn.close()
                    continue
                try:
                    up = socket.create_connection(self._target, timeout=5)
                except OSError:
                    conn.close()
                    continue
                up.settimeout(None)
                self._live |= {conn, up}
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
            with self._lock:
                self._live.discard(s)

    def cut(self) -> None:
        with self._lock:
            self._open = False
            live = list(self._live)
        self._drop(*live)

    def mend(self) -> None:
        with self._lock:
            self._open = True

    def wait_refused(self, n: int, timeout: float = EVENT_S) -> None:
        """Until ``n`` connections were turned away: the client tried again while cut."""
        with self._lock:
            assert self._lock.wait_for(lambda: self.refused >= n, timeout), \
                f"{self.refused} reconnections tried while cut, not {n}, within {timeout:.0f}s"

    def close(self) -> None:
        self._listener.close()
        self.cut()


# ---- the scenarios ----------------------------------------------------------------------------

def resume_after_a_cut(job: OwnJob, router_url: str, proxy: Proxy,
                       open_watch: Callable[[int | None], Watch]) -> Contract:
    """A watch through ``proxy`` (``open_watch(from_batch)``) of the watched keys, while
    another watcher on the router keeps them watched: the router watches them through the
    cut, so the resume is incremental. The cut comes while a batch commits (one shard has
    applied it, the other not yet), and more batches commit while the connection is down; a
    raw stream is reconnected after the last event's batch, a client reconnects by itself.
    Returns the contract with every event taken."""
    keeper = SseWatch(router_url, job.name, WATCHED)
    kept = Contract(job, WATCHED)
    w: Watch | None = None
    try:
        kept.through(keeper, job.batch)
        w = open_watch(None)
        c = Contract(job, WATCHED)
        c.through(w, job.batch)  # the snapshot
        # live: a watched key changes, and unwatched ones (which must not be sent)
        job.commit({WATCHED[1]: 3, **dict.fromkeys(OTHERS[:20], 7)})
        assert [k for ev in c.through(w, job.batch) for k in ev.keys] == [WATCHED[1]]
        c.holds_the_truth()
        # mid-commit: the shard of ``early`` applies the next batch, the other shard not yet;
        # the watcher gets ``early``'s new value in an event that says the batch before ...
        early = WATCHED[3]
        # on the other shard, and changed in no other batch here (a resume that sent the
        # keys changed at the batch it resumes from would send WATCHED[1] again)
        late = next(k for k in WATCHED[4:] if job.owner(k) != job.owner(early)
                    and k not in (WATCHED[5], WATCHED[7]))
        written = job.record({early: 12, late: 13})
        job.deliver(written, to=job.owner(early))
        [ev] = c.through(w, job.batch - 1)
        assert ev.keys == [early] and ev.changes[0].batch == job.batch, ev
        proxy.cut()  # ... and the connection drops
        if w.resumes:
            proxy.wait_refused(1)  # it tried again while the router was out of reach
        else:
            assert not isinstance(w.ended(), Ended)  # the cut failed the stream
        # while it is down: that batch completes; a key changes twice, one moves to a new
        # window; each batch read by the router before the next commits (the batches it
        # knows each key changed at)
        job.deliver(written)
        kept.through(keeper, job.batch)
        job.commit({WATCHED[2]: 5, WATCHED[5]: 6, OTHERS[0]: 1})
        kept.through(keeper, job.batch)
        job.commit({WATCHED[2]: 8, WATCHED[7]: 9}, new_window=True)
        kept.through(keeper, job.batch)
        proxy.mend()
        if not w.resumes:
            w.close()
            w = open_watch(c.last)
        c.resume(snapshot=False)
        # one event: every change after the batch it last saw, ``early`` again among them
        # (the one repeat the contract allows: it changed after that batch)
        [ev] = c.through(w, job.batch)
        assert ev.batch == job.batch and sorted(ev.keys) == sorted(
            {early, late, WATCHED[2], WATCHED[5], WATCHED[7]}), ev
        c.holds_the_truth()
        return live_again(c, w, job)
    finally:
        keeper.close()
        if w is not None:
            w.close()


def live_again(c: Contract, w: Watch, job: OwnJob) -> Contract:
    """After a resume, live again on the new connection: one change, that alone, nothing
    sent twice."""
    job.commit({WATCHED[0]: 11, OTHERS[1]: 2})
    after = c.through(w, job.batch)
    assert [k for ev in after for k in ev.keys] == [WATCHED[0]], after
    c.holds_the_truth()
    return c


def resume_after_a_restart(job: OwnJob, router: RouterProcess,
                           open_watch: Callable[[], Watch]) -> Contract:
    """A client's watch on ``router``, which stops (its streams end, reconnections are
    refused) while batches commit, then starts again on the same ports: a router that just
    started cannot tell what changed since the batch the client resumes from, so its first
    event is every value (a snapshot), as of the last batch."""
    w = open_watch()
    try:
        c = Contract(job, WATCHED)
        c.through(w, job.batch)
        job.commit({WATCHED[3]: 21, OTHERS[3]: 4})
        c.through(w, job.batch)
        c.holds_the_truth()
        router.stop()
        job.commit({WATCHED[2]: 5, WATCHED[5]: 6})
        job.commit({WATCHED[2]: 8, WATCHED[7]: 9}, new_window=True)
        router.start_and_wait()
        c.resume(snapshot=True)
        [resumed] = c.through(w, job.batch)  # every value, as of the last batch
        assert resumed.batch == job.batch
        c.holds_the_truth()
        return live_again(c, w, job)
    finally:
        w.close()
