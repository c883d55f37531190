"""qstate.feast without a router: the mapping of keys, values, windows and timestamps
(``qstate.feast.mapping``), and the rounds of one read (``qstate.feast.reads``) driven with
answers a test writes, so each rule of docs/feast.md (one batch a call, the closed window
placed by the answers' watermark, requested features only, ttl) is seen to hold and to fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.types import Float64, Int32, Int64, String

from qstate.core.answer import (
    BatchAnswer,
    JobInfo,
    OperatorInfo,
    StateAnswer,
    StateInfo,
    StateValues,
    Window,
    WindowInfo,
    batch_values,
)
from qstate.core.errors import InvalidRequest, Unavailable
from qstate.feast.config import ViewSource
from qstate.feast.mapping import closed_start, event_time, key_of, problems, value_proto
from qstate.feast.reads import Ask, Marks, ViewRead, rounds

HOUR = 3_600_000
NOW = datetime(2026, 11, 27, 12, 30, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def op(name: str = "per_tweet_1h", kind: str = "tumbling", size: int = HOUR, slide: int = 0,
       watermark: int = 0) -> OperatorInfo:
    return OperatorInfo(name=name, key="tweet_id", states=[
        StateInfo(name="impressions", type="long"), StateInfo(name="clicks", type="long"),
        StateInfo(name="ctr", type="double")],
        window=WindowInfo(kind=kind, size_ms=size, slide_ms=slide, gap_ms=0), partitions=4,
        partitions_available=4, retention_ms=86_400_000, last_batch=0, watermark=watermark)


def answer(state: str, key: str, batch: int, watermark: int,
           windows: Sequence[tuple[int, int | float | None]]) -> StateValues:
    """What the router would answer, read as the store reads it (its JSON as StateValues)."""
    said = StateAnswer(job="tweets", operator="per_tweet_1h", state=state, key=key,
                       found=bool(windows), batch=batch, watermark=watermark,
                       windows=[Window(start=s, end=s + HOUR, value=v) for s, v in windows])
    [got] = batch_values(BatchAnswer(results=[said]).model_dump_json().encode())
    return got


def view(window: str = "latest", keys: tuple[str, ...] = ("a", "b"),
         features: tuple[str, ...] = ("impressions", "clicks"),
         ttl: timedelta | None = None) -> ViewRead:
    return ViewRead("tweets", "per_tweet_1h", window,  # type: ignore[arg-type]
                    tuple((f, f, ValueType.INT64) for f in features), keys, ttl)


Store = Callable[[Ask], list[StateValues]]


def drive(views: list[ViewRead], store: Store, marks: Marks | None = None, max_rounds: int = 4
          ) -> tuple[list, list[list[Ask]]]:
    """Run the rounds against ``store`` (what a router would answer to each ask); the rows
    and every round's asks."""
    marks = marks or Marks(operators={("tweets", "per_tweet_1h"): op()})
    gen = rounds(views, marks, max_rounds, NOW)
    seen = [next(gen)]
    try:
        while True:
            seen.append(gen.send([store(a) for a in seen[-1]]))
    except StopIteration as done:
        return done.value, seen


# -- mapping -----------------------------------------------------------------------------


def ek(join_key: str, value: ValueProto) -> EntityKeyProto:
    return EntityKeyProto(join_keys=[join_key], entity_values=[value])


def test_an_entity_key_is_the_qstate_key_a_string_as_is_an_int64_its_digits() -> None:
    assert key_of(ek("tweet_id", ValueProto(string_val="tw-1"))) == "tw-1"
    assert key_of(ek("tweet_num", ValueProto(int64_val=-90817))) == "-90817"
    with pytest.raises(InvalidRequest, match="int32_val"):
        key_of(ek("n", ValueProto(int32_val=3)))
    two = EntityKeyProto(join_keys=["a", "b"], entity_values=[ValueProto(string_val="x")] * 2)
    with pytest.raises(InvalidRequest, match="2 join keys"):
        key_of(two)


def test_values_take_the_declared_type_and_no_value_is_an_empty_value() -> None:
    assert value_proto(2**62 + 1, ValueType.INT64) == ValueProto(int64_val=2**62 + 1)
    assert value_proto(3, ValueType.DOUBLE) == ValueProto(double_val=3.0)
    assert value_proto(None, ValueType.INT64) == ValueProto()


def test_the_event_timestamp_is_the_windows_end_or_the_watermark_without_one() -> None:
    assert event_time({"end": HOUR, "value": 1}, 5) == datetime(1970, 1, 1, 1, tzinfo=UTC)
    assert event_time({"end": None, "value": 1}, 7_000) == \
        datetime(1970, 1, 1, 0, 0, 7, tzinfo=UTC)
    assert event_time(None, 7_000) == datetime(1970, 1, 1, 0, 0, 7, tzinfo=UTC)


@pytest.mark.parametrize(("kind", "size", "slide", "watermark", "start"), [
    ("tumbling", HOUR, 0, 2 * HOUR + 10_000, HOUR),  # [1h, 2h) ended before the watermark
    ("tumbling", HOUR, HOUR, 2 * HOUR, HOUR),  # an end exactly at the watermark is closed
    ("tumbling", HOUR, 0, 2 * HOUR - 1, 0),
    ("sliding", 60_000, 10_000, 125_000, 60_000),  # [60 s, 120 s) is the newest ended
    ("tumbling", HOUR, 0, -5, -2 * HOUR),  # before 1970 too (floor, not truncation)
])
def test_the_closed_window_is_the_newest_of_the_grid_ended_at_the_watermark(
        kind: str, size: int, slide: int, watermark: int, start: int) -> None:
    got = closed_start(watermark, op(kind=kind, size=size, slide=slide))
    assert got == start
    assert got + size <= watermark < got + (slide or size) + size


def feature_view(*fields: Field, keys: tuple[Entity, ...] | None = None) -> FeatureView:
    tweet = Entity(name="tweet", join_keys=["tweet_id"], value_type=ValueType.STRING)
    entity_fields = [Field(name=e.join_key, dtype=String) for e in (keys or (tweet,))]
    return FeatureView(name="tweet_hourly", entities=list(keys or (tweet,)),
                       schema=[*entity_fields, *fields],
                       source=FileSource(path="x.parquet", timestamp_field="ts"))


def job(*ops: OperatorInfo) -> JobInfo:
    return JobInfo(name="tweets", operators=list(ops or (op(),)))


def test_update_names_what_does_not_match_the_job_and_passes_what_does() -> None:
    fv = feature_view(Field(name="impressions", dtype=Int64), Field(name="rate", dtype=Float64))
    src = ViewSource(job="tweets", operator="per_tweet_1h", states={"rate": "ctr"})
    assert problems(fv, src, {"tweets"}, job()) == []
    assert problems(fv, None, {"tweets"}, job())[0].startswith(
        "feature view 'tweet_hourly' is not mapped")
    [gone] = problems(fv, src.model_copy(update={"job": "ads"}), {"tweets"}, None)
    assert "job 'ads' is not served by the router (it serves ['tweets'])" in gone
    [no_op] = problems(fv, src.model_copy(update={"operator": "per_tweet_2h"}), {"tweets"},
                       job())
    assert "no operator 'per_tweet_2h' (it has ['per_tweet_1h'])" in no_op
    [no_state] = problems(fv, src.model_copy(update={"states": {"rate": "likes"}}),
                          {"tweets"}, job())
    assert "reads state 'likes', which tweets/per_tweet_1h does not have" in no_state
    [dtype] = problems(feature_view(Field(name="impressions", dtype=Float64)), src,
                       {"tweets"}, job())
    assert "'impressions' is declared Float64, but state 'impressions' is long: declare " \
           "it Int64" in dtype
    [small] = problems(feature_view(Field(name="clicks", dtype=Int32)), src, {"tweets"}, job())
    assert "declare it Int64" in small
    [session] = problems(fv, src.model_copy(update={"window": "closed"}), {"tweets"},
                         job(op(kind="session")))
    assert "window 'closed' needs a tumbling or sliding window" in session


def test_update_refuses_more_than_one_join_key_and_keys_of_other_types() -> None:
    a = Entity(name="a", join_keys=["a"], value_type=ValueType.STRING)
    b = Entity(name="b", join_keys=["b"], value_type=ValueType.STRING)
    src = ViewSource(job="tweets", operator="per_tweet_1h")
    fv = FeatureView(name="two", entities=[a, b], schema=[
        Field(name="a", dtype=String), Field(name="b", dtype=String),
        Field(name="clicks", dtype=Int64)], source=FileSource(path="x", timestamp_field="t"))
    [two] = problems(fv, src, {"tweets"}, job())
    assert "has 2 join keys (['a', 'b'])" in two and "exactly one" in two
    c = Entity(name="c", join_keys=["c"], value_type=ValueType.DOUBLE)
    fv = FeatureView(name="dbl", entities=[c], schema=[Field(name="c", dtype=Float64),
                                                      Field(name="clicks", dtype=Int64)],
                     source=FileSource(path="x", timestamp_field="t"))
    [dbl] = problems(fv, src, {"tweets"}, job())
    assert "join key 'c' is Float64" in dbl


# -- rounds ------------------------------------------------------------------------------


def test_one_batch_read_of_an_operators_states_and_a_missing_key_is_none_none() -> None:
    store = {("impressions", "a"): [(HOUR, 3)], ("clicks", "a"): [(HOUR, 1)]}
    rows, seen = drive([view(keys=("a", "nope"))], lambda a: [
        answer(s, k, 7, HOUR, store.get((s, k), [])) for k in a.keys for s in a.states])
    assert [[(x.states, x.keys, x.start, x.min_batch) for x in r] for r in seen] == [[
        (("impressions", "clicks"), ("a", "nope"), None, None)]]
    at = datetime(1970, 1, 1, 2, tzinfo=UTC)  # the window's end
    assert rows == [[(at, {"impressions": ValueProto(int64_val=3),
                           "clicks": ValueProto(int64_val=1)}), (None, None)]]


def test_requested_features_limit_the_states_read_and_views_share_a_states_read() -> None:
    views = [view(features=("clicks",), keys=("a",)), view(features=("clicks",), keys=("b",))]
    rows, seen = drive(views, lambda a: [answer(s, k, 1, 0, [(0, 5)]) for k in a.keys
                                         for s in a.states])
    assert [(x.states, x.keys) for x in seen[0]] == [(("clicks",), ("a", "b"))]
    assert [list(r[0][1] or {}) for r in rows] == [["clicks"], ["clicks"]]


def test_answers_of_two_batches_are_read_again_at_the_newest() -> None:
    batch = {"a": 7, "b": 8}  # two partitions, one a commit ahead of the other

    def store(a: Ask) -> list[StateValues]:
        return [answer(s, k, b, 0, [(0, b)]) for k in a.keys
                for b in [max(batch[k], a.min_batch or 0)] for s in a.states]

    rows, seen = drive([view(keys=("a", "b"))], store)
    assert [[x.min_batch for x in r] for r in seen] == [[None], [8]]
    assert [r[1] for r in rows[0]] == [{"impressions": ValueProto(int64_val=8),
                                        "clicks": ValueProto(int64_val=8)}] * 2


def test_a_job_that_never_settles_is_unavailable_not_a_mixed_vector() -> None:
    tick = iter(range(100))
    with pytest.raises(Unavailable, match="could not read one batch of"):
        drive([view(keys=("a", "b"))], lambda a: [
            answer(s, k, b, 0, [(0, 1)]) for k in a.keys for b in [next(tick)]
            for s in a.states], max_rounds=3)


def test_a_closed_window_is_read_where_the_answers_watermark_places_it() -> None:
    marks = Marks(operators={("tweets", "per_tweet_1h"): op(watermark=HOUR + 5)})
    now_at = {"batch": 3, "watermark": 2 * HOUR + 5}  # the job moved on since described

    def store(a: Ask) -> list[StateValues]:
        assert a.start is not None
        return [answer(s, k, now_at["batch"], now_at["watermark"], [(a.start, 9)])
                for k in a.keys for s in a.states]

    rows, seen = drive([view("closed", keys=("a",))], store, marks)
    assert [[(x.start, x.min_batch) for x in r] for r in seen] == [[(0, None)], [(HOUR, 3)]]
    assert rows[0][0][0] == datetime(1970, 1, 1, 2, tzinfo=UTC)
    assert marks.seen[("tweets", "per_tweet_1h")] == (3, 2 * HOUR + 5)
    # the next call places it by what it saw: one round
    _, seen = drive([view("closed", keys=("a",))], store, marks)
    assert len(seen) == 1 and seen[0][0].start == HOUR


def test_a_window_older_than_the_ttl_is_no_value_with_its_timestamp() -> None:
    end = NOW_MS - 2 * HOUR  # ended two hours before NOW
    rows, _ = drive([view(keys=("a",), ttl=timedelta(hours=1)),
                     view(keys=("a",), ttl=timedelta(hours=3))],
                    lambda a: [answer(s, k, 1, 0, [(end - HOUR, 4)]) for k in a.keys
                               for s in a.states])
    at = datetime.fromtimestamp(end / 1000, UTC)
    assert rows[0] == [(at, None)]
    assert rows[1][0][0] == at and rows[1][0][1] is not None


def test_a_state_without_a_value_is_an_empty_value() -> None:
    rows, _ = drive([view(keys=("a",), features=("ctr",))],
                    lambda a: [answer(s, k, 1, 0, [(0, None)]) for k in a.keys
                               for s in a.states])
    assert rows[0][0][1] == {"ctr": ValueProto()}


def test_operators_are_each_read_at_one_batch_of_their_own() -> None:
    """Spark-state mode runs each operator as a query of its own: their batch numbers differ
    and no min_batch of one means anything to the other (docs/feast.md)."""
    other = ViewRead("tweets", "per_tweet_1m", "latest", (("clicks", "clicks", ValueType.INT64),),
                     ("a",))
    batch = {"per_tweet_1h": 40, "per_tweet_1m": 3}
    rows, seen = drive([view(keys=("a",)), other], lambda a: [
        answer(s, k, batch[a.operator], 0, [(0, batch[a.operator])]) for k in a.keys
        for s in a.states])
    assert len(seen) == 1
    assert [r[0][1] for r in rows] == [
        {"impressions": ValueProto(int64_val=40), "clicks": ValueProto(int64_val=40)},
        {"clicks": ValueProto(int64_val=3)}]
