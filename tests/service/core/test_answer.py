from __future__ import annotations

import json
from typing import Any, get_type_hints

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from qstate.core import answer
from qstate.core.answer import (
    BatchAnswer,
    ClusterInfo,
    ClusterMap,
    ErrorBody,
    JobInfo,
    JobList,
    JobPosition,
    JobSummary,
    OperatorInfo,
    OperatorMap,
    PartitionHolder,
    PartitionOwners,
    PartitionStatus,
    Point,
    ReadAddress,
    Series,
    ShardStatus,
    StateAnswer,
    StateInfo,
    StateValues,
    TopAnswer,
    TopEntry,
    WatchEvent,
    Window,
    WindowInfo,
    WindowSpan,
    WindowValue,
    batch_values,
    error_responses,
)
from qstate.core.errors import InvalidAddress, NotFound, Unavailable, UnknownOperator

WINDOW = {"start": 0, "end": 60_000, "value": 3}
STATE_ANSWER = {"job": "j", "operator": "op", "state": "n", "key": "k", "found": True,
                "batch": 5, "watermark": 1000, "windows": [WINDOW]}
WINDOW_INFO = {"kind": "tumbling", "size_ms": 60_000, "slide_ms": 60_000, "gap_ms": 0}
OPERATOR_INFO = {"name": "op", "key": "k", "states": [{"name": "n", "type": "long"}],
                 "window": WINDOW_INFO, "partitions": 4, "partitions_available": 4,
                 "retention_ms": 0, "last_batch": 5, "watermark": 1000}
PARTITION = {"job": "j", "operator": "op", "partition": 0, "state": "ready", "last_batch": 5,
             "watermark": 1000, "freshness_s": 2.5}
SHARD = {"id": "s0", "address": "127.0.0.1:1", "up": True, "partitions": [PARTITION]}
READ_AT = {"router": "r0", "url": "http://h:8000", "grpc": "h:50051"}
HOLDER = {"server": "s0", "ready": True, "read_at": [READ_AT]}
OWNERS = {"partition": 0, "owner": HOLDER, "followers": [HOLDER]}
OPERATOR_MAP = {"operator": "op", "partitions": 1, "owners": [OWNERS]}
TOP_ANSWER = {"job": "j", "operator": "op", "state": "n", "window": {"start": 0, "end": 60_000},
              "order": "desc", "batch": 5, "watermark": 1000,
              "entries": [{"key": "k", "value": 3}, {"key": "a", "value": 2.5}]}
VALID: dict[type[BaseModel], dict[str, Any]] = {
    Window: WINDOW,
    StateAnswer: STATE_ANSWER,
    BatchAnswer: {"results": [STATE_ANSWER]},
    ErrorBody: {"error": "NotFound", "message": "m"},
    StateInfo: {"name": "n", "type": "long"},
    WindowInfo: WINDOW_INFO,
    OperatorInfo: OPERATOR_INFO,
    JobInfo: {"name": "j", "operators": [OPERATOR_INFO]},
    JobSummary: {"name": "j", "operators": ["op"]},
    JobList: {"jobs": [{"name": "j", "operators": ["op"]}]},
    PartitionStatus: PARTITION,
    ShardStatus: SHARD,
    ClusterInfo: {"now": 3500, "shards": [SHARD], "unassigned": []},
    ReadAddress: READ_AT,
    PartitionHolder: HOLDER,
    PartitionOwners: OWNERS,
    OperatorMap: OPERATOR_MAP,
    ClusterMap: {"job": "j", "epoch": 2, "operators": [OPERATOR_MAP]},
    Point: {"time": 1767225600000, "value": 17},
    WindowSpan: {"start": 0, "end": 60_000},
    JobPosition: {"job": "j", "topic": "t", "partition": 1, "offset": 5, "batch": 3,
                  "end_offset": 9},
    TopEntry: {"key": "k", "value": 3},
    TopAnswer: TOP_ANSWER,
    WatchEvent: {"job": "j", "operator": "op", "state": "n", "batch": 5, "watermark": 1000,
                 "committed_at": None, "coalesced": False, "snapshot": True,
                 "changes": [STATE_ANSWER], "top": TOP_ANSWER},
}
ROOTS: dict[type[BaseModel], list[Any]] = {Series: [{"time": 0, "value": 1}]}  # JSON arrays
FAST = settings(max_examples=25, deadline=None)


def test_every_model_is_covered() -> None:
    exported = {getattr(answer, n) for n in answer.__all__}
    assert {m for m in exported if isinstance(m, type) and issubclass(m, BaseModel)} == \
        set(VALID) | set(ROOTS)


@pytest.mark.parametrize("model", list(ROOTS))
def test_array_answers_ignore_new_fields_in_items(model: type[BaseModel]) -> None:
    """An item of a newer router's array answer, with a field this client does not know."""
    assert model.model_validate([{**ROOTS[model][0], "surprise": 1}]) == \
        model.model_validate(ROOTS[model])


@pytest.mark.parametrize("model", list(VALID))
def test_models_ignore_new_fields(model: type[BaseModel]) -> None:
    """A newer router's answer: the fields this client knows, read as before; the new one
    ignored, not refused (docs/architecture.md §5, compatibility)."""
    newer = model.model_validate_json(orjson.dumps({**VALID[model], "surprise": {"a": [1]}}))
    assert newer == model.model_validate(VALID[model])
    assert "surprise" not in newer.model_dump()


def test_nested_models_ignore_new_fields_too() -> None:
    a = StateAnswer.model_validate({**STATE_ANSWER, "windows": [{**WINDOW, "x": 1}]})
    assert a == StateAnswer.model_validate(STATE_ANSWER)


@pytest.mark.parametrize("model", list(VALID))
def test_a_missing_field_is_still_refused(model: type[BaseModel]) -> None:
    """Tolerance is for additions: an answer without a required field is not one."""
    required = [n for n, f in model.model_fields.items() if f.is_required()]
    assert required, model
    with pytest.raises(ValidationError, match="missing"):
        model.model_validate({k: v for k, v in VALID[model].items() if k != required[0]})


def test_the_schema_allows_new_fields() -> None:
    """Generated clients (the OpenAPI document) tolerate additions as this one does."""
    assert "additionalProperties" not in StateAnswer.model_json_schema()


@pytest.mark.parametrize("model", [StateAnswer, ErrorBody])
def test_documented_examples_are_valid(model: type[BaseModel]) -> None:
    examples = model.model_json_schema()["examples"]
    assert examples
    for ex in examples:
        assert model.model_validate(ex).model_dump(exclude_unset=True) == ex


windows = st.builds(
    Window,
    start=st.none() | st.integers(-(2**62), 2**62),
    end=st.none() | st.integers(-(2**62), 2**62),
    value=st.none() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False),
)
answers = st.builds(
    StateAnswer, job=st.text(max_size=10), operator=st.text(max_size=10),
    state=st.text(max_size=10), key=st.text(max_size=30), found=st.booleans(),
    batch=st.integers(-1, 2**62), watermark=st.integers(-(2**62), 2**62),
    windows=st.lists(windows, max_size=5))


@FAST
@given(st.lists(windows, max_size=6))
def test_latest_is_the_last_window(ws: list[Window]) -> None:
    a = StateAnswer(**{**STATE_ANSWER, "windows": ws})  # type: ignore[arg-type]
    if ws:
        assert a.latest is ws[-1]
    else:
        assert a.latest is None


@FAST
@given(answers)
def test_json_round_trip(a: StateAnswer) -> None:
    back = StateAnswer.model_validate_json(a.model_dump_json())
    assert back == a
    # counts are exact integers: an int stays an int, however large
    for w0, w1 in zip(a.windows, back.windows, strict=True):
        assert type(w1.value) is type(w0.value)


def test_state_values_are_fields_of_the_models() -> None:
    """StateValues is a StateAnswer read through fewer fields, never a shape of its own."""
    for lean, model in ((StateValues, StateAnswer), (WindowValue, Window)):
        for name, hint in get_type_hints(lean).items():
            want = model.model_fields[name].annotation
            assert hint == (list[WindowValue] if want == list[Window] else want), (lean, name)


@FAST
@given(st.lists(answers, max_size=4))
def test_batch_values_read_what_the_models_read(got: list[StateAnswer]) -> None:
    body = BatchAnswer(results=got).model_dump_json().encode()
    assert batch_values(body) == [
        {"found": a.found, "batch": a.batch, "watermark": a.watermark,
         "windows": [{"end": w.end, "value": w.value} for w in a.windows]} for a in got]
    for lean, model in zip(batch_values(body), got, strict=True):  # exact counts stay ints
        assert [type(w["value"]) for w in lean["windows"]] == \
            [type(w.value) for w in model.windows]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["start", "end", "value", "x"]), inner, max_size=4), max_leaves=8)


@FAST
@given(st.sampled_from(["found", "batch", "watermark", "windows"]), json_values)
def test_batch_values_refuse_what_the_models_refuse(name: str, value: Any) -> None:
    body = json.dumps({"results": [{**STATE_ANSWER, name: value}]}).encode()
    try:
        BatchAnswer.model_validate_json(body)
    except ValidationError:
        with pytest.raises(ValidationError):
            batch_values(body)
    else:
        batch_values(body)


def test_large_counts_survive_json_exactly() -> None:
    n = 2**53 + 1  # not representable as a float
    a = StateAnswer(**{**STATE_ANSWER, "windows": [{**WINDOW, "value": n}]})  # type: ignore[arg-type]
    raw = orjson.loads(a.model_dump_json())
    assert raw["windows"][0]["value"] == n
    back = BatchAnswer.model_validate_json(BatchAnswer(results=[a]).model_dump_json())
    assert back.results[0].windows[0].value == n


def test_windows_need_every_field() -> None:
    with pytest.raises(ValidationError):
        Window.model_validate({"start": 1, "end": 2})  # value is required, even if null
    assert Window.model_validate({"start": None, "end": None, "value": None}).value is None


@pytest.mark.parametrize("exc", [
    NotFound("no data", batch=311, watermark=17),
    UnknownOperator("unknown job 'x'", job="x"),
    Unavailable("restoring", retry_after_s=2.0, partition=3),
    InvalidAddress("bad name"),
])
def test_error_bodies_the_router_serves_fit_error_body(exc: Exception) -> None:
    body = exc.body()  # type: ignore[attr-defined]
    assert ErrorBody.model_validate(body).model_dump(exclude_unset=True) == body


def test_error_responses_document_every_refusal() -> None:
    r = error_responses()
    assert set(r) == {400, 401, 403, 404, 429, 503}
    assert set(error_responses(body=True)) == set(r) | {413}
    for status in error_responses(body=True):
        assert r.get(status, error_responses(body=True)[status])["model"] is ErrorBody
    for status in r:
        assert r[status]["description"]
    assert {s for s in r if "headers" in r[s]} == {429, 503}
    for status in (429, 503):
        retry = r[status]["headers"]["Retry-After"]
        assert retry["schema"] == {"type": "integer"}
        assert retry["description"]


def test_error_responses_in_an_openapi_document() -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/x", responses=error_responses())
    def x() -> dict[str, int]:
        return {}

    doc = app.openapi()
    responses = doc["paths"]["/x"]["get"]["responses"]
    ref = {"$ref": "#/components/schemas/ErrorBody"}
    for status in ("400", "404", "503"):
        assert responses[status]["content"]["application/json"]["schema"] == ref
    assert responses["503"]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    assert "ErrorBody" in doc["components"]["schemas"]

