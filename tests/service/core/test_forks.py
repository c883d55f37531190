"""Every qstate process tells gRPC it forks only to exec (qstate.core.process.forks)."""

from __future__ import annotations

import os
import sys

import pytest

from qstate.cli import main
from qstate.core.process.forks import FORK_SUPPORT, exec_only_forks


def test_the_command_line_turns_grpc_fork_handlers_off_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FORK_SUPPORT, raising=False)
    monkeypatch.setattr(sys, "argv", ["qstate", "--help"])
    with pytest.raises(SystemExit):
        main()
    assert os.environ[FORK_SUPPORT] == "false"


def test_a_value_the_environment_sets_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORK_SUPPORT, "true")
    exec_only_forks()
    assert os.environ[FORK_SUPPORT] == "true"
