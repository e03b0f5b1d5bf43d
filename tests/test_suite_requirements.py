"""scripts/test.sh requires PostgreSQL and the browser: their tests fail, with the reason, when either is missing,
unless DRAFTLAB_ALLOW_SKIP=1; plain pytest keeps skipping them. Checked on a throw-away suite that uses this
conftest with no PostgreSQL to be found and no chromium."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
import tests.conftest as base
from tests.conftest import *  # noqa: F401,F403 - the fixtures and the report hook under test

base.DEFAULT_TEST_POSTGRES = "postgresql://postgres@127.0.0.1:1/test"  # nothing listens there
base._start_temporary_postgres = lambda _base: (None, "no initdb/pg_ctl on PATH", lambda: None)
"""
TESTS = {
    "test_browser_e2e.py": (
        "import pytest\n"
        'pytestmark = pytest.mark.skipif(True, reason="/usr/bin/chromium not found")\n'
        "def test_in_the_browser():\n    pass\n"
    ),
    "test_storage_pg.py": "def test_on_postgres(postgres_server):\n    pass\n",
    "test_unrelated.py": (
        'import pytest\n@pytest.mark.skip(reason="an ordinary skip")\ndef test_skipped():\n    pass\n'
    ),
}


def _run(tmp_path: Path, **env: str) -> tuple[dict[str, int], str]:
    for name, text in {"conftest.py": CONFTEST, **TESTS}.items():
        (tmp_path / name).write_text(text)
    environment = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DRAFTLAB_TEST_POSTGRES", "DRAFTLAB_REQUIRE_SERVICES", "DRAFTLAB_ALLOW_SKIP")
    }
    environment.update(env, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = done.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    counts["errors"] = counts.pop("error", 0) + counts.pop("errors", 0)
    return counts, done.stdout


def test_scripts_test_sh_turns_missing_services_into_failures(tmp_path):
    counts, out = _run(tmp_path, DRAFTLAB_REQUIRE_SERVICES="1")
    # The browser test and the PostgreSQL test fail (in setup, so pytest counts errors); the ordinary skip stays.
    assert counts.get("failed", 0) + counts["errors"] == 2 and counts["skipped"] == 1 and "passed" not in counts, out
    assert "/usr/bin/chromium not found" in out and "127.0.0.1:1/test unreachable" in out
    assert out.count("DRAFTLAB_ALLOW_SKIP=1") >= 2


@pytest.mark.parametrize(
    "env", [{"DRAFTLAB_REQUIRE_SERVICES": "1", "DRAFTLAB_ALLOW_SKIP": "1"}, {}], ids=["opted out", "plain pytest"]
)
def test_skips_stay_skips_when_opted_out_or_outside_scripts_test_sh(tmp_path, env):
    counts, out = _run(tmp_path, **env)
    assert counts == {"skipped": 3, "errors": 0}, out


def test_scripts_test_sh_requires_the_services_unless_opted_out():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "export DRAFTLAB_REQUIRE_SERVICES=1" in script and "DRAFTLAB_ALLOW_SKIP" in script
    assert "exec ./scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # what CI runs
