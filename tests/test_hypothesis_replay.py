"""How the suite runs Hypothesis (tests/conftest.py, docs/architecture.md §9): with its example
database in use, so a failing example is saved and tried first by the next run, printed with a
``@reproduce_failure`` blob, and the report header says how to reproduce a run. Checked on a
deliberately failing property run by pytest under this conftest, in a folder of its own, with
and without ``CI`` in the environment (under ``CI`` Hypothesis loads its own ``ci`` profile, which
keeps no database: the suite's profile must not inherit it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# fails on most random inputs but not on the simple ones Hypothesis tries first (all zeros,
# all 0xff): the example that fails is a random one, which another run would not find again;
# not shrunk, so the one reported is the one found (or replayed). Each input tried is written
# down, in order: the last one of a run is the failure it reported (run again to report it).
PROPERTY = '''
from hypothesis import Phase, given, settings, strategies as st


@settings(phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(st.binary(min_size=16, max_size=16))
def test_few_distinct_bytes(b):
    with open("inputs.txt", "a") as f:
        f.write(b.hex() + "\\n")
    assert len(set(b)) < 12
'''


# what Hypothesis takes for a CI service (hypothesis/_settings.py, _CI_VARS)
CI_VARS = ("CI", "__TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI", "bamboo.buildKey", "TF_BUILD",
           "BUILDKITE", "CIRCLECI", "CIRRUS_CI", "CODEBUILD_BUILD_ID", "GITHUB_ACTIONS",
           "GITLAB_CI", "HEROKU_TEST_RUN_ID", "TEAMCITY_VERSION")


def run_pytest(folder: Path, *args: str, ci: bool) -> tuple[int, str]:
    """pytest on ``folder``'s test file with tests/conftest.py as a plugin; its working
    folder (where .hypothesis/ goes) is ``folder``; ``ci``: with ``CI=true`` in its
    environment, else with none of the variables Hypothesis takes for a CI service. Of the
    installed plugins only Hypothesis' is loaded (the others take seconds to import)."""
    env = {k: v for k, v in os.environ.items() if k not in CI_VARS} | ({"CI": "true"} if ci else {})
    env |= {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hypothesispytest", "-p", "tests.conftest",
         "-p", "no:cacheprovider",
         "--rootdir", str(folder), "test_property.py", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def tried(folder: Path) -> list[str]:
    """The inputs the last run tried, in order (and forgets them)."""
    path = folder / "inputs.txt"
    lines = path.read_text().split()
    path.unlink()
    return lines


def saved(folder: Path) -> list[Path]:
    db = folder / ".hypothesis" / "examples"
    return [p for p in db.rglob("*") if p.is_file()] if db.exists() else []


@pytest.mark.parametrize("ci", [False, True], ids=["local", "ci"])
def test_a_failing_example_is_saved_printed_as_a_blob_and_replayed_first(
        tmp_path: Path, ci: bool) -> None:
    (tmp_path / "test_property.py").write_text(PROPERTY)
    # a seed given: the header says how to repeat the run; nothing is saved under a seed
    rc, out = run_pytest(tmp_path, "--hypothesis-seed=12345", ci=ci)
    assert rc == 1, out[-3000:]
    tried(tmp_path)
    assert "hypothesis seed 12345: --hypothesis-seed=12345 repeats this run's examples" in out
    assert saved(tmp_path) == []
    # no seed: the failure is saved in the example database and printed with its blob
    rc, out = run_pytest(tmp_path, ci=ci)
    assert rc == 1, out[-3000:]
    assert "hypothesis example database" in out and "tried first next run" in out, out[:500]
    assert re.search(r"@reproduce_failure\('[\d.]+', b'[^']+'\)", out), out[-3000:]
    failed = tried(tmp_path)[-1]
    assert len(set(bytes.fromhex(failed))) >= 12
    assert saved(tmp_path), "the failing example was not saved"
    # the next run tries the saved example first, and fails on it again
    rc, out = run_pytest(tmp_path, ci=ci)
    assert rc == 1, out[-3000:]
    assert tried(tmp_path)[0] == failed
