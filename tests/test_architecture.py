"""The layers, read from the source (`ast`, nothing imported): who may import what, and no import cycle.

- engine/ is torch + transformers only: never streamlit, sqlalchemy, altair, nor storage/app/pages;
- storage/ never imports torch, transformers or streamlit, nor app/pages; of the engine it imports only modules
  that are torch-free all the way down (TORCH_FREE_ENGINE lists the ones it and the pages read);
- pages/ never import torch or transformers, never an engine module that needs torch (model loading, decoding),
  never the worker or what it runs (MODEL_RUNNERS); importing a page imports no torch (its module-level imports, followed through the project);
- no import cycle among the project's modules. Every import statement counts, a function's too: a cycle
  hidden in a function-level import is still two modules that each need the other.

A third-party package is named by its top-level name (`sqlalchemy.exc` is `sqlalchemy`); a project module by its
dotted path (`storage.queue`); `from storage import queue` imports the module `storage.queue`.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "storage", "pages")
TORCH = {"torch", "transformers", "accelerate", "safetensors"}
UI = {"streamlit", "altair"}

# Engine modules that import no torch/transformers, directly or through any module they import (checked below):
# storage and the pages may import these.
TORCH_FREE_ENGINE = {"engine.errors", "engine.numbers", "engine.limits", "engine.variables", "engine.drafter_specs",
                     "engine.records", "engine.theory", "engine.metrics_oracle", "engine.protocol",
                     "engine.prompt_sets", "engine.token_types", "engine.zoo", "engine.wording"}
# Modules that load models, time decodes or train: the pages never import them, directly or not.
MODEL_RUNNERS = {"app.worker", "app.worker_process", "app.timing", "app.model_cache", "app.training",
                 "app.distill_driver"}

# Import cycles allowed (each a set of modules): none. The test fails on any cycle, and on an entry here that is no
# longer a cycle.
ALLOWED_CYCLES: set[frozenset[str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _imports(name: str, path: Path, module_level_only: bool) -> set[str]:
    """What `name` imports: project modules by dotted name, other packages by top-level name."""
    known = modules()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def add(target: str) -> None:
        if target in known:
            found.add(target)
        elif target.split(".")[0] in PACKAGES:  # a name inside a project module: that module
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
        else:
            found.add(target.split(".")[0])

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                base = ".".join(package[:len(package) - child.level + 1] + ([child.module] if child.module else [])) \
                    if child.level else child.module
                for alias in child.names:
                    add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(name)
    return found


@lru_cache(maxsize=None)
def imports(name: str, module_level_only: bool = False) -> frozenset[str]:
    return frozenset(_imports(name, modules()[name], module_level_only))


def closure(name: str, module_level_only: bool = False) -> set[str]:
    """Everything `name` imports, following project modules (what importing it may end up importing)."""
    seen, todo = set(), [name]
    while todo:
        for target in imports(todo.pop(), module_level_only):
            if target not in seen:
                seen.add(target)
                if target in modules():
                    todo.append(target)
    return seen


def _in(package: str) -> list[str]:
    return [m for m in modules() if m == package or m.startswith(package + ".")]


def torch_free(name: str) -> bool:
    return not (closure(name) & TORCH)


def test_the_project_is_read_whole():
    """The walk sees the modules this test is about (a wrong ROOT would pass every rule vacuously)."""
    assert {"engine.speculative", "storage.queries", "pages.experiments", "app.worker"} <= set(modules())
    assert "torch" in imports("engine.speculative") and "sqlalchemy" in imports("storage.queries")


def test_the_engine_imports_no_ui_no_database_and_no_other_layer():
    bad = {m: sorted(t for t in imports(m) if t in UI | {"sqlalchemy"} or t.split(".")[0] in ("storage", "app", "pages"))
           for m in _in("engine")}
    assert not {m: b for m, b in bad.items() if b}


def test_the_torch_free_engine_modules_are_torch_free():
    assert TORCH_FREE_ENGINE <= set(modules())
    assert not {m: sorted(closure(m) & TORCH) for m in TORCH_FREE_ENGINE if not torch_free(m)}


def test_storage_imports_no_torch_no_ui_and_only_torch_free_engine_modules():
    bad = {}
    for m in _in("storage"):
        wrong = {t for t in imports(m) if t in TORCH | UI or t.split(".")[0] in ("app", "pages")}
        wrong |= {t for t in imports(m) if t.startswith("engine") and not torch_free(t)}
        if wrong:
            bad[m] = sorted(wrong)
    assert not bad


def test_pages_load_no_model():
    bad = {}
    for m in _in("pages"):
        wrong = {t for t in imports(m) if t in TORCH or t in MODEL_RUNNERS}
        wrong |= {t for t in imports(m) if t.startswith("engine") and not torch_free(t)}
        wrong |= {t for t in closure(m) if t in MODEL_RUNNERS}
        wrong |= closure(m, module_level_only=True) & TORCH  # importing the page imports torch
        if wrong:
            bad[m] = sorted(wrong)
    assert not bad


def import_cycles() -> set[frozenset[str]]:
    """The strongly connected components of more than one module of the import graph (Tarjan)."""
    graph = {m: {t for t in imports(m) if t in modules()} for m in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: set[frozenset[str]] = set()

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def test_no_import_cycle():
    cycles = import_cycles()
    assert not [sorted(c) for c in cycles - ALLOWED_CYCLES], "new import cycles"
    assert not [sorted(c) for c in ALLOWED_CYCLES - cycles], "ALLOWED_CYCLES lists a cycle that is gone: remove it"
