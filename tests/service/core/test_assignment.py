from __future__ import annotations

import os
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qstate.control.placement import Cluster, place
from qstate.core.address import PartitionId
from qstate.core.records import paths
from qstate.core.records.assignment import (
    Assignment,
    ServerInfo,
    default_server_id,
    list_servers,
    load_assignment,
    now_ms,
    register_server,
    save_assignment,
    unregister_server,
)
from qstate.core.records.storage import Storage

FAST = settings(max_examples=30, deadline=None)
SERVER_IDS = ["s0", "s1", "s2", "s3", "s4", "s5", "s6"]
ids = st.sampled_from(SERVER_IDS)
live_sets = st.lists(ids, min_size=1, max_size=len(SERVER_IDS), unique=True)


def reassign(a: Assignment, ops: dict[str, int], live: dict[str, str]) -> Assignment:
    return place(a, ops, Cluster(live))


def addresses(live: list[str]) -> dict[str, str]:
    return {sid: f"{sid}.host:7100" for sid in live}


operators = st.dictionaries(st.sampled_from(["op_a", "op_b", "op_c"]), st.integers(1, 20),
                            min_size=1)


# ---- Assignment lookups ---------------------------------------------------------------

def test_lookups() -> None:
    a = Assignment("j", 3, {"s0": "h:1", "s1": "h:2"}, {"op": ["s0", "s1", "s0"]})
    assert [a.owner_id("op", p) for p in range(3)] == ["s0", "s1", "s0"]
    assert [a.owner("op", p) for p in range(3)] == ["h:1", "h:2", "h:1"]
    assert a.owner("op", 3) is None and a.owner_id("op", 3) is None
    assert a.owner("other", 0) is None
    assert a.partitions_of("op") == {"h:1": [0, 2], "h:2": [1]}
    assert a.partitions_of("other") == {}
    assert a.owned_by("s0") == {PartitionId("j", "op", 0), PartitionId("j", "op", 2)}
    assert a.owned_by("nobody") == set()


@FAST
@given(operators, live_sets)
def test_owned_by_partitions_the_assignment(ops: dict[str, int], live: list[str]) -> None:
    a = reassign(Assignment("j"), ops, addresses(live))
    every = {PartitionId("j", op, p) for op, n in ops.items() for p in range(n)}
    parts = [a.owned_by(sid) for sid in live]
    assert set().union(*parts) == every
    assert sum(len(p) for p in parts) == len(every)  # disjoint


# ---- storage --------------------------------------------------------------------------

def test_save_and_load(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    assert load_assignment(s, "j") == Assignment("j")  # none yet: epoch 0, no owners
    a = reassign(Assignment("j", 4), {"op": 5, "op2": 1}, {"s0": "h:1", "s1": "h:2"})
    assert save_assignment(s, a)
    assert s.exists(paths.assignment("j", a.epoch))
    assert load_assignment(s, "j") == a
    assert load_assignment(s, "other") == Assignment("other")


def test_an_epoch_is_written_once_and_the_newest_is_in_force(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    mine = Assignment("j", 3, {"s0": "h:1"}, {"op": ["s0"]})
    theirs = Assignment("j", 3, {"s1": "h:2"}, {"op": ["s1"]})
    assert save_assignment(s, mine)
    assert not save_assignment(s, theirs)  # epoch 3 is taken: nothing replaced
    assert load_assignment(s, "j") == mine
    newer = Assignment("j", 4, {"s1": "h:2"}, {"op": ["s1"]})
    assert save_assignment(s, newer)
    assert load_assignment(s, "j") == newer


def test_racing_writers_of_one_epoch_one_wins(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    s = Storage(str(tmp_path))
    rivals = [Assignment("j", 1, {f"s{i}": f"h:{i}"}, {"op": [f"s{i}"]}) for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda a: save_assignment(s, a), rivals))
    assert won.count(True) == 1
    assert load_assignment(s, "j") == rivals[won.index(True)]
    assert s.list_names(paths.assignments_dir("j")) == [paths.assignment("j", 1).rsplit(
        "/", 1)[1]]  # no temporary left behind


def test_old_epochs_are_collected(tmp_path: Path) -> None:
    from qstate.core.records.assignment import EPOCHS_KEPT

    s = Storage(str(tmp_path))
    for e in range(1, EPOCHS_KEPT + 6):
        assert save_assignment(s, Assignment("j", e))
    names = s.list_names(paths.assignments_dir("j"))
    assert [paths.batch_of(n) for n in names] == list(range(6, EPOCHS_KEPT + 6))


def test_an_assignment_of_qstate_0_1_is_read_until_the_next_epoch(tmp_path: Path) -> None:
    from dataclasses import asdict

    import orjson

    s = Storage(str(tmp_path))
    old = Assignment("j", 7, {"s0": "h:1"}, {"op": ["s0"]})
    s.write_bytes(paths.legacy_assignment("j"), orjson.dumps(asdict(old)))
    assert load_assignment(s, "j") == old
    new = reassign(old, {"op": 1}, {"s1": "h:2"})
    assert save_assignment(s, new)
    assert load_assignment(s, "j") == new and new.epoch == 8


def test_servers_register_list_unregister(tmp_path: Path) -> None:
    s = Storage(str(tmp_path))
    assert list_servers(s) == []
    infos = [ServerInfo("s1", "h:7101", "h:9101", 42, 1000, "host", "/data"),
             ServerInfo("s0", "h:7100")]
    for i in infos:
        register_server(s, i)
    s.write_bytes(f"{paths.servers_dir()}/README.txt", b"not a server")
    assert sorted(list_servers(s), key=lambda i: i.id) == sorted(infos, key=lambda i: i.id)
    register_server(s, ServerInfo("s0", "h:7200"))  # re-registering replaces
    unregister_server(s, "s1")
    unregister_server(s, "never-was")
    assert list_servers(s) == [ServerInfo("s0", "h:7200")]


def test_default_server_id() -> None:
    assert default_server_id("10.0.0.5", 7100) == "10.0.0.5-7100"
    ipv6 = default_server_id("::1", 7100)
    assert ":" not in ipv6 and ipv6.endswith("-7100")
    assert default_server_id("10.0.0.5", 0) == f"pid-{os.getpid()}"


def test_now_ms() -> None:
    before = time.time() * 1000
    t = now_ms()
    assert isinstance(t, int)
    assert before - 1 <= t <= time.time() * 1000
