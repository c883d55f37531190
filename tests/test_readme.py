"""README's settings table is the settings: every field, its variable, its default and its
description (``python -m qstate.core.config`` prints the table to paste)."""

from __future__ import annotations

from pathlib import Path

from qstate.core.config import settings_table

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_settings_table_is_in_the_readme() -> None:
    assert settings_table() in README
