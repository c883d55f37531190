"""StateQuery: one immutable query, checked once, refusing in the words of the 400 a client
reads (what to fix), first by the first thing wrong."""

from __future__ import annotations

import dataclasses

import pytest

from qstate.core.errors import InvalidAddress, InvalidRequest
from qstate.router.request import StateQuery

OK = ("j", "op", "n")


def test_a_valid_query_carries_what_was_asked_with_the_limit_resolved() -> None:
    q = StateQuery.of(*OK, ["a", "b"], (0, 10), None, max_windows=50, max_keys=2)
    assert (q.job, q.operator, q.state, q.keys, q.range_ms, q.limit) == (
        "j", "op", "n", ("a", "b"), (0, 10), 50)
    assert StateQuery.of(*OK, ["a"], None, 7, max_windows=50).limit == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.limit = 1  # type: ignore[misc]


@pytest.mark.parametrize("args,kw,error,words", [
    ((*OK, ["a", "b", "c"]), {"max_keys": 2}, InvalidRequest, "3 keys: at most 2 per request"),
    (("j j", "op", "n", ["a"]), {}, InvalidAddress, "invalid job 'j j'"),
    (("j", "-op", "n", ["a"]), {}, InvalidAddress, "invalid operator '-op'"),
    (("j", "op", "", ["a"]), {}, InvalidAddress, "invalid state ''"),
    ((*OK, ["a", "x" * 1025]), {"max_keys": 2}, InvalidAddress, "1025 bytes"),
    ((*OK, ["a"], (5, 5)), {}, InvalidRequest, "'to' (5) must be after 'from' (5)"),
    ((*OK, ["a"], None, 51), {}, InvalidRequest, "'limit' is 51: ask for 1 to 50"),
    ((*OK, ["a"], None, 0), {}, InvalidRequest, "'limit' is 0"),
    # too many keys is said before a bad name: the cheapest check first
    (("j j", "op", "n", ["a", "b"]), {"max_keys": 1}, InvalidRequest, "2 keys: at most 1"),
])
def test_what_is_wrong_is_said(args, kw, error, words) -> None:
    with pytest.raises(error) as err:
        StateQuery.of(*args, max_windows=50, **kw)
    assert words in err.value.message
