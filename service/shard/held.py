"""A partition this server holds: its store, whether it serves reads, whether it owns it or
follows it, its last snapshot."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from qstate.shard.store import PartitionStore

__all__ = ["Held"]


@dataclass
class Held:
    store: PartitionStore
    # set once the partition is caught up: until then reads answer RESTORING
    ready: threading.Event = field(default_factory=threading.Event)
    snapshot_batch: int = -1  # batch of the last snapshot this server took or restored
    # the owner takes commits (and snapshots); a follower brings itself up to date from
    # storage (``Partitions.follow``) and only answers reads
    owner: bool = True
    # one bring-up to date at a time (a commit's catch-up, a follower's, a restore)
    catching_up: threading.Lock = field(default_factory=threading.Lock)
