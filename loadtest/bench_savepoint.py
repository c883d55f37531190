"""What a savepoint, a fork and a rollback cost on a job's real checkpoint storage (issue 28).

    python -m loadtest.bench_ingest --workload tweets --keys 1000000 --events 2000000 \\
        --sinks qstate                      # leaves /tmp/qstate-ingest-*/storage-qstate-*
    python -m loadtest.bench_savepoint --storage /tmp/qstate-ingest-XXXX/storage-qstate-NNN

Works on a copy of ``--storage`` (its job stays as it was): makes a savepoint of the job
(``qstate.core.records.savepoint.create``), then writes a fork's state from it under a new job name
and a rollback's under the job's own (``qstate.shard.seed.seed``, what ``qstate job
--from-savepoint`` runs before Spark starts), timing each and sizing what each wrote.
Appends a section to ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from loadtest import results
from qstate.core.records import paths
from qstate.core.records.catalog import manifest_batches
from qstate.core.records.operator import OperatorSpec, load_spec
from qstate.core.records.savepoint import create
from qstate.core.records.storage import Storage
from qstate.shard.seed import seed


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--storage", type=Path, required=True,
                    help="checkpoint storage of a job (bench_ingest leaves one)")
    ap.add_argument("--out", type=Path, default=Path("loadtest/results/savepoint.md"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qstate-savepoint-"))
    root = tmp / "storage"
    shutil.copytree(args.storage, root)
    storage = Storage(str(root))
    [job] = storage.list_dirs(paths.jobs_dir())
    jobs = root / paths.jobs_dir()
    t0 = time.perf_counter()
    sp = create(storage, job, "bench")
    made_s = time.perf_counter() - t0
    record = (root / paths.savepoint(job, "bench")).stat().st_size
    specs: list[OperatorSpec] = []
    for op in sp.operators:
        spec = load_spec(storage, job, op)
        assert spec is not None
        specs.append(spec)
    before = size_mb(jobs / job)
    t0 = time.perf_counter()
    seed(storage, sp, "forked", [replace(s, job="forked") for s in specs], sp.batch,
         tmp / "scratch")
    fork_s = time.perf_counter() - t0
    rollback_at = 1 + max(manifest_batches(storage, job, s.operator)[-1] for s in specs)
    t0 = time.perf_counter()
    seed(storage, sp, job, specs, rollback_at, tmp / "scratch")
    rollback_s = time.perf_counter() - t0
    partitions = sum(s.partitions for s in specs)
    snapshots = sum(1 for c in sp.operators.values() for s in c.snapshots.values() if s >= 0)
    fork = f"`qstate job ... --name forked --from-savepoint {job}@bench`"
    rows = [("savepoint (`qstate savepoint create`)", f"{made_s:.3f}",
             f"a {record:,}-byte record"),
            (f"fork's state ({fork})", f"{fork_s:.1f}",
             f"{size_mb(jobs / 'forked'):.0f} MiB of snapshots"),
            ("rollback's state (`qstate job ... --from-savepoint bench`)", f"{rollback_s:.1f}",
             f"the job's storage after it: {size_mb(jobs / job):.0f} MiB")]
    results.append(args.out, f"""
### savepoint, fork and rollback of `{job}` at batch {sp.batch} ({time.strftime('%Y-%m-%d %H:%M')})

`{results.command('loadtest.bench_savepoint')}`

The job's storage: {before:.0f} MiB, {partitions} partitions of {len(specs)} operators,
{snapshots} of them with a snapshot at or before the savepoint's batch (the others are
rebuilt from their first batch).

| step | seconds | wrote |
|---|---|---|
""" + "".join(f"| {a} | {b} | {c} |\n" for a, b, c in rows))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
