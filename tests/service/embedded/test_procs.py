"""What a child qstate starts inherits (service/embedded/procs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qstate.embedded.procs import NOT_INHERITED, Child

SHOW = "import os; print(sorted((k, os.environ[k]) for k in os.environ if 'PROMETHEUS' in k))"


@pytest.mark.parametrize("given", [False, True])
def test_a_child_never_inherits_a_prometheus_multiprocess_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: bool) -> None:
    """Importing Feast sets PROMETHEUS_MULTIPROC_DIR in the importing process; a router it
    then started summed every router's series written there into its own /metrics (seen in
    the suite: a router that never read locally reporting local reads)."""
    for name in NOT_INHERITED:
        monkeypatch.setenv(name, str(tmp_path / "feast_metrics"))
    env = {"PATH": "/usr/bin", NOT_INHERITED[0]: "/elsewhere", "QSTATE_X": "1"} if given \
        else None
    child = Child("show", [sys.executable, "-c", SHOW], tmp_path / "show.log", env).start()
    assert child.proc is not None and child.proc.wait(30) == 0
    assert (tmp_path / "show.log").read_text().strip() == "[]"
