"""The rules written in both languages, held to the committed vectors of this folder
(``generate.py`` says how they were made; ``cargo test`` reads the same files:
``engine/core/src/vectors.rs``). Each test here is the Python half: the partition function and
the name and key rules the jobs and shards check (``qstate.core.address``), the OpenAPI
document's time pattern, orjson's forms of the answers Python writes, the error classes and
their bodies, the value layout as the shard writes and reads it, the settings' defaults."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from qstate._engine import parse_time
from qstate.core.address import check_key, check_name, partition_of
from qstate.core.config import DEFAULTS, ENGINE_SETTINGS
from qstate.core.errors import InvalidRequest, QStateError, error_classes
from qstate.core.records.operator import OperatorSpec
from qstate.partition.codec import Codec
from qstate.router.http.params import TIME_PATTERN

HERE = Path(__file__).parent


def load(name: str) -> Any:
    return json.loads((HERE / name).read_text())


def text(v: Any) -> str:
    if isinstance(v, str):
        return v
    return str(v["repeat"] * v["times"] + v.get("then", ""))


def refusal(check: Any, *args: str) -> str | None:
    try:
        check(*args)
    except QStateError as exc:
        return exc.message
    return None


def test_partitions_names_and_keys() -> None:
    v = load("address.json")
    for case in v["partitions"]:
        assert partition_of(text(case["key"]), case["partitions"]) == case["partition"], case
    for case in v["names"]:
        assert refusal(check_name, "job", text(case["value"])) == case["message"], case
    for case in v["keys"]:
        key = text(case["value"])
        assert len(key.encode()) == case["bytes"]
        assert refusal(check_key, key) == case["message"], case


def test_the_documented_time_pattern_admits_every_time_the_core_reads() -> None:
    """The OpenAPI pattern is a superset of what the read core parses (it cannot tell a
    February 30th): every time read matches it, and every string it refuses is refused."""
    v = load("times.json")
    pattern = re.compile(TIME_PATTERN)
    for case in v["times"]:
        value, ms = case["value"], case["ms"]
        if ms is not None:
            assert pattern.fullmatch(value), value
        if not pattern.fullmatch(value):
            assert ms is None, value
        # the engine's parser, through its Python face
        try:
            got: int | None = parse_time("from", value, v["now_ms"])
        except InvalidRequest:
            got = None
        assert got == ms, value


def test_json_forms_as_orjson_writes_them() -> None:
    v = load("json.json")
    for case in v["doubles"]:
        d = struct.unpack(">d", bytes.fromhex(case["bits"]))[0]
        assert orjson.dumps(d).decode() == case["json"], case
    for case in v["strings"]:
        assert orjson.dumps(case["value"]).decode() == case["json"], case


def test_error_classes_and_bodies() -> None:
    v = load("errors.json")
    ours = {c.__name__: c for c in error_classes() if c.__module__ == "qstate.core.errors"}
    assert {c["class"] for c in v["classes"]} == set(ours)
    for c in v["classes"]:
        cls = ours[c["class"]]
        assert (cls.http_status, cls.grpc_code.name) == (c["http"], c["grpc"]), c
    for b in v["bodies"]:
        exc = ours[b["class"]](b["message"], **dict(b["detail"]))
        assert orjson.dumps(exc.body()).decode() == b["body"], b


def answer(v: Any) -> int | float | None:
    if v is None:
        return None
    if "i64" in v:
        return int(v["i64"])
    return float(struct.unpack(">d", bytes.fromhex(v["f64"]))[0])


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and
                                                                math.isnan(b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("case", load("values.json")["cases"], ids=lambda c: c["name"])
def test_the_value_layout_as_the_shard_writes_and_reads_it(case: dict[str, Any]) -> None:
    """Each stored value decodes to the answers the file says (one value, or a window's
    panes folded), and decoding then encoding gives back its bytes: the writer's layout."""
    spec = OperatorSpec.from_json(json.dumps(case["spec"]).encode())
    codec = Codec(spec)
    values = [bytes.fromhex(h) for h in case["values"]]
    if len(values) == 1 and not spec.panes:
        end, got = codec.answers_of(values[0])
        assert end == case["end"]
    else:
        recs, _, blobs = codec.decode(values)
        with np.errstate(all="ignore"):
            rec, rec_blobs = codec.fold(recs, blobs)
        got = codec.answers(rec, rec_blobs)
    want = [answer(a) for a in case["answers"]]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert same(g, w), (i, g, w)
    if all(len(v) >= codec.width for v in values):  # a short value is read, never written
        recs, _, blobs = codec.decode(values)
        assert codec.encode(recs, blobs) == values


def test_the_engines_settings_default_as_config_says() -> None:
    assert load("settings.json") == {name: getattr(DEFAULTS, name) for name in ENGINE_SETTINGS}
