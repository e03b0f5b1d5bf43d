"""The layers, checked by import-linter: the contracts are pyproject.toml's [tool.importlinter], the one definition
of each rule (app > pages > storage > engine; the engine imports no UI or database; storage no torch or UI; the
pages load no model; no import cycle). `pytest` fails on a broken contract, and each contract is shown to break
on a copy of the project given one forbidden import.

What the linter cannot see is checked here too: no module imports another by a string (`import_module`,
`__import__`), which would step around every contract; and importing the dashboard (the entry script and every
page) imports no torch, since the pair check's transformers import is allowed only inside its functions.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "storage", "pages")


def contracts(root: Path = ROOT) -> list[str]:
    return [
        c["name"] for c in tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    ]


def lint(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the checkout at `root`: its pyproject.toml's contracts over its own modules (first on the
    path, ahead of any installed copy)."""
    exe = Path(sys.executable).with_name("lint-imports")
    assert exe.exists(), f"{exe} is missing: install the dev extras (pip install -e '.[dev]')"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(exe), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in contracts():
        assert f"{name} KEPT" in result.stdout, (name, result.stdout)


# (file, line added at its end, the contract that must break, what the report must name)
FORBIDDEN = [
    (
        "pages/widgets/common.py",
        "from app import report",
        "app > pages > storage > engine",
        "pages.widgets.common -> app.report",
    ),
    (
        "engine/decoding/speculative.py",
        "def _f():\n    import streamlit",
        "the engine is torch + transformers: no UI, no database",
        "engine.decoding.speculative -> streamlit",
    ),
    # through another module: storage reaches torch via the engine's loader
    (
        "storage/records/columns.py",
        "from engine.models import loading",
        "storage imports no torch and no UI",
        "engine.models.loading -> torch",
    ),
    (
        "pages/widgets/charts/speedup.py",
        "from engine.decoding import speculative",
        "the pages load no model",
        "pages.widgets.charts.speedup -> engine.decoding.speculative",
    ),
    # a cycle hidden in a function-level import (storage.records.queries imports storage.records.run_rows, which
    # imports storage.records.columns at its top)
    (
        "storage/records/columns.py",
        "def _f():\n    from storage.records import queries",
        "no import cycle inside a package",
        "No cycles are allowed in storage",
    ),
    (
        "engine/config/variables.py",
        "def _f():\n    from engine.decoding import records",
        "engine: training > metrics > decoding > models | text > config",
        "engine.config.variables -> engine.decoding.records",
    ),
    (
        "engine/config/limits.py",
        "def _f():\n    import torch",
        "the run's description and the formulas import no torch",
        "engine.config.limits -> torch",
    ),
    (
        "storage/records/columns.py",
        "def _f():\n    from storage.analysis import verdict",
        "storage: serving > analysis > jobs > records > db",
        "storage.records.columns -> storage.analysis.verdict",
    ),
    (
        "storage/analysis/catalog.py",
        "def _f():\n    from sqlalchemy import text",
        "the analysis speaks no SQL: it reads through storage.records",
        "storage.analysis.catalog -> sqlalchemy",
    ),
    (
        "pages/widgets/charts/speedup.py",
        "def _f():\n    from pages.panels import advice",
        "pages: a page > panels > widgets",
        "pages.widgets.charts.speedup -> pages.panels.advice",
    ),
    (
        "app/runtime/placement.py",
        "def _f():\n    from app.worker import worker",
        "app: cli > commands > worker > serving | training > runtime",
        "app.runtime.placement -> app.worker.worker",
    ),
    # the measurement a worker runs reaching up into a command's module (its parser, its printing)
    (
        "app/serving/confirm.py",
        "def _f():\n    from app.commands import confirm",
        "app: cli > commands > worker > serving | training > runtime",
        "app.serving.confirm -> app.commands.confirm",
    ),
]


@pytest.mark.parametrize("path, line, contract, named", FORBIDDEN, ids=[f[2] for f in FORBIDDEN])
def test_a_forbidden_import_breaks_its_contract(tmp_path, path, line, contract, named):
    copy = tmp_path / "project"
    for package in PACKAGES:
        for source in (ROOT / package).rglob("*.py"):
            target = copy / source.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    shutil.copyfile(ROOT / "pyproject.toml", copy / "pyproject.toml")
    assert lint(copy).returncode == 0  # the copy as it is keeps every contract
    with open(copy / path, "a") as f:
        f.write(f"\n\n{line}\n")
    result = lint(copy)
    assert result.returncode != 0
    assert f"{contract} BROKEN" in result.stdout, result.stdout
    assert named in result.stdout, result.stdout


def test_no_module_is_imported_by_a_string():
    """`importlib.import_module("pages.x")` and `__import__` are imports the linter cannot read. (Entry points such
    as pyproject's `draftlab = "app.cli:main"` name the top layer, which may import anything.)"""
    found = []
    for package in PACKAGES:
        for source in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
                if isinstance(node, ast.Call):
                    called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if called in ("import_module", "__import__"):
                        found.append(f"{source.relative_to(ROOT)}:{node.lineno}")
    assert not found


def test_importing_the_dashboard_imports_no_torch():
    """The entry script and every page module, imported in a fresh interpreter: torch and transformers stay out
    (the pair check imports them in the background after start-up, never at import)."""
    pages = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "pages").rglob("*.py")
        if p.stem != "__init__"
    )
    assert {"pages.experiments", "pages.widgets.pair_check", "pages.new_experiment"} <= set(pages)
    code = "\n".join(
        [
            "import sys",
            "import app.main",
            *(f"import {m}" for m in pages),
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'safetensors') if m in sys.modules))",
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


# The analysis computes from stored rows: every read is a named function of storage/records (the import contract
# "the analysis speaks no SQL" forbids sqlalchemy; this finds what an import cannot show: a statement in a string, a
# connection opened). The serving engines' vocabulary (deploy's flag mapping, the export's documents) likewise.
NO_SQL = (
    *sorted((ROOT / "storage" / "analysis").rglob("*.py")),  # the findings package's rule modules too
    ROOT / "storage" / "serving" / "deploy.py",
    ROOT / "storage" / "serving" / "export.py",
    *sorted((ROOT / "storage" / "serving" / "engines").rglob("*.py")),  # each engine's settings for a run
)
SQL_STATEMENT = re.compile(r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM)\s")
DATABASE_CALLS = ("read", "write", "execute", "begin", "connect")  # Store.read/write, a connection's execute ...


def sql_in(source: str, filename: str = "<source>") -> list[str]:
    """`line: what` for each string literal (f-strings' parts too) holding a SQL statement, and each call of a
    database method (`store.read()`, `conn.execute(...)`), in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_STATEMENT.search(node.value):
            found.append(f"{node.lineno}: {node.value.strip()[:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DATABASE_CALLS:
            found.append(f"{node.lineno}: .{node.func.attr}()")
    return found


@pytest.mark.parametrize(
    "source",
    [
        'def f(store):\n    with store.read() as conn:\n        return conn.execute(text("SELECT 1"))\n',
        'SQL = """\nSELECT s.id FROM runs s\nWHERE s.kind = 1"""\n',
        'def f(table):\n    return f"DELETE FROM {table} WHERE id = 1"\n',
        "def f(conn):\n    conn.execute(q)\n",
    ],
)
def test_the_sql_check_finds_a_statement_or_a_connection(source):
    assert sql_in(source)


@pytest.mark.parametrize("path", NO_SQL, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_analysis_holds_no_sql(path):
    assert path.exists()
    assert sql_in(path.read_text(), str(path)) == [], f"{path.relative_to(ROOT)}: read through storage/records"
