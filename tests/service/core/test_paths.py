from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qstate.core.address import PartitionId
from qstate.core.records import paths

MAX_BATCH = 10**20 - 1  # the largest id that fits the 20 digits of a batch name
batch_ids = st.integers(min_value=0, max_value=MAX_BATCH)
suffixes = st.sampled_from(["", paths.JSON, paths.ARROW, ".tmp", ".json.crc"])
names = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=64)
FAST = settings(max_examples=25, deadline=None)
pids = st.builds(PartitionId, names, names, st.integers(min_value=0, max_value=4095))


@FAST
@given(batch_ids, suffixes)
def test_batch_of_reads_back_batch_name(n: int, suffix: str) -> None:
    name = paths.batch_name(n, suffix)
    assert name.endswith(suffix)
    assert paths.batch_of(name) == n


@FAST
@given(st.lists(batch_ids, min_size=2, max_size=30, unique=True), suffixes)
def test_batch_names_sort_as_numbers(ns: list[int], suffix: str) -> None:
    by_name = sorted(paths.batch_name(n, suffix) for n in ns)
    assert [paths.batch_of(n) for n in by_name] == sorted(ns)


@pytest.mark.parametrize("name", [
    "", "x.json", "snapshot.json", "1.json", "0000000000000000001.json",  # 19 digits
    "000000000000000000001.json",  # 21 digits
    "-0000000000000000001.json", "0000000000000000000a.json", ".tmp-1234", "sst",
])
def test_batch_of_is_none_for_other_names(name: str) -> None:
    assert paths.batch_of(name) is None


@FAST
@given(st.one_of(st.text(alphabet=string.ascii_letters + string.digits + "._-", max_size=40),
                 st.text(alphabet=string.digits + ".a", min_size=18, max_size=26)))
def test_batch_of_is_none_unless_stem_is_twenty_ascii_digits(name: str) -> None:
    stem = name.split(".", 1)[0]
    expected = int(stem) if len(stem) == 20 and all(c in string.digits for c in stem) else None
    assert paths.batch_of(name) == expected


@pytest.mark.parametrize("stem", ["²" * 20, "٠" * 19 + "١"])
def test_batch_of_rejects_non_ascii_digits(stem: str) -> None:
    assert paths.batch_of(stem + paths.JSON) is None


@FAST
@given(st.lists(batch_ids, max_size=20, unique=True),
       st.lists(batch_ids, max_size=20, unique=True),
       st.lists(st.sampled_from(["junk.json", "x.arrow", ".tmp-abc", "sst", "1.json"]),
                max_size=5))
def test_batches_picks_the_suffix_and_sorts(json_ids: list[int], arrow_ids: list[int],
                                            junk: list[str]) -> None:
    listing = ([paths.batch_name(n, paths.JSON) for n in json_ids]
               + [paths.batch_name(n, paths.ARROW) for n in arrow_ids]
               + [paths.batch_name(n) for n in arrow_ids]  # snapshot member directories
               + junk)
    listing.reverse()
    assert paths.batches(listing, paths.JSON) == sorted(json_ids)
    assert paths.batches(listing, paths.ARROW) == sorted(arrow_ids)


def test_layout_matches_the_documented_tree() -> None:
    pid = PartitionId("ads", "per_campaign", 7)
    n = 42
    padded = "0" * 18 + "42"
    assert paths.server("s-1") == "cluster/servers/s-1.json"
    assert paths.assignment("ads", n) == f"cluster/assignments/ads/{padded}.json"
    assert paths.legacy_assignment("ads") == "cluster/assignments/ads.json"
    assert paths.spec("ads", "per_campaign") == "jobs/ads/per_campaign/operator.json"
    assert paths.manifest("ads", "per_campaign", n) == (
        f"jobs/ads/per_campaign/batches/{padded}.json")
    assert paths.delta(pid, n, 3) == f"jobs/ads/per_campaign/deltas/00007/{padded}-00003.arrow"
    assert paths.snapshot(pid, n) == f"jobs/ads/per_campaign/snapshots/00007/{padded}.json"
    assert paths.snapshot_member(n, "CURRENT") == f"{padded}/CURRENT"
    assert paths.sst_member("ab12") == "sst/ab12.sst"


@FAST
@given(pids, batch_ids)
def test_files_live_in_their_directories(pid: PartitionId, n: int) -> None:
    def parent(p: str) -> str:
        return p.rsplit("/", 1)[0]

    op_dir = paths.operator_dir(pid.job, pid.operator)
    assert parent(paths.server("x")) == paths.servers_dir()
    assert parent(paths.spec(pid.job, pid.operator)) == op_dir
    assert parent(paths.manifest(pid.job, pid.operator, n)) == paths.manifests_dir(
        pid.job, pid.operator)
    assert parent(paths.delta(pid, n, 0)) == paths.deltas_dir(pid)
    assert parent(paths.snapshot(pid, n)) == paths.snapshots_dir(pid)
    for d in (paths.manifests_dir(pid.job, pid.operator), paths.deltas_dir(pid),
              paths.snapshots_dir(pid)):
        assert d.startswith(f"{op_dir}/")
    # the assignment lives apart from operator folders: no operator name can collide with it
    assert not paths.assignment(pid.job, n).startswith(f"{paths.jobs_dir()}/")
    assert parent(paths.assignment(pid.job, n)) == paths.assignments_dir(pid.job)
    # the names the catalog lists read back as the batch they were written for
    assert paths.batches([paths.delta(pid, n, 2).rsplit("/", 1)[1]], paths.ARROW) == [n]
    assert paths.batches([paths.snapshot(pid, n).rsplit("/", 1)[1]], paths.JSON) == [n]
    member_dir = paths.snapshot_member(n, "MANIFEST-000001").split("/", 1)[0]
    assert paths.batch_of(member_dir) == n


@FAST
@given(st.lists(st.integers(min_value=0, max_value=4095), min_size=2, max_size=20, unique=True))
def test_partition_directories_sort_as_numbers(partitions: list[int]) -> None:
    dirs = {paths.deltas_dir(PartitionId("j", "op", p)).rsplit("/", 1)[1]: p for p in partitions}
    assert [dirs[d] for d in sorted(dirs)] == sorted(partitions)


@FAST
@given(pids, pids, batch_ids, batch_ids)
def test_distinct_partitions_and_batches_get_distinct_files(a: PartitionId, b: PartitionId,
                                                            m: int, n: int) -> None:
    if (a, m) != (b, n):
        assert paths.delta(a, m, 0) != paths.delta(b, n, 0)
        assert paths.snapshot(a, m) != paths.snapshot(b, n)
    assert paths.delta(a, m, 0) != paths.delta(a, m, 1)  # fragments of one batch
