"""Snapshot and restore costs of one partition (issue: failure-proof state).

    python -m loadtest.bench_restore --keys 100000 --batches 20 --every 10

Builds one partition of ``--keys`` keys (one window each, every key updated each batch)
on a shard's PartitionStore in-process, taking a snapshot every ``--every`` batches like a
shard does, then restores it on a fresh "server" (latest snapshot + the batches after it)
and checks the restored state equals the original. Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from loadtest import results
from qstate.core.address import PartitionId
from qstate.core.records import delta as deltas
from qstate.core.records import paths
from qstate.core.records.assignment import Assignment, save_assignment
from qstate.core.records.catalog import snapshot_batches
from qstate.core.records.manifest import BatchManifest, write_manifest
from qstate.core.records.operator import OperatorSpec, WindowSpec, save_spec
from qstate.core.records.storage import Storage
from qstate.shard.partitions import PartitionCommit, Partitions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=25)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/restore.md"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qstate-restore-"))
    storage = Storage(str(tmp / "storage"))
    spec = OperatorSpec("bench", "counts", "k", {"n": "long"}, partitions=1,
                        window=WindowSpec("tumbling", 60_000))
    save_spec(storage, spec)
    save_assignment(storage, Assignment("bench", 1, {"a": "x:1"}, {"counts": ["a"]}))
    a = Partitions(tmp / "a", storage, "a", snapshot_every=args.every)
    a.sync()
    keys = [f"key-{i:07d}" for i in range(args.keys)]
    apply_s, snaps = [], []
    for b in range(args.batches):
        t = pa.table({"key": keys, "start": [0] * len(keys), "end": [60_000] * len(keys),
                      "tag": pa.nulls(len(keys), pa.int64()),
                      "n": [b + 1] * len(keys)}).cast(deltas.delta_schema(spec))
        deltas.write_delta(storage, PartitionId(spec.job, spec.operator, 0), b, t)
        write_manifest(storage, "bench", "counts", BatchManifest(b, b, {0: {0: len(keys)}}))
        t0 = time.perf_counter()
        a.commit("bench", "counts", b, b, 1, [PartitionCommit(0, (0,), len(keys))])
        apply_s.append(time.perf_counter() - t0)
    a._bg.shutdown(wait=True)  # let the last snapshot finish
    snaps = snapshot_batches(storage, PartitionId("bench", "counts", 0))
    # a fresh server (disk lost) restores: snapshot + the deltas after it
    save_assignment(storage, Assignment("bench", 2, {"b": "x:2"}, {"counts": ["b"]}))
    t0 = time.perf_counter()
    fresh = Partitions(tmp / "b", storage, "b", snapshot_every=10**9)
    fresh.sync()
    h = fresh.lookup(PartitionId("bench", "counts", 0))
    assert h is not None and h.ready.wait(600)
    restore_s = time.perf_counter() - t0
    for k in keys[:: max(1, len(keys) // 1000)]:
        _, w = h.store.read(k)
        assert w[0].values == [args.batches], (k, w)
    assert h.store.meta.last_batch == args.batches - 1
    replayed = args.batches - 1 - snaps[-1]
    held = a.lookup(PartitionId("bench", "counts", 0))
    assert held is not None
    t0 = time.perf_counter()
    a.snapshots.take(held.store, PartitionId("bench", "counts", 0))
    snap_s = time.perf_counter() - t0
    snapshots = Path(storage.full(paths.snapshots_dir(PartitionId("bench", "counts", 0))))
    sst_bytes = sum(f.stat().st_size for f in snapshots.glob("sst/*.sst"))
    a.close()
    fresh.close()
    command = results.command("loadtest.bench_restore")
    text = "\n".join([
        f"\n## snapshot + restore, one partition of {args.keys:,} keys\n",
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')})\n",
        f"- applying a batch that updates all {args.keys:,} keys: median "
        f"{sorted(apply_s)[len(apply_s) // 2] * 1000:.0f} ms",
        f"- snapshot (RocksDB checkpoint + upload of new SSTs): {snap_s * 1000:.0f} ms; "
        f"SSTs kept on storage {sst_bytes / 1e6:.1f} MB; snapshots kept {snaps}",
        f"- restore on a fresh server: **{restore_s:.2f}s** (download the latest snapshot, "
        f"then replay {replayed} batches of {args.keys:,} rows after it); state verified\n"])
    results.append(args.out, text)


if __name__ == "__main__":
    main()
