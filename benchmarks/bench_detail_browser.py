"""How soon the experiment-detail page shows its answer in Chromium: `python benchmarks/bench_pages.py --browser`
(see its docstring for the protocol). Each tree (this one, and --against REF's code) is served by its own Streamlit
on the same database, without a worker; the visits of the two alternate."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"first": 2.0, "warm": 1.5}  # seconds to the answer (issue 35)

# The answer is drawn: the verdict's box (or a grid's k schedule headline) is on screen and the chart under the
# "Speedup vs" heading has painted (a canvas or svg with a size). Returns performance.now(): ms since navigation.
ANSWER_JS = """() => {
  const said = [...document.querySelectorAll('[data-testid="stAlert"]')]
    .some(a => a.offsetHeight > 0 && /Verdict|schedule/.test(a.innerText));
  const heading = [...document.querySelectorAll('h3')].find(h => h.innerText.startsWith('Speedup vs'));
  if (!said || !heading) return false;
  const block = heading.closest('[data-testid="stVerticalBlock"]');
  const drawn = block && [...block.querySelectorAll('[data-testid="stVegaLiteChart"] canvas, '
    + '[data-testid="stVegaLiteChart"] svg.marks')].some(c => {
      const box = c.getBoundingClientRect(); return box.width > 0 && box.height > 0; });
  return drawn ? performance.now() : false;
}"""
# The script run is over and every chart on the page has painted.
DONE_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (document.querySelector('[data-testid="stSkeleton"], [data-stale="true"]')) return false;
  const charts = [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')];
  const painted = charts.every(c => c.querySelector('canvas, svg.marks'));
  return charts.length && painted ? performance.now() : false;
}"""


def extract(ref: str, into: Path) -> Path:
    """The tree of git `ref` (tracked files only) under `into`."""
    archive = into / "tree.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), ref], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


@contextlib.contextmanager
def served(tree: Path, db: Path, log: Path):
    """Streamlit serving `tree`'s app/main.py (its own packages first on the path) on `db`; yields its URL."""
    from app.ui import streamlit_command
    from tests.browser import free_port, wait_healthy

    port = free_port()
    command = [
        str(tree / "app" / "main.py") if part.endswith("main.py") else part
        for part in streamlit_command(port, "127.0.0.1")
    ]
    env = dict(os.environ, DRAFTLAB_DB=f"sqlite:///{db}", PYTHONPATH=str(tree))
    env.pop("DRAFTLAB_PASSWORD", None)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, process)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def visit(page, url: str) -> tuple[float, float]:
    """(seconds to the answer, seconds to done) of one page load."""
    page.goto(url, wait_until="commit")
    answer = page.wait_for_function(ANSWER_JS, polling="raf", timeout=120_000).json_value()
    done = page.wait_for_function(DONE_JS, polling=100, timeout=120_000).json_value()
    return answer / 1000, done / 1000


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f} s ({min(values):.2f}–{max(values):.2f})" if values else "—"


def run_browser(
    db: Path, experiment_id: int | None, against: str | None, repeats: int, warm: int, cold: bool = False
) -> int:
    from tests.browser import chromium

    if experiment_id is None or not db.exists():
        print(
            "error: --browser needs --db (an existing SQLite file) and --experiment (a finished k sweep in it)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="draftlab-bench-browser-") as tmp:
        trees = {"this tree": ROOT}
        if against:
            trees[f"git {against}"] = extract(against, Path(tmp))
        times: dict[str, dict[str, list[float]]] = {
            name: {"first": [], "warm": [], "first done": [], "warm done": []} for name in trees
        }
        load = os.getloadavg()
        with chromium() as browser:
            for repeat in range(repeats):
                names = list(trees) if repeat % 2 == 0 else list(reversed(trees))  # who goes first alternates
                with contextlib.ExitStack() as stack:
                    urls = {
                        name: stack.enter_context(served(trees[name], db, Path(tmp) / "servers.log")) for name in names
                    }
                    pages = {}
                    for name in names:
                        if not cold:  # the server has served a page (its imports done), in another browser
                            with contextlib.closing(browser.new_context()) as other:
                                other.new_page().goto(urls[name])
                                other.pages[0].wait_for_selector(
                                    '[data-testid="stApp"][data-test-script-state="notRunning"] h1', timeout=120_000
                                )
                        context = stack.enter_context(
                            contextlib.closing(browser.new_context(viewport={"width": 1500, "height": 1000}))
                        )
                        pages[name] = context.new_page()
                    for visit_index in range(1 + warm):
                        kind = "first" if visit_index == 0 else "warm"
                        for name in names:
                            answer, done = visit(pages[name], f"{urls[name]}/experiment?experiment={experiment_id}")
                            times[name][kind].append(answer)
                            times[name][f"{kind} done"].append(done)
                            print(
                                f"repeat {repeat + 1} {name:<14} {kind:<5} answer {answer:5.2f} s, done {done:5.2f} s",
                                flush=True,
                            )
    print(
        f"\nexperiment {experiment_id}, {repeats} repeats x (1 first + {warm} warm) visits per tree; first visits "
        f"{'on a server just started' if cold else 'on a server that has served the Experiments page'}; load average "
        f"before {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, after "
        f"{'/'.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    print(f"{'tree':<16} {'first: answer':>26} {'warm: answer':>26} {'first: done':>26} {'warm: done':>26}")
    for name, measured in times.items():
        print(
            f"{name:<16} "
            + " ".join(f"{_spread(measured[k]):>26}" for k in ("first", "warm", "first done", "warm done"))
        )
    mine = times["this tree"]
    for name, other in times.items():  # visit by visit: the two trees' visits alternate, so each pair met one load
        if name != "this tree":
            for kind in ("first", "warm"):
                ratios = [a / b for a, b in zip(mine[kind], other[kind])]
                print(
                    f"{kind} answer, this tree / {name}, paired visit by visit: median "
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}, {len(ratios)} pairs)"
                )
    missed = [
        f"{kind} {statistics.median(mine[kind]):.2f} s > {goal:g} s"
        for kind, goal in GOALS.items()
        if statistics.median(mine[kind]) > goal
    ]
    print(
        "goals (median answer): "
        + (
            "missed: " + "; ".join(missed)
            if missed
            else " and ".join(f"{k} ≤ {g:g} s" for k, g in GOALS.items()) + " met"
        )
    )
    return 1 if missed else 0
