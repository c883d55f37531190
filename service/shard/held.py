"""A partition this server holds: its store, whether it serves reads, whether it owns it or
follows it, its last snapshot."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from qstate.shard.store import PartitionStore

__all__ = ["Held", "Ready"]


class Ready(threading.Event):
    """Set once the partition is caught up; ``changed`` hears each set and clear as it
    happens (the server's reader must refuse a partition the moment it starts restoring:
    ``qstate.shard.reader``)."""

    def __init__(self, changed: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._changed = changed

    def set(self) -> None:
        super().set()
        if self._changed is not None:
            self._changed()

    def clear(self) -> None:
        super().clear()
        if self._changed is not None:
            self._changed()


@dataclass
class Held:
    store: PartitionStore
    # set once the partition is caught up: until then reads answer RESTORING
    ready: threading.Event = field(default_factory=Ready)
    snapshot_batch: int = -1  # batch of the last snapshot this server took or restored
    # the owner takes commits (and snapshots); a follower brings itself up to date from
    # storage (``Partitions.follow``) and only answers reads
    owner: bool = True
    # one bring-up to date at a time (a commit's catch-up, a follower's, a restore)
    catching_up: threading.Lock = field(default_factory=threading.Lock)
