"""Style and types, checked by the tools pyproject.toml configures: `ruff format --check` (the formatter would change
nothing), `ruff check` (no lint finding: [tool.ruff.lint]) and `mypy` (no type error: [tool.mypy], the whole tree at
mypy's default level and the packages its per-module override lists strict). Each test fails with the tool's own
report, so the finding and its file and line are in the failure.

The tools run on the checkout itself, each as `python -m TOOL` of this interpreter (the dev extras install them).
mypy keeps its cache in .mypy_cache (git-ignored): a run after a small change takes seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m ARGS` in the repository root (its pyproject.toml's configuration), output captured."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def report(done: subprocess.CompletedProcess[str]) -> str:
    return f"`{' '.join(done.args[2:])}` exited {done.returncode}:\n{done.stdout}{done.stderr}"


def test_ruff_format_would_change_nothing() -> None:
    done = tool("ruff", "format", "--check", ".")
    assert done.returncode == 0, report(done)


def test_ruff_check_finds_nothing() -> None:
    done = tool("ruff", "check", "--output-format", "concise", ".")
    assert done.returncode == 0, report(done)


def test_mypy_finds_no_type_error() -> None:
    done = tool("mypy")  # no arguments: [tool.mypy]'s `files`, with its per-module strictness
    assert done.returncode == 0, report(done)
    assert "Success: no issues found" in done.stdout, report(done)
