"""The tree is the architecture (docs/architecture.md §1): the import contracts in
pyproject.toml hold, and no module imports itself through others (0 import circles, counting
imports made only for type checking)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests import mirror

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("qstate", "loadtest")
# the graph is drawn in a child process over the mirror tree: in this one, qstate is already
# imported from service/ alone, without qstate.jobs beside it
GRAPH = ("import grimp, json, sys; g = grimp.build_graph(*sys.argv[1:], cache_dir=None); "
         "print(json.dumps({m: sorted(g.find_modules_directly_imported_by(m)) "
         "for m in g.modules}))")


@pytest.fixture(scope="module")
def lint_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tree = mirror.build(tmp_path_factory.mktemp("mirror"))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}


def import_graph(env: dict[str, str]) -> grimp.ImportGraph:
    run = subprocess.run([sys.executable, "-c", GRAPH, *PACKAGES], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    graph = grimp.ImportGraph()
    for importer, imported in json.loads(run.stdout).items():
        graph.add_module(importer)
        for other in imported:
            graph.add_import(importer=importer, imported=other)
    return graph


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circles(lint_env: dict[str, str]) -> None:
    graph = import_graph(lint_env)
    assert "qstate.jobs.runtime.launch" in graph.modules  # the mirror shows qstate.jobs
    assert circles(graph) == []


def test_the_circle_finder_sees_a_circle() -> None:
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert circles(graph) == [["p.a", "p.b", "p.c"]]


def test_the_import_contracts_hold(lint_env: dict[str, str]) -> None:
    run = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
                         cwd=ROOT, env=lint_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
