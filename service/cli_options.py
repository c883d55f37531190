"""CLI options that are settings: their help is the setting's description and their default
is the setting's effective value, so a flag wins over QSTATE_* variables, which win over the
config file (``qstate.core.config``), and ``--help`` shows what would be used."""

from __future__ import annotations

from typing import Any, Final

import typer

from qstate.core.config import Settings, settings

__all__ = ["S", "given", "option"]

S: Final[Settings] = settings()


def option(name: str, *decls: str, more: str = "", **kw: Any) -> Any:
    """A typer option for the setting ``name`` (default: ``S.<name>``); ``more``: what the
    command adds to the setting's description."""
    # envvar too: read at invocation, so an in-process caller that sets the variable after
    # import (a test, an embedding program) is heard as a shell would be.
    return typer.Option(*decls, help=" ".join(filter(None, [
        Settings.model_fields[name].description, more])),
        envvar=f"QSTATE_{name.upper()}", show_envvar=True, **kw)


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the user set the setting ``name`` of this command (its flag, QSTATE_<NAME> or
    the config file) rather than leaving it at its built-in default."""
    # by name: typer carries its own copy of click, whose enum is not click's
    source = ctx.get_parameter_source(name)
    return (source is not None and source.name != "DEFAULT") or name in S.model_fields_set
