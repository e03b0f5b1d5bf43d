"""The docs: the MkDocs site builds with --strict (so a broken link or anchor, a page left out of the navigation, a
link leaving the repository or a package without a docstring fails the README's test command), the generated
pages hold what the code declares, the README stays a short front page whose test command is what CI runs, and
each benchmark write-up quotes the figures its results file holds."""

from __future__ import annotations

import html
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import hooks  # noqa: E402  (docs/hooks.py: the MkDocs hooks, importable without a build)

LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def test_the_site_builds_strict_with_every_benchmark_write_up_beside_its_script(site):
    for write_up in (ROOT / "benchmarks").glob("bench_*.md"):
        assert (site / "benchmarks" / write_up.stem / "index.html").exists(), write_up.name
        if not write_up.stem.endswith("_results"):
            script = ROOT / "benchmarks" / f"{write_up.stem}.py"
            assert script.exists(), f"{write_up.name} has no script beside it"
            assert f"benchmarks/{script.name}" in write_up.read_text(encoding="utf-8"), "names its script"


def test_the_cli_reference_holds_every_command_and_flag_of_the_parser(site):
    import argparse

    from app.cli import build_parser

    page = _page(site, "cli")
    commands = hooks._subcommands(build_parser())
    assert len(commands) >= 10
    for name, _, parser in commands:
        assert f'id="draftlab-{name}"' in page, name
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                assert action.option_strings[-1] in page, (name, action.option_strings)


def test_the_drafters_variables_and_limits_are_read_from_their_declarations(site):
    from engine.config.drafter_specs import SPECS
    from engine.config.limits import LIMITS
    from engine.config.variables import SETTINGS, VARIABLES

    drafters = _page(site, "drafters")
    for spec in SPECS.values():
        assert f"<code>{spec.usage}</code>" in drafters, spec.name
    for variable in [*VARIABLES.values(), *SETTINGS.values()]:
        assert f"<code>{variable.flag}</code>" in drafters, variable.name
    running = _page(site, "running")
    for item in LIMITS.values():
        assert re.search(rf"<td>{item.default}</td>\s*<td><code>{item.env}</code></td>", running), item.env
    # The notes below the drafters table name only declared drafters.
    notes = (ROOT / "docs" / "drafters.md").read_text(encoding="utf-8").split("Notes on what")[1].split("\n## ")[0]
    assert set(re.findall(r"^- `([a-z0-9-]+)`", notes, flags=re.M)) <= set(SPECS)


def test_the_architecture_lists_every_package_and_every_import_contract(site):
    page = _page(site, "architecture")
    for package in hooks.packages():
        assert f"<code>{'.'.join(package.relative_to(ROOT).parts)}</code>" in page, package
    contracts = hooks._toml((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert len(contracts) >= 5
    for contract in contracts:
        assert html.escape(contract["name"], quote=False) in page, contract["name"]


def test_a_package_without_a_docstring_fails_the_build(tmp_path, monkeypatch):
    from mkdocs.exceptions import PluginError

    (tmp_path / "app" / "bare").mkdir(parents=True)
    (tmp_path / "app" / "__init__.py").write_text('"""A layer."""\n')
    (tmp_path / "app" / "bare" / "__init__.py").write_text("")
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    monkeypatch.setattr(hooks, "PACKAGES", ("app",))
    with pytest.raises(PluginError, match=r"app/bare/__init__\.py"):
        hooks.parts_list()
    with pytest.raises(PluginError, match="unknown generated block"):
        hooks.expand("<!-- generated: no-such-block -->")


def test_links_are_repository_paths_and_none_leaves_docs_or_benchmarks(caplog):
    assert hooks.rewrite_links("[m](metrics.md#x)", "docs/running.md", "running.md") == "[m](metrics.md#x)"
    assert hooks.rewrite_links("[b](../benchmarks/b.md)", "docs/x.md", "x.md") == "[b](benchmarks/b.md)"
    assert hooks.rewrite_links("[m](../docs/metrics.md)", "benchmarks/b.md", "benchmarks/b.md") == "[m](../metrics.md)"
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.draftlab"):
        hooks.rewrite_links("[s](../shared/STYLE.md)", "docs/x.md", "x.md")
    assert "leaves docs/ and benchmarks/" in caplog.text  # a warning: --strict fails on it
    for path in [*(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.md")]:
        for target in LINK.findall(path.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:|^#", target):
                continue
            resolved = (path.parent / target.split("#")[0]).resolve()
            assert resolved.is_relative_to(ROOT / "docs") or resolved.is_relative_to(ROOT / "benchmarks"), (
                path.name,
                target,
            )
            assert resolved.exists(), (path.name, target)


def test_the_readme_is_a_short_front_page_whose_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for target in LINK.findall(readme):
        if re.match(r"^[a-z]+:|^#", target):
            continue
        resolved = (ROOT / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.exists(), target
    quick_start = readme.split("## Quick start")[1].split("```bash\n")[1].split("```")[0]
    commands = {line.split("#")[1].strip(): line.split("#")[0].strip() for line in quick_start.splitlines()}
    assert commands["every test (what CI runs)"] == "./scripts/test.sh"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec (\S+)$", ci, flags=re.M).group(1) == commands["every test (what CI runs)"]
    dashboard = commands["the dashboard on the shipped demo pair: http://127.0.0.1:8501"]
    assert dashboard == "./scripts/dashboard.sh" and "exec draftlab ui" in (ROOT / dashboard).read_text()
    for script in commands.values():
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"


def quoted_figures(text: str) -> list[str]:
    """The decimal numbers a write-up quotes in its tables and code blocks."""
    lines, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif fence or line.startswith("|"):
            lines.append(line)
    return re.findall(r"(?<![\d.])\d+\.\d+(?![\d.])", "\n".join(lines))


def unmatched_figures(write_up: str, results: str) -> list[str]:
    """The figures of the write-up that no number of the results rounds to (at the write-up's decimals)."""
    values = [float(x) for x in re.findall(r"\d+\.\d+", results)]
    unmatched = []
    for figure in quoted_figures(write_up):
        half = 0.5 * 10 ** -len(figure.split(".")[1]) + 1e-9
        if not any(abs(value - float(figure)) <= half for value in values):
            unmatched.append(figure)
    return unmatched


# Write-ups whose every table and printed block comes from the results files they link (bench_pages.md's tables
# are older runs without a results file; its results file holds the --browser run it links to).
FROM_RESULTS = ("bench_schedule", "bench_drafters", "bench_eagle3", "bench_aux_states")


@pytest.mark.parametrize("name", FROM_RESULTS)
def test_the_figures_a_write_up_quotes_are_its_results_files(name):
    text = (ROOT / "benchmarks" / f"{name}.md").read_text(encoding="utf-8")
    linked = sorted(set(re.findall(r"\]\((bench_\w+_results\.(?:md|txt))\)", text)))
    assert linked, f"{name}.md links no results file"
    results = "\n".join((ROOT / "benchmarks" / file).read_text(encoding="utf-8") for file in linked)
    assert len(quoted_figures(text)) >= 4
    assert unmatched_figures(text, results) == []
    assert unmatched_figures("| 1.234 | 9.87 |", "1.2341 and 9.874") == []  # rounded as printed
    assert unmatched_figures("| 1.234 | 9.88 |", "1.2341 and 9.874") == ["9.88"]  # a figure the file lacks
