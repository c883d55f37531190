from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import paths
from service.core.address import PartitionId
from service.core.assignment import (
    Assignment,
    ServerInfo,
    balance,
    default_server_id,
    list_servers,
    load_assignment,
    now_ms,
    reassign,
    register_server,
    save_assignment,
    unregister_server,
)
from service.core.errors import Unavailable
from service.core.storage import Storage

FAST = settings(max_examples=30, deadline=None)
SERVER_IDS = ["s0", "s1", "s2", "s3", "s4", "s5", "s6"]
ids = st.sampled_from(SERVER_IDS)
live_sets = st.lists(ids, min_size=1, max_size=len(SERVER_IDS), unique=True)


def moved(old: list[str], new: list[str]) -> int:
    return sum(1 for p, sid in enumerate(new) if p >= len(old) or old[p] != sid)


# ---- balance --------------------------------------------------------------------------

@FAST
@given(st.lists(ids, max_size=40), st.integers(0, 40), live_sets)
def test_balance_is_balanced_and_owned_by_live_servers(old: list[str], partitions: int,
                                                       live: list[str]) -> None:
    new = balance(old, partitions, live)
    assert len(new) == partitions
    assert set(new) <= set(live)
    loads = [new.count(sid) for sid in live]  # a live server without partitions counts as 0
    assert max(loads) - min(loads) <= 1


@FAST
@given(st.lists(ids, max_size=40), st.integers(0, 40), live_sets)
def test_balance_keeps_what_need_not_move(old: list[str], partitions: int,
                                          live: list[str]) -> None:
    """A live owner within the even share keeps every partition it had."""
    new = balance(old, partitions, live)
    share = partitions // len(live)
    counts = Counter(old[:partitions])
    for p, sid in enumerate(old[:partitions]):
        if sid in live and counts[sid] <= share:
            assert new[p] == sid, (p, sid)


@FAST
@given(st.lists(ids, max_size=40), st.integers(0, 40), live_sets)
def test_balance_is_stable(old: list[str], partitions: int, live: list[str]) -> None:
    """Once balanced over a live set, balancing again moves nothing (in any listing order)."""
    new = balance(old, partitions, live)
    assert balance(new, partitions, live) == new
    assert balance(new, partitions, list(reversed(live))) == new


@FAST
@given(st.lists(ids, max_size=40), st.integers(0, 40), live_sets, st.data())
def test_when_a_server_dies_only_its_partitions_move(old: list[str], partitions: int,
                                                     live: list[str], data: st.DataObject) -> None:
    current = balance(old, partitions, live)
    if len(live) < 2:
        return
    dead = data.draw(st.sampled_from(live))
    after = balance(current, partitions, [sid for sid in live if sid != dead])
    assert [p for p in range(partitions) if after[p] != current[p]] == \
        [p for p in range(partitions) if current[p] == dead]


def test_balance_shrinks_and_grows_the_partition_count() -> None:
    assert balance(["a", "b", "a", "b"], 2, ["a", "b"]) == ["a", "b"]
    grown = balance(["a", "b"], 4, ["a", "b"])
    assert grown[:2] == ["a", "b"] and sorted(grown) == ["a", "a", "b", "b"]


def test_balance_without_live_servers_is_unavailable() -> None:
    with pytest.raises(Unavailable):
        balance(["a"], 1, [])


def test_balance_of_no_partitions() -> None:
    assert balance(["a", "b"], 0, ["a"]) == []


def test_balance_moves_as_few_partitions_as_possible() -> None:
    old = ["b", "b", "b", "c", "c"]  # 5 partitions over b, c
    new = balance(old, 5, ["a", "b", "c"])  # "a" joins: b and c each can keep 2
    assert moved(old, new) == 1


# ---- reassign -------------------------------------------------------------------------

def addresses(live: list[str]) -> dict[str, str]:
    return {sid: f"{sid}.host:7100" for sid in live}


operators = st.dictionaries(st.sampled_from(["op_a", "op_b", "op_c"]), st.integers(1, 20),
                            min_size=1)


@FAST
@given(operators, live_sets, st.booleans())
def test_reassign_of_a_new_job(ops: dict[str, int], live: list[str], bump: bool) -> None:
    a = Assignment("j")
    b = reassign(a, ops, addresses(live), bump)
    assert b is not a and b.epoch == 1 and b.job == "j"
    assert a == Assignment("j")  # the old assignment is not touched
    for op, n in ops.items():
        assert len(b.owners[op]) == n
        for p in range(n):
            assert b.owner(op, p) == addresses(live)[b.owners[op][p]]
    assert b.servers == {sid: addresses(live)[sid] for ids in b.owners.values() for sid in ids}


@FAST
@given(operators, live_sets, live_sets, st.booleans())
def test_reassign_bumps_the_epoch_only_on_change_or_request(
        ops: dict[str, int], live1: list[str], live2: list[str], bump: bool) -> None:
    a = reassign(Assignment("j", epoch=6), ops, addresses(live1))
    before = Assignment(a.job, a.epoch, dict(a.servers), {k: list(v) for k, v in a.owners.items()})
    b = reassign(a, ops, addresses(live2), bump)
    assert a == before  # never mutated
    owners_gone = any(sid not in live2 for ids in a.owners.values() for sid in ids)
    if bump or owners_gone:  # asked for, or a dead owner must lose its partitions
        assert b is not a
    if not bump and set(live1) == set(live2):
        assert b is a  # same servers at the same addresses: nothing to do
    if b is not a:
        assert b.epoch == a.epoch + 1
        assert bump or (b.owners, b.servers) != (a.owners, a.servers)  # no needless bump
    # reassigning the result again changes nothing
    assert reassign(b, ops, addresses(live2)) is b


def test_reassign_follows_an_address_change() -> None:
    a = reassign(Assignment("j"), {"op": 4}, {"s0": "h:1", "s1": "h:2"})
    b = reassign(a, {"op": 4}, {"s0": "h:1", "s1": "h:9"})
    assert b.owners == a.owners
    assert b.epoch == a.epoch + 1
    assert b.servers == {"s0": "h:1", "s1": "h:9"}
    assert {b.owner("op", p) for p in range(4)} == {"h:1", "h:9"}


def test_reassign_bump_without_change() -> None:
    a = reassign(Assignment("j"), {"op": 3}, {"s0": "h:1"})
    b = reassign(a, {"op": 3}, {"s0": "h:1"}, bump=True)
    assert b is not a
    assert (b.epoch, b.owners, b.servers) == (a.epoch + 1, a.owners, a.servers)


def test_reassign_balances_operators_it_is_not_given_too() -> None:
    a = reassign(Assignment("j"), {"op1": 2, "op2": 2}, {"s0": "h:1"})
    b = reassign(a, {"op1": 2}, {"s0": "h:1", "s1": "h:2"})
    # op2 is still assigned, now over both live servers, s0 keeping one of its two
    assert sorted(b.owners["op2"]) == ["s0", "s1"]
    assert moved(a.owners["op2"], b.owners["op2"]) == 1


def test_reassign_with_a_dead_owner_of_an_operator_it_is_not_given() -> None:
    a = reassign(Assignment("j"), {"op1": 2, "op2": 2}, {"x": "h:1"})
    b = reassign(a, {"op1": 2}, {"y": "h:2"})  # a restarted job registers op1 first
    assert "x" not in b.servers


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
    from service.core.assignment import EPOCHS_KEPT

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
