"""docs/querying.md, run: every `bash` and `python` block of the page against a real router
(the shop deployment's, its names put where the page has the demo's), each checked for what
it should print. A page that drifts from the code fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clients.test_node_client import node  # noqa: F401 - a fixture
from tests.helpers import json_documents
from tests.shop import BATCHES, KEYS, MANY, SPEC, WINDOW, P, Shop, avg_ms, views, window

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "querying.md").read_text()
LAST = BATCHES - 1
BLOCKS = re.findall(r"```(bash|python)\n(.*?)```", PAGE, re.S)


def _as_shop(code: str, shop: Shop, node_path: str) -> str:
    router = shop.routers["local"]
    for demo, ours in [("http://127.0.0.1:8000", router.url),
                       ("127.0.0.1:50051", router.grpc_address),
                       ("node clients/node/query.mjs", f"{node_path} clients/node/query.mjs"),
                       ("per_tweet_1h", "views_1m"), ("impressions", "views"),
                       ("clicks", "avg_ms"),
                       ("tw-none", "never-written"), ("now-6h", "0")]:
        code = code.replace(demo, ours)
    code = re.sub(r"\btw-1\b", KEYS[3], re.sub(r"\btw-2\b", KEYS[4], code))
    return re.sub(r"\btweets\b", "shop", code)



def _run(kind: str, code: str, shop: Shop) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QSTATE_")}
    env["QSTATE_ROUTER_URL"] = shop.routers["local"].url
    args = ["bash", "-euo", "pipefail", "-c", code] if kind == "bash" else \
        [sys.executable, "-c", code]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_page_has_the_blocks_this_test_knows() -> None:
    assert [k for k, _ in BLOCKS] == ["bash", "bash", "bash", "python", "python", "python",
                                      "python", "bash"]


def _windows(key: str, batches: range) -> list[dict[str, int]]:
    """``key``'s windows as an answer lists them: the shop wrote one a batch (tests/shop.py)."""
    return [{"start": window(b)[0], "end": window(b)[1], "value": views(key, b)}
            for b in batches]


LATEST = range(LAST, BATCHES)


def _tour(out: str, top3: list[str]) -> None:
    """The curl tour's answers, each against what the shop wrote."""
    jobs, job, one, many, both, states, board, series = json_documents(out)
    assert jobs == {"jobs": [{"name": SPEC.job, "operators": [SPEC.operator]}]}
    [op] = job["operators"]
    assert (job["name"], op["name"], op["key"], op["window"]["kind"], op["window"]["size_ms"],
            op["partitions"], op["partitions_available"], op["last_batch"]) == (
        SPEC.job, SPEC.operator, SPEC.key, "tumbling", WINDOW, P, P, LAST)
    assert {s["name"]: s["type"] for s in op["states"]} == {
        name: a.type for name, a in SPEC.states.items()}
    assert (one["key"], one["batch"], one["windows"]) == (KEYS[3], LAST,
                                                          _windows(KEYS[3], LATEST))
    assert many["windows"] == _windows(KEYS[3], range(BATCHES))  # from 0 (the page: now-6h)
    assert [(a["key"], a["found"], a["windows"]) for a in both["results"]] == [
        (KEYS[3], True, _windows(KEYS[3], LATEST)), (KEYS[4], True, _windows(KEYS[4], LATEST)),
        ("never-written", False, [])]
    last = {"start": window(LAST)[0], "end": window(LAST)[1]}
    assert [(a["key"], a["state"], a["found"], a["batch"], a["windows"])
            for a in states["results"]] == [
        (KEYS[3], "views", True, LAST, _windows(KEYS[3], LATEST)),
        (KEYS[3], "avg_ms", True, LAST, [{**last, "value": avg_ms(LAST)}]),
        ("never-written", "views", False, LAST, []), ("never-written", "avg_ms", False, LAST, [])]
    assert board["window"] == last
    assert [(e["key"], e["value"]) for e in board["entries"]] == [
        (k, views(k, LAST)) for k in top3]
    assert series == [{"time": window(b)[0], "value": views(KEYS[3], b)}
                      for b in range(BATCHES)]


def _node(out: str, top3: list[str]) -> None:
    """The Node client's get and top (int64 fields as decimal strings)."""
    got, board = json_documents(out)
    assert (got["found"], got["batch"]) == (True, str(LAST))
    assert [(w["start_ms"], w["end_ms"], w["int_value"]) for w in got["windows"]] == [
        (str(w["start"]), str(w["end"]), str(w["value"])) for w in _windows(KEYS[3], LATEST)]
    assert [(e["key"], e["int_value"]) for e in board["entries"]] == [
        (k, str(views(k, LAST))) for k in top3]


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_every_block_runs_and_prints_what_it_says(i: int, shop: Shop, node: str) -> None:  # noqa: F811
    kind, code = BLOCKS[i]
    r = _run(kind, _as_shop(code, shop, node), shop)
    assert r.returncode == 0, (code, r.stdout, r.stderr)
    out = r.stdout
    top3 = sorted(KEYS + MANY, key=lambda k: (-views(k, LAST), k))[:3]
    if "/v1/jobs\n" in code:  # the curl tour
        _tour(out, top3)
    elif "tw-none\n" in code and kind == "bash":  # the error example
        body = json.loads(out)
        assert body["error"] == "NotFound" and body["batch"] == LAST
    elif "qstate get" in code:
        got, board, event = json_documents(out)
        assert got["windows"] == _windows(KEYS[3], LATEST)
        assert [(e["key"], e["value"]) for e in board["entries"]] == [
            (k, views(k, LAST)) for k in top3]
        assert event["snapshot"] and {c["key"]: c["windows"] for c in event["changes"]} == {
            k: _windows(k, LATEST) for k in (KEYS[3], KEYS[4])}
    elif "from qstate import Client" in code:
        assert out.splitlines() == [
            f"{views(KEYS[3], LAST)} views as of batch {LAST}",  # renamed too
            f"{KEYS[3]} True", "never-written False",
            str({"views": views(KEYS[3], LAST), "avg_ms": avg_ms(LAST)}),
            str([(k, views(k, LAST)) for k in top3]),
            f"{BATCHES} points",  # one a batch, from 0 (the page: now-6h)
            f"no data as of batch {LAST}"]
    elif "AsyncClient" in code:
        assert out.splitlines() == [f"{views(KEYS[3], LAST)} {views(KEYS[4], LAST)}",
                                    f"batch {LAST} {[(KEYS[3], views(KEYS[3], LAST))]}"]
    elif "ProtoReflectionDescriptorDatabase" in code:
        assert out.strip() == str(LAST)
    elif "QueryableStateStub" in code:
        assert out == f"True {LAST} {[(window(LAST)[0], views(KEYS[3], LAST))]}\n"
    else:
        _node(out, top3)
