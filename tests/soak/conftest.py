"""Soaks run only under ``make soak`` (QSTATE_SOAK=1): they take minutes by design and would
double ``make test``'s time (docs/architecture.md, "Where each test runs")."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("QSTATE_SOAK") == "1":
        return
    here = os.path.dirname(__file__)
    soaks = [i for i in items if str(i.path).startswith(here)]
    if soaks:
        items[:] = [i for i in items if i not in soaks]
        config.hook.pytest_deselected(items=soaks)
