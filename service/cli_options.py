"""CLI options that are settings: their help is the setting's description and their default
is the setting's effective value, so a flag wins over QSTATE_* variables, which win over the
config file (``qstate.core.config``), and ``--help`` shows what would be used."""

from __future__ import annotations

from typing import Any, Final

import typer

from qstate.core.config import Settings, settings

__all__ = ["S", "option"]

S: Final[Settings] = settings()


def option(name: str, *decls: str, **kw: Any) -> Any:
    """A typer option for the setting ``name`` (default: ``S.<name>``)."""
    # envvar too: read at invocation, so an in-process caller that sets the variable after
    # import (a test, an embedding program) is heard as a shell would be.
    return typer.Option(*decls, help=Settings.model_fields[name].description,
                        envvar=f"QSTATE_{name.upper()}", show_envvar=True, **kw)
