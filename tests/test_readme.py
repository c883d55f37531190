"""README's settings table is the settings: every field, its variable and its default."""

from __future__ import annotations

import re
from pathlib import Path

from service.core.config import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def shown(value: object) -> str:
    return "(empty)" if value == "" else str(value).lower() if isinstance(value, bool) \
        else str(value)


def test_every_setting_is_in_the_table_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `QSTATE_([A-Z0-9_]+)` \| `([^`]*)` \|", README, re.M))
    want = {name.upper(): shown(f.default) for name, f in Settings.model_fields.items()}
    assert rows == want
