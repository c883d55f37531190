"""Fuzz a running router from outside: schemathesis generates requests from the router's own
OpenAPI document and every answer is checked against it.

    python -m loadtest.fuzz --url http://127.0.0.1:8000 --max 10000 --seed 1

Requests are drawn from every operation, valid ones (positive: they fit the documented
schema) and invalid ones (negative: they break it), some of them aimed at the jobs the
router serves (names read from /v1/jobs, keys from ``--key``) so they get past the 404 of an
unknown job. Each answer must: not be a 5xx, have a documented status code, content type
and headers, and a body that fits the schema of its status. Appends the tally (requests by
operation and status, 5xx, schema violations, the command) to ``--out``. Exit code 1 when
any 5xx or violation was found.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import requests
import schemathesis
import typer
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from loadtest import results
from qstate.core.answer import WatchEvent
from qstate.core.config import settings as qstate_settings

__all__ = ["CHECKS", "FuzzReport", "fuzz", "main"]

log = logging.getLogger(__name__)
console = Console()

RESULTS = Path("loadtest/results/fuzz.md")
# what every answer must satisfy (schemathesis' names): no 5xx, and the status, content
# type, headers and body its operation documents
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]
EXAMPLES_KEPT = 20  # violations quoted in the report (all are counted)
WATCH = "/v1/watch/"  # a stream that stays open: its first event is read, then it is closed


def _first_event_problem(response: requests.Response) -> str | None:
    """What is wrong with a watch stream's first event (None: it is a WatchEvent, at once)."""
    event: dict[str, str] = {}
    for chunk in response.iter_lines(decode_unicode=True):
        raw = chunk if isinstance(chunk, str) else chunk.decode()
        if raw.startswith(":"):
            continue
        if not raw:
            break
        name, _, value = raw.partition(":")
        event[name] = value.removeprefix(" ")
    if "data" not in event:
        return f"no event in the stream: {event}"
    try:
        ev = WatchEvent.model_validate_json(event["data"])
    except ValueError as exc:
        return f"the first event is no WatchEvent: {str(exc)[:200]}"
    if event.get("id") != str(ev.batch):
        return f"the event's id {event.get('id')!r} is not its batch {ev.batch}"
    return None


@dataclass
class FuzzReport:
    requests: int = 0
    by_status: collections.Counter[tuple[str, int]] = field(
        default_factory=collections.Counter)  # (operation, status) -> requests
    server_errors: int = 0
    violations: int = 0  # answers that broke a check (5xx included)
    examples: list[str] = field(default_factory=list)  # the first few, one line each
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.requests > 0 and self.violations == 0


def _known_targets(url: str, client: httpx.Client) -> list[dict[str, str]]:
    """Path parameters that name what the router serves: each job's operators' states."""
    out = []
    for job in client.get(f"{url}/v1/jobs").raise_for_status().json()["jobs"]:
        info = client.get(f"{url}/v1/jobs/{job['name']}").raise_for_status().json()
        for op in info["operators"]:
            out += [{"job": job["name"], "operator": op["name"], "state": s["name"]}
                    for s in op["states"]]
    return out


def _strategy(schema: Any, targets: list[dict[str, str]], keys: list[str]
              ) -> st.SearchStrategy[Case]:
    """Every operation, valid and invalid requests, and valid ones aimed at real targets."""
    strategies = []
    for result in schema.get_all_operations():
        op = result.ok()
        strategies.append(op.as_strategy(generation_mode=GenerationMode.POSITIVE))
        if op.path_parameters or op.query or op.body:  # nothing to break without them
            strategies.append(op.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        names = [n for n in ("job", "operator", "state") if f"{{{n}}}" in op.path]
        for t in targets[:3] if names else ():
            fixed = {n: t[n] for n in names}
            strategies.append(op.as_strategy(generation_mode=GenerationMode.POSITIVE,
                                             path_parameters=fixed))
            for k in keys[:5] if "{key}" in op.path else ():
                strategies.append(op.as_strategy(generation_mode=GenerationMode.POSITIVE,
                                                 path_parameters={**fixed, "key": k}))
            # a watch names its keys (or a top n) in the query, one of the two: requests
            # that do, or generated ones would rarely get past its 400
            query = {q.name for q in op.query}
            for fixed_query in ([{"key": [k]} for k in keys[:3]] if "key" in query else []) + (
                    [{"top": 3}] if "top" in query else []):
                strategies.append(op.as_strategy(generation_mode=GenerationMode.POSITIVE,
                                                 path_parameters=fixed, query=fixed_query))
    return st.one_of(strategies)


def fuzz(url: str, max_requests: int, seed_value: int = 1, keys: list[str] | None = None,
         token: str = "", ca: str = "",
         on_request: Callable[[FuzzReport], None] | None = None) -> FuzzReport:
    """Up to ``max_requests`` generated requests to the router at ``url`` (same seed, same
    requests), every answer checked (``CHECKS``)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    verify: str | bool = ca or True
    with httpx.Client(timeout=30, headers=headers, verify=verify) as client:
        targets = _known_targets(url, client)
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers,
                                           verify=verify, timeout=30)
    report = FuzzReport()
    session = requests.Session()
    session.headers.update(headers)
    session.verify = verify

    @seed(seed_value)
    @settings(max_examples=max_requests, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(_strategy(schema, targets, keys or []))
    def one(case: Case) -> None:
        if case.operation.path.startswith(WATCH):
            # a stream: read its first event, then close it; an error answer is finite and
            # is asked again below through schemathesis, which checks it like any other
            kw = case.as_transport_kwargs(base_url=url)
            with session.request(**kw, stream=True, timeout=30) as streamed:
                if streamed.status_code == 200:
                    problem = _first_event_problem(streamed)
                    report.requests += 1
                    report.by_status[(case.operation.label, 200)] += 1
                    if problem is not None:
                        report.violations += 1
                        if len(report.examples) < EXAMPLES_KEPT:
                            report.examples.append(f"{case.operation.label} -> 200: {problem}")
                    if on_request is not None:
                        on_request(report)
                    return
        response = case.call(base_url=url, session=session, timeout=30)
        report.requests += 1
        report.by_status[(case.operation.label, response.status_code)] += 1
        # a read for a batch the state has not reached is a documented 503 (min_batch), not
        # a server error; its answer is still checked against the document
        awaited = response.status_code == 503 and "min_batch" in (case.query or {})
        if response.status_code >= 500 and not awaited:
            report.server_errors += 1
        try:
            case.validate_response(response, checks=[c for c in CHECKS if not (
                awaited and c is not_a_server_error)])
        except AssertionError as exc:  # schemathesis' failures are AssertionErrors
            report.violations += 1
            if len(report.examples) < EXAMPLES_KEPT:
                first = str(exc).strip().splitlines()
                report.examples.append(f"{case.operation.label} -> {response.status_code}: "
                                       f"{' '.join(first[:3])[:300]}")
        if on_request is not None:
            on_request(report)

    t0 = time.perf_counter()
    one()
    report.seconds = time.perf_counter() - t0
    return report


def write_results(report: FuzzReport, url: str, seed_value: int, out: Path,
                  command: str) -> None:
    rows = ["| operation | status | requests |", "| --- | --- | --- |"]
    rows += [f"| `{op}` | {status} | {n:,} |"
             for (op, status), n in sorted(report.by_status.items())]
    found = [f"- {e}" for e in report.examples] or ["- none"]
    results.append(out, "\n".join([
        f"## Fuzz run, {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"`{command}`",
        "",
        f"schemathesis {schemathesis.__version__} against {url} (its /openapi.json), seed "
        f"{seed_value}: **{report.requests:,} requests** in {report.seconds:.0f} s, "
        f"**{report.server_errors} answered 5xx**, **{report.violations} broke the "
        "documented schema** (status code, content type, headers or body).",
        "",
        *rows,
        "",
        "Violations (the first few):",
        "",
        *found,
        "",
    ]))


def main(
    url: Annotated[str, typer.Option(help="The router to fuzz (its HTTP base URL). Default: "
                                     "QSTATE_ROUTER_URL.")] = "",
    max_requests: Annotated[int, typer.Option("--max", min=1,
                                              help="Requests to generate.")] = 10_000,
    seed_value: Annotated[int, typer.Option("--seed", help="Same seed, same requests.")] = 1,
    key: Annotated[list[str] | None, typer.Option(
        help="A key the router has data for (repeat): some requests ask for it, so they "
             "reach the shards, not only a 404.")] = None,
    token: Annotated[str, typer.Option(help="Client token to send. Default: QSTATE_TOKEN.",
                                       show_default=False)] = "",
    ca: Annotated[str, typer.Option(help="CA bundle of an HTTPS router. Default: "
                                    "QSTATE_TLS_CA.")] = "",
    out: Annotated[Path, typer.Option(help="Results file (appended to).")] = RESULTS,
) -> None:
    """Generate MAX requests from the running router's OpenAPI document and check every
    answer against it; exit 1 on any 5xx or schema violation."""
    logging.basicConfig(level=logging.WARNING)
    cfg = qstate_settings()
    url = (url or cfg.router_url).rstrip("/")
    command = results.command("loadtest.fuzz")
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("requests", total=max_requests)

        def tick(r: FuzzReport) -> None:
            progress.update(task, completed=r.requests,
                            description=f"requests (5xx {r.server_errors}, violations "
                                        f"{r.violations})")

        report = fuzz(url, max_requests, seed_value, key or [], token or cfg.token,
                      ca or cfg.tls_ca, tick)
    write_results(report, url, seed_value, out, command)
    raise typer.Exit(0 if report.ok else 1)


if __name__ == "__main__":
    typer.run(main)
