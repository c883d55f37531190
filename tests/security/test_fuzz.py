"""Tried from outside: schemathesis generates requests from the running router's OpenAPI
document (a fixed seed, a few hundred requests) and every answer must be no 5xx and match
what the document says of its operation. The document states the real constraints, so
generated requests get past validation; and the bugs earlier fuzzing found stay fixed."""

from __future__ import annotations

import re
import string
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest.fuzz import fuzz
from qstate._engine import parse_time
from qstate.core.address import MAX_KEY_BYTES, NAME_PATTERN, check_key, check_name
from qstate.core.config import DEFAULTS
from qstate.core.errors import InvalidAddress, InvalidRequest
from qstate.router.http.params import TIME_PATTERN
from tests.shop import KEYS, ROUTES, SPEC, Shop

pytestmark = pytest.mark.security

STATE = "/v1/state/{job}/{operator}/{state}/{key}"
BATCH = "/v1/state/{job}/{operator}/{state}:batchGet"
SERIES = "/v1/series/{job}/{operator}/{state}/{key}"
JOB = "/v1/jobs/{job}"
TOP = "/v1/top/{job}/{operator}/{state}"
WATCH = "/v1/watch/{job}/{operator}/{state}"
READS = (("get", STATE), ("post", BATCH), ("get", SERIES))
REQUESTS = 400


@pytest.fixture(scope="module")
def doc(shop: Shop) -> dict[str, Any]:
    return dict(httpx.get(f"{shop.routers['grpc'].url}/openapi.json", timeout=10).json())


def _params(doc: dict[str, Any], method: str, path: str) -> dict[str, dict[str, Any]]:
    return {p["name"]: p["schema"] for p in doc["paths"][path][method]["parameters"]}


@pytest.mark.parametrize("route", ROUTES)
def test_generated_requests_get_no_5xx_and_documented_answers(shop: Shop, route: str) -> None:
    report = fuzz(shop.routers[route].url, REQUESTS, seed_value=12,
                  keys=[KEYS[0], KEYS[-1], "ünï/cødé key"])
    assert report.requests >= REQUESTS * 3 // 4, report
    assert report.server_errors == 0, report.examples
    assert report.violations == 0, "\n".join(report.examples)
    # the requests reached the state, not only validation: answers of each kind
    ok = {op for (op, status), _ in report.by_status.items() if status == 200}
    assert {"GET " + STATE, "POST " + BATCH, "GET " + SERIES, "GET " + TOP,
            "GET " + WATCH} <= ok, \
        report.by_status
    refused = {status for (_, status), _ in report.by_status.items()}
    assert {400, 404} <= refused, report.by_status


def test_names_keys_and_limits_are_documented_as_enforced(doc: dict[str, Any]) -> None:
    for method, path in (*READS, ("get", JOB), ("get", TOP)):
        params = _params(doc, method, path)
        for name in ("job", "operator", "state"):
            if name in params:
                assert params[name]["pattern"] == NAME_PATTERN
                assert NAME_PATTERN.startswith("^") and NAME_PATTERN.endswith("$")
    for method, path in READS:
        params = _params(doc, method, path)
        if "key" in params:
            assert (params["key"]["minLength"], params["key"]["maxLength"]) == (1, MAX_KEY_BYTES)
        assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (
            1, DEFAULTS.max_windows)
        for t in ("from", "to"):
            assert params[t] == {**params[t], "type": "string", "pattern": TIME_PATTERN}
    top = _params(doc, "get", TOP)
    assert (top["n"]["minimum"], top["n"]["maximum"]) == (1, DEFAULTS.max_top_n)
    assert top["order"]["enum"] == ["desc", "asc"]
    assert top["window"]["pattern"] == f"^(?:current|{TIME_PATTERN[1:-1]})$"
    body = doc["components"]["schemas"]["BatchGetIn"]["properties"]["keys"]
    assert body["maxItems"] == DEFAULTS.max_batch_keys
    assert (body["items"]["minLength"], body["items"]["maxLength"]) == (1, MAX_KEY_BYTES)


def test_every_error_of_a_read_is_documented_with_the_error_body(doc: dict[str, Any]) -> None:
    for method, path in (*READS, ("get", TOP)):
        responses = doc["paths"][path][method]["responses"]
        want = {"400", "401", "403", "404", "429", "503"} | ({"413"} if method == "post" else set())
        assert want <= set(responses), (path, sorted(responses))
        for status in want:
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, status)
        for status in ("429", "503"):
            assert "Retry-After" in responses[status]["headers"]
    assert "Next-From" in doc["paths"][SERIES]["get"]["responses"]["200"]["headers"]


@given(st.from_regex(TIME_PATTERN, fullmatch=True))
def test_every_time_the_document_allows_parses_or_is_a_clear_400(value: str) -> None:
    try:
        parse_time("from", value)
    except InvalidRequest as exc:  # an ISO date that does not exist, e.g. 2026-02-30
        assert re.fullmatch(r"[0-9-]+(T.*)?", value.strip(" \t\n\x0b\x0c\r")), value
        assert "'from' must be" in exc.message


@given(st.text(max_size=40))
def test_any_text_parses_as_a_time_or_is_a_clear_400(value: str) -> None:
    try:
        parse_time("to", value)
    except InvalidRequest as exc:
        assert "'to' must be" in exc.message


_NAME_CHARS = string.ascii_letters + string.digits + "_.-"


def documented_name(name: str) -> bool:
    """The rule as docs/architecture.md §2 and the 400's message word it, written apart from
    the pattern the code checks with."""
    return 1 <= len(name) <= 64 and all(c in _NAME_CHARS for c in name) and name[0] not in ".-"


@given(st.one_of(st.text(st.sampled_from([*_NAME_CHARS, "/", " ", "é", "\n", "\x00"]),
                         max_size=70),
                 st.text(max_size=70), st.from_regex(NAME_PATTERN, fullmatch=True)))
def test_a_name_is_accepted_exactly_when_the_documented_rule_allows_it(name: str) -> None:
    try:
        accepted = check_name("job", name) == name
    except InvalidAddress:
        accepted = False
    assert accepted == documented_name(name)


@pytest.mark.parametrize("route", ROUTES)
def test_what_fuzzing_found_stays_fixed(shop: Shop, route: str) -> None:
    url = shop.routers[route].url
    state = f"{url}/v1/state/{SPEC.job}/{SPEC.operator}/views"
    with httpx.Client(timeout=10) as c:
        cases = {
            # a JSON body that is not UTF-8 once answered {"detail": ...} without "error"
            "non-UTF-8 body": c.post(f"{state}:batchGet", content=b'\xff\xfe{"keys": []}',
                                     headers={"content-type": "application/json"}),
            # these were 500s
            "5000-digit time": c.get(f"{state}/{KEYS[0]}", params={"from": "1" * 5000}),
            "lone surrogate key": c.post(f"{state}:batchGet",
                                         content=b'{"keys": ["\\ud800"]}',
                                         headers={"content-type": "application/json"}),
            "empty key": c.post(f"{state}:batchGet", json={"keys": [""]}),
            "no such route": c.get(f"{url}/v2/nothing"),
            "wrong method": c.put(f"{state}/{KEYS[0]}"),
            "not a JSON object": c.post(f"{state}:batchGet", json=["k"]),
            "not JSON": c.post(f"{state}:batchGet", content=b"keys=k",
                               headers={"content-type": "application/x-www-form-urlencoded"}),
        }
    for what, r in cases.items():
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
        body = r.json()
        assert isinstance(body.get("error"), str) and body.get("message"), (what, body)
        assert r.headers["content-type"] == "application/json", what
    assert cases["no such route"].status_code == 404
    assert cases["wrong method"].status_code == 405


def test_address_checks_refuse_what_http_cannot_carry() -> None:
    with pytest.raises(InvalidAddress, match="empty key"):
        check_key("")
    with pytest.raises(InvalidAddress, match="surrogate"):
        check_key("a\ud800")
