"""Where each partition lives: its owner and its followers, over the live shard servers
(docs/architecture.md §4). Pure functions of what a coordinator knows (``Cluster``); the
coordinator (service/control/coordinator.py) writes what they return as a new epoch.

- The owner takes the job's commits and answers reads. Owners are spread as evenly as
  possible, moving as few partitions as possible (``balance``).
- A follower holds a copy it brings up to date from checkpoint storage (the same batches,
  from their manifests) and answers reads too; it takes no commits. An operator with
  ``replicas = R`` has R - 1 followers per partition on other servers, where there are.
- **A planned move is make-before-break.** A server joins, or one drains (SIGTERM): the
  partition's new owner is first added as a follower. The owner keeps it, serving and
  committing, until that follower has caught up to the owner's batch. Only then does the
  partition change hands, under a new epoch, so no read finds it restoring. The assignment
  names that incoming owner (``Assignment.incoming``) until then, so every round of
  placement heads for the same server.
- **An unplanned move** (the owner died) goes to a follower that is serving, when there is
  one: no restore gap. Otherwise the new owner restores it as before.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from qstate.core.errors import Unavailable
from qstate.core.records.assignment import Assignment

__all__ = ["Cluster", "Progress", "balance", "place", "servers_named"]


@dataclass(frozen=True)
class Progress:
    """What a server said of a partition it holds in its last Describe."""

    last_batch: int
    ready: bool  # caught up and serving, not restoring


@dataclass
class Cluster:
    """What a coordinator knows of the shard servers as of its last heartbeat round."""

    live: dict[str, str]  # id -> address of the servers that answer
    draining: set[str] = field(default_factory=set)  # live, but stopping: move off them
    # id -> (operator, partition) -> progress, from each live server's Describe
    progress: dict[str, dict[tuple[str, int], Progress]] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)  # operator -> copies wanted

    def of(self, sid: str, op: str, p: int) -> Progress | None:
        return self.progress.get(sid, {}).get((op, p))

    def batch(self, sid: str, op: str, p: int) -> int:
        g = self.of(sid, op, p)
        return g.last_batch if g is not None else -1

    def serving(self, sid: str, op: str, p: int) -> bool:
        g = self.of(sid, op, p)
        return g is not None and g.ready

    def caught_up(self, sid: str, op: str, p: int, owner: str) -> bool:
        """``sid`` serves the partition as far as its owner has got."""
        mine, theirs = self.of(sid, op, p), self.of(owner, op, p)
        return mine is not None and mine.ready and theirs is not None and \
            mine.last_batch >= theirs.last_batch


def balance(old: list[str], partitions: int, live: list[str]) -> list[str]:
    """Owners for ``partitions`` over ``live`` servers: as even as possible, moving as few
    partitions as possible (an owner that is live and not over its share keeps its own)."""
    if not live:
        raise Unavailable("no live shard server to assign partitions to")
    ids = sorted(live)
    q, r = divmod(partitions, len(ids))
    # The r servers that get one more are those already holding the most, so an uneven
    # split moves no partition it need not move.
    held = Counter(sid for sid in old[:partitions] if sid in live)
    richer = sorted(ids, key=lambda s: (-held[s], s))[:r]
    cap = {sid: q + (1 if sid in richer else 0) for sid in ids}
    load: Counter[str] = Counter()
    new: list[str | None] = [None] * partitions
    for p in range(partitions):
        sid = old[p] if p < len(old) else None
        if sid in cap and load[sid] < cap[sid]:
            new[p] = sid
            load[sid] += 1
    for p in range(partitions):
        if new[p] is None:
            sid = min(ids, key=lambda s: (load[s] - cap[s], load[s], s))
            new[p] = sid
            load[sid] += 1
    return [s for s in new if s is not None]


def servers_named(owners: dict[str, list[str]], followers: dict[str, list[list[str]]],
                  live: dict[str, str]) -> dict[str, str]:
    """An assignment's ``servers``: id -> address of every server its owners and followers
    name (each of them live)."""
    named = {sid for ids in owners.values() for sid in ids}
    named |= {sid for per in followers.values() for fs in per for sid in fs}
    return {sid: live[sid] for sid in named}


def _owner(c: Cluster, op: str, p: int, current: str | None, wanted: str,
           followers: list[str]) -> str:
    if current not in c.live:  # dead (or none yet): a serving follower takes over at once
        serving = [f for f in followers if c.serving(f, op, p)]
        return max(serving, key=lambda f: c.batch(f, op, p)) if serving else wanted
    if current != wanted and c.caught_up(wanted, op, p, current):
        return wanted  # planned: the incoming owner has caught up, hand over now
    return current


def _followers(owner: str, wanted: str, previous: list[str], copies: int,
               targets: list[str], load: Counter[str]) -> list[str]:
    """The incoming owner of a planned move, and ``copies - 1`` standby copies: servers
    that already hold one first (no new restore), then the least loaded."""
    out = [wanted] if wanted != owner else []
    need = max(copies - 1, len(out))
    for sid in [*previous, *sorted(targets, key=lambda s: (load[s], s))]:
        if len(out) >= need:
            break
        if sid != owner and sid in targets and sid not in out:
            out.append(sid)
    load.update(out)
    return out


def place(a: Assignment, sizes: dict[str, int], c: Cluster, bump: bool = False,
          writer: str = "") -> Assignment:
    """The assignment of ``sizes`` (operator -> partitions) over the cluster ``c``.

    Returns ``a`` itself when nothing changed and no ``bump`` is asked for, else a new
    assignment with the next epoch. Every operator ``a`` holds is placed, not only those
    given: a restarted driver registers its operators one by one, and the others' owners
    may be dead meanwhile.
    """
    sizes = {op: len(ids) for op, ids in a.owners.items()} | sizes
    # where partitions should end up: never on a draining server, unless all are
    targets = sorted(sid for sid in c.live if sid not in c.draining) or sorted(c.live)
    owners: dict[str, list[str]] = {}
    followers: dict[str, list[list[str]]] = {}
    incoming: dict[str, list[str]] = {}
    for op, n in sizes.items():
        # Balance from where each partition is headed (the incoming owner of a move under
        # way), not from where it is: balancing the same live set again then gives the same
        # targets (``balance`` is stable), so a move keeps its target until it completes.
        heading = [a.incoming_of(op, p) or a.owner_id(op, p) or "" for p in range(n)]
        wanted = balance(heading, n, targets)
        load: Counter[str] = Counter()
        owners[op], followers[op], incoming[op] = [], [], []
        for p in range(n):
            current = a.owner_id(op, p)
            previous = [f for f in a.followers_of(op, p) if f in c.live]
            owner = _owner(c, op, p, current, wanted[p], previous)
            if owner != current and current in c.live:
                previous.insert(0, current)  # handed over: the old owner holds a copy
            owners[op].append(owner)
            followers[op].append(_followers(owner, wanted[p], previous,
                                            c.replicas.get(op, 1), targets, load))
            incoming[op].append(wanted[p] if wanted[p] != owner else "")
    # operators with none are left out, as assignments written before followers were
    followers = {op: per for op, per in followers.items() if any(per)}
    incoming = {op: per for op, per in incoming.items() if any(per)}
    servers = servers_named(owners, followers, c.live)
    if not bump and (owners, followers, incoming, servers) == \
            (a.owners, a.followers, a.incoming, a.servers):
        return a
    return Assignment(a.job, a.epoch + 1, servers, owners, writer, followers, incoming)
