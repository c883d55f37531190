"""The live page at /ui in headless Chromium (the Debian package, driven by Playwright: no
browser is downloaded), over a shop deployment of its own that the test keeps committing to.

While batches commit, the value the page shows for a key is the ground truth of the batch it
says it is as of, and it reaches the newest batch without a reload; the cluster and jobs
views follow too. The leaderboard is pushed: one watch stream (``/v1/watch/...?top=10``,
Server-Sent Events read through fetch) per state looked up, never a poll of ``/v1/top``, and
the router counts it open while the page is. Nothing the page loads comes from anywhere but
the router. A screenshot is written to the test's tmp_path and to ``tests/artifacts/ui.png``
(ignored by git).
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from service.core.address import quoted
from tests.helpers import metric, wait_until
from tests.shop import (
    BATCHES,
    BIG,
    KEYS,
    MANY,
    SPEC,
    WINDOW,
    Shop,
    avg_ms,
    start_shop,
    views,
)

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
LAST = BATCHES - 1
TIMEOUT_MS = 20_000  # the page polls every 1.5 s; a commit of the shop's 6,200 keys is quick
WATCHERS = "qstate_router_watchers"
SLASHED = "ünï/cødé key"  # non-ASCII and a '/' in a key: encoded by the page, decoded back


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    """A shop of its own: these tests commit batches the session's shop must not see."""
    s = start_shop(tmp_path_factory.mktemp("ui-shop"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("headless Chromium is needed for the /ui test: apt-get install chromium "
                    "(.ci/run installs it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True)
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page on /ui, with every request it made and every script error it hit."""

    def __init__(self, browser: Browser, url: str) -> None:
        self.page: Page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text)
                     if m.type == "error" else None)
        response = self.page.goto(f"{url}/ui")
        assert response is not None and response.status == 200
        assert self.page.url == f"{url}/ui/"

    def choose(self, job: str, operator: str, state: str, key: str) -> None:
        p = self.page
        for select, value in (("#job", job), ("#operator", operator), ("#state", state)):
            # the options come from the first poll of /v1/jobs
            expect(p.locator(f"{select} option[value='{value}']")).to_have_count(1)
            p.select_option(select, value)
        p.fill("#key", key)

    def shown(self) -> dict[str, Any]:
        """Value and batch read in one go: the page sets them in the same task."""
        return dict(self.page.evaluate(
            "() => ({value: document.getElementById('value').textContent,"
            " batch: document.getElementById('batch').textContent})"))

    def board(self) -> dict[str, Any]:
        """The leaderboard's summary and rows, read in one go (drawn in the same task)."""
        return dict(self.page.evaluate(
            "() => ({summary: document.getElementById('top-summary').textContent,"
            " rows: Array.from(document.querySelectorAll('#board tbody tr'),"
            " tr => [tr.children[1].textContent, tr.children[2].textContent])})"))

    def paths(self, prefix: str) -> list[str]:
        """The API requests the page made under ``prefix`` (path and query)."""
        return [r.split("/v1/", 1)[1] for r in self.requests if f"/v1/{prefix}" in r]

    def close(self) -> None:
        self.page.close()


def top_watchers(url: str) -> float:
    """Board watches open on the router at ``url`` over HTTP (SSE), as its metric says."""
    return metric(url, WATCHERS, form="top", protocol="http")


def board_of(batch: int) -> list[str]:
    """The ten largest views of ``batch``'s window, ties by key: the ground truth."""
    return sorted(KEYS + MANY, key=lambda k: (-views(k, batch), k))[:10]


def expect_key(w: Watched, key: str, batch: int) -> None:
    p = w.page
    expect(p.locator("#batch")).to_have_text(str(batch), timeout=TIMEOUT_MS)
    expect(p.locator("#value")).to_have_text(str(views(key, batch)), timeout=TIMEOUT_MS)
    start = batch * WINDOW
    expect(p.locator("#window")).to_have_text(
        f"[{iso(start)}, {iso(start + WINDOW)})", timeout=TIMEOUT_MS)
    # recent windows, newest first: every batch committed so far, at most ten
    newest = list(range(batch, max(-1, batch - 10), -1))
    expect(p.locator("#windows tbody td:nth-child(3)")).to_have_text(
        [str(views(key, b)) for b in newest], timeout=TIMEOUT_MS)


def iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# a headless Chromium over a shop of its own: `make soak` (CI; docs/architecture.md §9)
@pytest.mark.long
def test_the_page_shows_ground_truth_while_batches_commit(live: Shop, browser: Browser,
                                                          tmp_path: Path) -> None:
    url = live.routers["local"].url
    w = Watched(browser, url)
    try:
        for key in (KEYS[0], SLASHED, BIG):  # BIG: a count past 2**53, every digit exact
            w.choose(SPEC.job, SPEC.operator, "views", key)
            expect_key(w, key, LAST)
        key = KEYS[7]
        w.choose(SPEC.job, SPEC.operator, "views", key)
        expect_key(w, key, LAST)
        w.page.evaluate("() => { window.__sameDocument = true; }")  # gone if it reloads

        # the leaderboard of the selected state comes from one watch stream, opened once
        # (the same state looked up again keeps it), never from polling /v1/top
        wait_until(lambda: top_watchers(url) == 1, 20, "the page's board watch open")
        expect(w.page.locator("#board tbody td:nth-child(2)")).to_have_text(
            board_of(LAST), timeout=TIMEOUT_MS)
        expect(w.page.locator("#top-summary")).to_contain_text(f"batch {LAST}")

        # events flow: batches commit while the page polls and the board is pushed; every
        # (batch, value) it shows is the truth of that batch, and every board row is the
        # truth of the window the board shows
        more = range(LAST + 1, LAST + 6)

        def commit_more() -> None:
            for b in more:
                live.commit(b)

        committer = threading.Thread(target=commit_more)
        committer.start()
        samples, boards = [], []
        while committer.is_alive():
            samples.append(w.shown())
            boards.append(w.board())
            w.page.wait_for_timeout(100)  # sampling what the page shows, not waiting on it
        committer.join()
        newest = more[-1]
        expect_key(w, key, newest)
        expect(w.page.locator("#top-summary")).to_contain_text(f"batch {newest}",
                                                               timeout=TIMEOUT_MS)
        samples.append(w.shown())
        boards.append(w.board())
        for s in samples:
            assert s["value"] == str(views(key, int(s["batch"]))), s
        shown_windows = []
        for b in boards:
            # mid-commit a board may lack the partitions still a batch behind, never hold a
            # value that is not its window's
            at = [x for x in range(newest + 1) if f"window [{iso(x * WINDOW)}," in b["summary"]]
            assert len(at) == 1, b
            shown_windows.append(at[0])
            assert all(v == str(views(k, at[0])) for k, v in b["rows"]), b
            keys = [k for k, _ in b["rows"]]
            assert keys == sorted(keys, key=lambda k: (-views(k, at[0]), k)), b
        assert shown_windows == sorted(shown_windows), shown_windows  # never back in time
        assert shown_windows[-1] == newest
        assert w.paths("watch/") == [
            f"watch/{SPEC.job}/{SPEC.operator}/views?top=10&order=desc"], w.paths("watch/")
        assert top_watchers(url) == 1
        assert w.page.evaluate("() => window.__sameDocument") is True

        # the cluster view: both shards up, every partition ready at the newest batch
        expect(w.page.locator("#shards .shard")).to_have_count(2)
        expect(w.page.locator("#shards .pill")).to_have_text(["up", "up"])
        expect(w.page.locator("#shards tbody td:nth-child(3)")).to_have_text(
            ["ready"] * SPEC.partitions, timeout=TIMEOUT_MS)
        expect(w.page.locator("#shards tbody td:nth-child(4)")).to_have_text(
            [str(newest)] * SPEC.partitions, timeout=TIMEOUT_MS)
        # replicas=1: each partition's one row is its owner's; no copies on followers
        expect(w.page.locator("#shards tbody td:nth-child(7)")).to_have_text(
            ["owner"] * SPEC.partitions)
        expect(w.page.locator("#cluster-summary")).not_to_contain_text("followers")
        # jobs, operators and states
        expect(w.page.locator("#jobs tbody tr")).to_have_count(1)
        expect(w.page.locator("#jobs tbody td")).to_have_text(
            [SPEC.job, SPEC.operator, SPEC.key, "views (long), avg_ms (double)",
             "tumbling 60 s", f"{SPEC.partitions} / {SPEC.partitions}", str(newest),
             re.compile(re.escape(iso(newest * WINDOW)) + r" \(.+ ago\)")],
            timeout=TIMEOUT_MS)

        # the leaderboard of the selected state: the ten largest of the newest window, ties
        # by key, as the shop wrote them; the chart: one bar per recent window, the
        # tallest the largest value
        board = board_of(newest)
        expect(w.page.locator("#board tbody td:nth-child(2)")).to_have_text(
            board, timeout=TIMEOUT_MS)
        expect(w.page.locator("#board tbody td:nth-child(3)")).to_have_text(
            [str(views(k, newest)) for k in board])
        expect(w.page.locator("#top-summary")).to_contain_text(f"batch {newest}")
        shown = range(max(0, newest - 9), newest + 1)  # oldest first, at most ten
        expect(w.page.locator("#chart rect")).to_have_count(len(shown))
        heights = w.page.evaluate("() => Array.from(document.querySelectorAll('#chart rect'),"
                                  " r => Number(r.getAttribute('height')))")
        values = [views(key, b) for b in shown]
        assert heights.index(max(heights)) == values.index(max(values)), (heights, values)
        assert heights == [pytest.approx(max(1, v / max(values) * 110)) for v in values]
        w.page.locator("#board tbody a").first.click()  # a key on the board, looked up
        expect(w.page.locator("#key")).to_have_value(board[0])
        expect(w.page.locator("#value")).to_have_text(str(views(board[0], newest)),
                                                      timeout=TIMEOUT_MS)

        shot = tmp_path / "ui.png"
        w.page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(shot, ARTIFACTS / "ui.png")

        # another state looked up: its board's stream replaces the first (aborted: the
        # router counts one board watch, not two); every key averages the same, ties by key
        w.choose(SPEC.job, SPEC.operator, "avg_ms", board[0])
        ties = sorted(KEYS + MANY)[:10]
        expect(w.page.locator("#board tbody td:nth-child(2)")).to_have_text(
            ties, timeout=TIMEOUT_MS)
        expect(w.page.locator("#board tbody td:nth-child(3)")).to_have_text(
            [str(avg_ms(newest))] * 10)
        expect(w.page.locator("#top-summary")).to_contain_text(
            f"{SPEC.job}/{SPEC.operator}/avg_ms · window [{iso(newest * WINDOW)},")
        assert w.paths("watch/") == [
            f"watch/{SPEC.job}/{SPEC.operator}/{state}?top=10&order=desc"
            for state in ("views", "avg_ms")], w.paths("watch/")
        wait_until(lambda: top_watchers(url) == 1, 10, "the first board watch closed")

        assert w.errors == []
        outside = [r for r in w.requests if not r.startswith(f"{url}/")]
        assert outside == [], f"the page loaded from elsewhere: {outside}"
        assert {r.split("?")[0].removeprefix(url) for r in w.requests} >= {
            "/ui/", "/ui/style.css", "/ui/app.js", "/v1/jobs", "/v1/cluster"}
        assert w.paths("top/") == [], "the board is pushed, not polled"
    finally:
        w.close()
    # the page gone, its stream is too
    wait_until(lambda: top_watchers(url) == 0, 10, "the board watch closed with the page")


# a headless Chromium over a shop of its own: `make soak` (CI; docs/architecture.md §9)
@pytest.mark.long
def test_what_the_page_shows_is_text_never_markup(live: Shop, browser: Browser) -> None:
    w = Watched(browser, live.routers["local"].url)
    try:
        key = '<img src=x onerror="window.__injected = 1">'
        w.choose(SPEC.job, SPEC.operator, "views", key)
        # the router's 404 names the key (JSON-quoted: docs/querying.md); the page shows
        # that message as text
        expect(w.page.locator("#message")).to_contain_text(
            f"key {quoted(key, 200)} has no data", timeout=TIMEOUT_MS)
        expect(w.page.locator("#value")).to_have_text("—")
        assert w.page.locator("#answer img").count() == 0
        assert w.page.evaluate("() => window.__injected") is None
        assert w.errors == [] or all("404" in e for e in w.errors), w.errors
    finally:
        w.close()


# a headless Chromium over a shop of its own: `make soak` (CI; docs/architecture.md §9)
@pytest.mark.long
def test_a_key_as_of_a_savepoint_beside_the_live_state(live: Shop, browser: Browser) -> None:
    """A savepoint typed in: the key and the leaderboard as of its batch (503s while its
    partitions open, then the answers); emptied: live again. The fragment keeps it, so the
    view can be shared."""
    from qstate.core.records.savepoint import create

    saved = create(live.storage, SPEC.job, "ui-before").batch
    live.commit(saved + 1)
    w = Watched(browser, live.routers["local"].url)
    try:
        key = KEYS[4]
        w.choose(SPEC.job, SPEC.operator, "views", key)
        expect_key(w, key, saved + 1)
        w.page.fill("#savepoint", "ui-before")
        expect(w.page.locator("#batch")).to_have_text(str(saved), timeout=TIMEOUT_MS)
        expect(w.page.locator("#value")).to_have_text(str(views(key, saved)),
                                                      timeout=TIMEOUT_MS)
        assert "savepoint=ui-before" in w.page.url
        assert any("savepoint=ui-before" in p for p in w.paths("state/"))
        # the leaderboard too: the savepoint's top of its current window, asked once
        expect(w.page.locator("#top-summary")).to_contain_text(
            f"batch {saved} · savepoint ui-before", timeout=TIMEOUT_MS)
        expect(w.page.locator("#board tbody td:nth-child(2)")).to_have_text(
            board_of(saved), timeout=TIMEOUT_MS)
        assert any("savepoint=ui-before" in p for p in w.paths("top/"))
        w.page.fill("#savepoint", "")
        expect_key(w, key, saved + 1)
        expect(w.page.locator("#board tbody td:nth-child(2)")).to_have_text(
            board_of(saved + 1), timeout=TIMEOUT_MS)  # live again
        assert w.errors == [] or all("503" in e for e in w.errors), w.errors
    finally:
        w.close()
