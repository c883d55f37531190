"""A job restarted with changed code keeps an operator's state only when the state still
means what the code declares (``save_spec``, docs/upgrading.md): a change it cannot follow is
refused at start, naming the operator and each change, and saying what to do instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from qstate.core.errors import InvalidRequest
from qstate.core.records.operator import Aggregate, OperatorSpec, WindowSpec, load_spec, save_spec
from qstate.core.records.storage import Storage

HOUR = WindowSpec("tumbling", 3_600_000)
STATES = {"views": Aggregate("count", "long"), "spend": Aggregate("sum", "double")}


def spec(key: str = "ad_id", window: WindowSpec = HOUR,
         states: dict[str, Aggregate] | None = None, **kw: int) -> OperatorSpec:
    return OperatorSpec("ads", "per_ad", key, states or STATES, window=window, **kw)


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    st = Storage(str(tmp_path))
    save_spec(st, spec())
    return st


def test_the_same_declaration_and_what_does_not_touch_state_carry_over(
        storage: Storage) -> None:
    save_spec(storage, spec(retention_ms=3_600_000, replicas=2))
    assert load_spec(storage, "ads", "per_ad") == spec(retention_ms=3_600_000, replicas=2)


def test_aggregates_added_after_the_existing_ones_begin_empty_except_beside_a_sketch(
        storage: Storage) -> None:
    """Added last, they are kept (their stored values begin empty: tests of the codec and
    the shard's store); an operator with a sketch refuses any, its sketch ending each
    stored value."""
    users = Aggregate("approx_count_distinct", "long", 12)
    save_spec(storage, spec(states={**STATES, "users": users}))
    kept = load_spec(storage, "ads", "per_ad")
    assert kept is not None and list(kept.states) == ["views", "spend", "users"]
    with pytest.raises(InvalidRequest, match="aggregate 'clicks' added to an operator with "
                                             "an approx_count_distinct"):
        save_spec(storage, spec(states={**STATES, "users": users,
                                        "clicks": Aggregate("count", "long")}))


@pytest.mark.parametrize(("changed", "says"), [
    (spec(key="campaign_id"), "its key changed (ad_id -> campaign_id)"),
    (spec(window=WindowSpec("tumbling", 60_000)),
     "its window changed (tumbling 3600000 ms -> tumbling 60000 ms)"),
    (spec(window=WindowSpec("sliding", 3_600_000, 600_000)),
     "its window changed (tumbling 3600000 ms -> sliding 3600000 ms every 600000 ms)"),
    (spec(states={**STATES, "views": Aggregate("sum", "long")}),
     "aggregate 'views' changed (count as long -> sum as long)"),
    (spec(states={"users": Aggregate("count", "long"), **STATES}),
     "aggregate 'users' added, not after all of views, spend (declare added aggregates "
     "last)"),
    (spec(states={"spend": STATES["spend"], "views": STATES["views"],
                  "users": Aggregate("count", "long")}),
     "aggregate 'users' added, not after all of views, spend"),
    (spec(states={"views": STATES["views"]}), "aggregate 'spend' removed"),
    (spec(states={"spend": STATES["spend"], "views": STATES["views"]}),
     "its aggregates are declared in another order (views, spend -> spend, views)"),
])
def test_a_change_state_cannot_follow_is_refused_naming_it(
        storage: Storage, changed: OperatorSpec, says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        save_spec(storage, changed)
    message = refused.value.message
    assert message.startswith("ads/per_ad cannot keep its state: ") and says in message
    assert "under a new operator name" in message and "qstate savepoint create ads" in message
    assert "--name ads_v2 --from-savepoint ads@NAME" in message  # or a fork beside it
    assert load_spec(storage, "ads", "per_ad") == spec()  # the stored spec is unchanged
