"""A module's `_private` names are its own: no engine module reaches into another's (`mod._name`, or
`from mod import _name`). What two modules share is public and documented where it lives, as the trainers' data
and sampling in engine/training/data.py."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("engine",)


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) of every use of another module's private name in `source`."""
    tree = ast.parse(source)
    modules: set[str] = set()  # names bound to imported modules (or imported names: a private one is caught below)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append((node.lineno, f"from {node.module} import {a.name}"))
                modules.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def test_the_check_sees_both_forms():
    source = "from engine.training import distill as ds\nfrom a.b import _c\nds._batch([], 'cpu')\nds.Sequence\n"
    assert private_uses(source) == [(2, "from a.b import _c"), (3, "ds._batch")]
    assert private_uses("import os\nclass A:\n    def f(self):\n        return self._x, os.path\n") == []


def test_no_engine_module_uses_another_modules_private_names():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for package in CHECKED
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, what in private_uses(path.read_text(encoding="utf-8"))
    ]
    assert found == []
