"""MkDocs hooks (mkdocs.yml `hooks:`): the parts of the docs that are read from the code, never copied by hand.

- `<!-- generated: NAME -->` in a page is replaced by GENERATORS[NAME]() at build time: the CLI reference from
  `app.cli.build_parser()`, the drafters from engine/config/drafter_specs.py's SPECS, the swept variables and
  settings from engine/config/variables.py, the limits from engine/config/limits.py, the packages from each
  package's `__init__.py` docstring and the layers from pyproject.toml's [tool.importlinter] contracts. An unknown
  name, or a package without a docstring, fails the build.
- The benchmark write-ups live beside their scripts (benchmarks/<script>.md): they are added to the site under
  benchmarks/, with the scripts and results files they link to.
- Links are written as paths in the repository (so they work where the files are read, on disk or on a forge):
  `../benchmarks/bench_x.md` from docs/, `../docs/metrics.md` from benchmarks/. They are rewritten to the site's
  paths here; a link to anything outside docs/ and benchmarks/ is reported, which `mkdocs build --strict` fails on.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

log = logging.getLogger("mkdocs.hooks.draftlab")

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
BENCHMARKS = "benchmarks"
# What of benchmarks/ the site carries: write-ups and results (pages or text) and the scripts they name.
BENCHMARK_FILES = ("*.md", "*.txt", "*.py", "*.sh")
PACKAGES = ("app", "engine", "storage", "pages")
HELP_COLUMNS = "100"  # argparse wraps help at $COLUMNS: the reference reads the same on every machine


# --- generators -------------------------------------------------------------------------------------------------


def _cell(text) -> str:
    """One Markdown table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand, in the order the parser lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    raise PluginError("app.cli.build_parser() has no subcommands")


def cli_reference() -> str:
    from app.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build_parser()
        commands = _subcommands(parser)
        out = [_table(["command", "what it does"], [[f"[`draftlab {n}`](#draftlab-{n})", h] for n, h, _ in commands])]
        for name, _, sub in commands:
            out.append(f"## draftlab {name}\n\n```text\n{sub.format_help().strip()}\n```")
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n\n".join(out)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def drafters_table() -> str:
    from engine.config.drafter_specs import SPECS

    engines = list(dict.fromkeys(engine for spec in SPECS.values() for engine in spec.serving))
    rows = []
    for spec in SPECS.values():
        parameter = spec.parameter
        row = [
            f"`{spec.usage}`",
            spec.summary,
            f"{parameter.meaning}; default {parameter.default}" if parameter else "—",
            _yes(spec.needs_model),
            _yes(spec.constant_k),
            _yes(spec.needs_hidden_states),
        ]
        for engine in engines:
            serving = spec.serving.get(engine)
            row.append(f"`{serving.how}`" if serving is not None and serving.how else "not expressible")
        rows.append(row)
    header = ["drafter", "what it proposes", "parameter", "draft model", "constant k", "target's hidden states"]
    return _table(header + [f"on {engine}" for engine in engines], rows)


def _variables(table: dict) -> str:
    rows = []
    for v in table.values():
        rows.append(
            [
                f"`{v.flag}`",
                "names" if v.categorical else v.kind.__name__,
                v.meaning,
                "—" if v.default is None else f"`{v.default}`",
                _yes(v.per_value_baseline),
                v.cheaper_because or "—",
                v.help,
            ]
        )
    header = ["flag", "values are", "one value", "default", "a baseline per value", "cheaper when", "help"]
    return _table(header, rows)


def variables_table() -> str:
    from engine.config.variables import VARIABLES

    return _variables(VARIABLES)


def settings_table() -> str:
    from engine.config.variables import SETTINGS

    return _variables(SETTINGS)


def draft_sampling_list() -> str:
    from engine.config.drafter_specs import DEFAULT_DRAFT_SAMPLING, DRAFT_SAMPLING

    return ", ".join(f"`{mode}`" + (" (default)" if mode == DEFAULT_DRAFT_SAMPLING else "") for mode in DRAFT_SAMPLING)


def limits_table() -> str:
    from engine.config.limits import LIMITS

    return _table(
        ["cap (engine/config/limits.py)", "default", "variable"],
        [[item.meaning, item.default, f"`{item.env}`"] for item in LIMITS.values()],
    )


def _docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))


def _first_sentence(text: str) -> str:
    """The docstring's first sentence (of its first paragraph; at least 30 characters, "e.g." is no end)."""
    paragraph = " ".join(text.split("\n\n")[0].split())
    for match in re.finditer(r"(?<=[.!?])\s+", paragraph):
        if match.start() >= 30 and not paragraph[: match.start()].endswith(("e.g.", "i.e.", "etc.", "vs.")):
            return paragraph[: match.start()]
    return paragraph


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def packages() -> list[Path]:
    """Every package of the four layers (a folder with an __init__.py), parents first."""
    found = []
    for top in PACKAGES:
        found += sorted(init.parent for init in (ROOT / top).rglob("__init__.py") if "__pycache__" not in init.parts)
    return found


def parts_list() -> str:
    out = []
    missing = []
    for package in packages():
        dotted = ".".join(package.relative_to(ROOT).parts)
        doc = _docstring(package / "__init__.py")
        if not doc:
            missing.append((package / "__init__.py").relative_to(ROOT).as_posix())
            continue
        modules = sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
        lines = sum(_lines(p) for p in modules) + _lines(package / "__init__.py")
        out += [f"### `{dotted}`", "", " ".join(doc.split()), "", f"{len(modules)} modules, {lines:,} lines.", ""]
        if modules:
            rows = []
            for module in modules:
                text = _docstring(module)
                rows.append([f"`{module.stem}`", _lines(module), _first_sentence(text) if text else "—"])
            out += [_table(["module", "lines", "what it is (its docstring's first sentence)"], rows), ""]
    if missing:
        raise PluginError("packages without a docstring (the architecture page reads it): " + ", ".join(missing))
    return "\n".join(out).rstrip()


def _toml(text: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
        import tomli as tomllib
    return tomllib.loads(text)


def _contract_comments(text: str) -> list[str]:
    """The comment lines inside each [[tool.importlinter.contracts]] block, in order (not the comments after its
    last key, which belong to the next section)."""
    blocks = re.split(r"^\[", text, flags=re.M)
    comments = []
    for block in blocks:
        if not block.startswith("[tool.importlinter.contracts]]"):
            continue
        lines = block.splitlines()[1:]
        while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("#")):
            lines.pop()
        comments.append(" ".join(line.strip()[1:].strip() for line in lines if line.lstrip().startswith("#")))
    return comments


def layers_list() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    contracts = _toml(text)["tool"]["importlinter"]["contracts"]
    comments = _contract_comments(text)
    if len(comments) != len(contracts):
        raise PluginError("pyproject.toml: could not pair each import-linter contract with its comments")
    out = []
    for contract, comment in zip(contracts, comments):
        out += [f"### {contract['name']}", ""]
        if comment:
            out += [comment, ""]
        kind = contract["type"]
        if kind == "layers":
            out.append("Layers, each importing only those below it:")
            out.append("")
            out += [
                f"{i}. " + " \\| ".join(f"`{m.strip()}`" for m in layer.split("|"))
                for i, layer in enumerate(contract["layers"], 1)
            ]
        elif kind == "forbidden":
            sources = ", ".join(f"`{m}`" for m in contract["source_modules"])
            forbidden = ", ".join(f"`{m}`" for m in contract["forbidden_modules"])
            verb = "imports" if len(contract["source_modules"]) == 1 else "import"
            out.append(f"{sources} {verb} none of {forbidden}, directly or through anything.")
        elif kind == "acyclic_siblings":
            out.append(
                "No import cycle among the modules of any package under "
                + ", ".join(f"`{m}`" for m in contract["ancestors"])
                + "."
            )
        else:
            out.append(f"Type `{kind}`.")
        if contract.get("ignore_imports"):
            out += ["", "Allowed exceptions: " + ", ".join(f"`{i}`" for i in contract["ignore_imports"]) + "."]
        out.append("")
    return "\n".join(out).rstrip()


def metric_definitions(section: str):
    """docs/metrics.md's table of one section's run metrics, from storage/records/columns.py's entries."""

    def table() -> str:
        from storage.records.columns import metric_definitions as definitions

        return definitions(section)

    return table


GENERATORS = {
    "cli-reference": cli_reference,
    "drafters": drafters_table,
    "draft-sampling": draft_sampling_list,
    "variables": variables_table,
    "settings": settings_table,
    "limits": limits_table,
    "parts": parts_list,
    "layers": layers_list,
    "metrics-counts": metric_definitions("counts"),
    "metrics-times": metric_definitions("times"),
    "metrics-serving": metric_definitions("serving"),
}


def expand(markdown: str) -> str:
    """The page with every `<!-- generated: NAME -->` replaced by its generator's Markdown."""

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"unknown generated block {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


# --- links between docs/ and benchmarks/ ---------------------------------------------------------------------------


def site_path(repo_path: str) -> str | None:
    """Where a file of the repository lands in the site: docs/X at X, benchmarks/X at benchmarks/X; else None."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/") :]
    if repo_path.startswith(BENCHMARKS + "/"):
        return repo_path
    return None


def repo_path_of(page_src_uri: str, abs_src_path: str) -> str:
    return Path(abs_src_path).resolve().relative_to(ROOT).as_posix() if abs_src_path else "docs/" + page_src_uri


def rewrite_links(markdown: str, repo_path: str, page_site_path: str) -> str:
    """Links written as repository paths, rewritten to the site's paths (see the module's docstring)."""

    def one(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, hash_, fragment = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
        site = site_path(resolved)
        if site is None:
            log.warning(f"{repo_path}: the link {target!r} leaves docs/ and benchmarks/ (the site carries only those)")
            return match.group(0)
        relative = posixpath.relpath(site, posixpath.dirname(page_site_path) or ".")
        return f"{match.group(1)}{relative}{hash_}{fragment}{match.group(3)}"

    return LINK.sub(one, markdown)


# --- MkDocs events ------------------------------------------------------------------------------------------------


def on_files(files, config):
    for pattern in BENCHMARK_FILES:
        for path in sorted((ROOT / BENCHMARKS).glob(pattern)):
            files.append(
                File(
                    f"{BENCHMARKS}/{path.name}",
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files


def on_page_markdown(markdown, page, config, files):
    repo_path = repo_path_of(page.file.src_uri, page.file.abs_src_path)
    return rewrite_links(expand(markdown), repo_path, page.file.src_uri)
