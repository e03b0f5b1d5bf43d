"""What the browser tests (test_browser_*.py) share: `draftlab ui` on a free port, Debian's chromium driven by
Playwright, and the waits that make a Streamlit page safe to read."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
# Screenshots land in a temp dir; `DRAFTLAB_SCREENSHOTS=docs/screenshots` regenerates docs/dashboard.md's images.
SCREENSHOTS = Path(os.environ.get("DRAFTLAB_SCREENSHOTS") or Path(tempfile.gettempdir()) / "draftlab-screenshots")
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"draftlab ui exited with status {process.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the dashboard did not answer at {url} within {timeout:g} s")


@contextlib.contextmanager
def dashboard(tmp: Path, **env):
    """`draftlab ui` (through `python -m app.cli`, so with its local worker) on `tmp/draftlab.db` and a free port;
    yields {url, db, tmp, log}. Stopped with SIGTERM (app.ui stops the dashboard and its worker)."""
    db = f"sqlite:///{tmp / 'draftlab.db'}"
    port = free_port()
    environ = dict(os.environ, DRAFTLAB_UPLOAD_DIR=str(tmp / "uploads"), PYTHONPATH=str(ROOT), **env)
    log = open(tmp / "ui.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "ui", "--db", db, "--port", str(port)],
        cwd=tmp,
        env=environ,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield {"url": url, "db": db, "tmp": tmp, "log": tmp / "ui.log"}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@contextlib.contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        try:
            yield browser
        finally:
            browser.close()


def field(page, label: str):
    return page.get_by_label(label, exact=True)


def commit(locator, value: str) -> None:
    """Type into a Streamlit input and commit it (Streamlit reads text inputs on Enter)."""
    locator.click()
    locator.fill(value)
    locator.press("Enter")


QUIET_MS = 1_500  # a page is settled when Streamlit has said so for this long in a row
BUSY = '[data-testid="stSkeleton"], [data-stale="true"]'  # an element whose code still loads, or left from a run


def settle(page, timeout_ms: int = 120_000) -> None:
    """Wait until Streamlit has finished the current script run, and the grids and charts have painted: its app root
    says `notRunning` (the attribute Streamlit's own browser tests wait on), no element is a placeholder while its
    component's code loads (the chart and grid components load on first use) and none is stale (left from the
    previous run), all of that for QUIET_MS in a row. A single look is not enough: the running state shows only once
    the rerun a click asked for has started, and a page may rerun itself at once (e.g. to write its choice into the
    URL); on a loaded machine the browser can also paint the query string before the elements."""
    app = page.locator('[data-testid="stApp"]')
    quiet_since = started = page.evaluate("Date.now()")
    while page.evaluate("Date.now()") - quiet_since < QUIET_MS:
        if page.evaluate("Date.now()") - started > timeout_ms:  # e.g. a page refreshing itself every 2 s
            raise TimeoutError(f"the page never stayed idle for {QUIET_MS} ms within {timeout_ms} ms")
        if app.get_attribute("data-test-script-state") != "notRunning" or page.locator(BUSY).count():
            page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_ms)
            page.wait_for_function(f"() => !document.querySelector({BUSY!r})", timeout=timeout_ms)
            quiet_since = page.evaluate("Date.now()")
        page.wait_for_timeout(100)


def upload_prompts(page, given: str | None, tmp: Path, default: list[str]) -> Path:
    """Upload a prompt file into the page's file uploader: `given` (a path) or a file of `default`'s lines;
    waits for the page to count its prompts. Returns the file."""
    from engine.text.prompt_sets import load_prompt_file

    if given:
        path = Path(given).resolve()
    else:
        path = tmp / "prompts.txt"
        path.write_text("\n".join(default) + "\n")
    page.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(str(path))
    page.get_by_text(f"{len(load_prompt_file(path))} prompts from {path.name}").wait_for()
    return path


def log_tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:]


@contextlib.contextmanager
def seeded_dashboard(tmp):
    """The dashboard (`dashboard`) on tests/chart_data.py's seeded database in `tmp`, every experiment kind, with an
    idle worker registered: yields the running dashboard's dict plus "ids", the seeded experiments' ids."""
    from storage import open_store
    from tests.chart_data import idle_worker, seed

    store = open_store(f"sqlite:///{tmp / 'draftlab.db'}")
    ids = seed(store, tmp / "models")
    idle_worker(store)
    store.dispose()
    with dashboard(tmp, DRAFTLAB_MODELS=str(tmp / "models")) as running:
        yield {**running, "ids": ids}


# --- what a browser test fails on: console errors, page errors, exceptions on the page, charts not drawn --------

DRAW_TIMEOUT_MS = 15_000  # after the script run: how long a chart may take to paint before it counts as not drawn


def ignored(url: str) -> bool:
    """Console errors that are not the dashboard's, recognised by their URL only:
    - the favicon: app/main.py's page icon (:material/science:) is fetched from fonts.gstatic.com, unreachable
      offline;
    - Streamlit's client, opened at /PAGE, first looks for its server under that path (/PAGE/_stcore/health and
      /PAGE/_stcore/host-config answer 404) before using the root."""
    from pages.widgets.nav import PAGES

    return url.startswith("https://fonts.gstatic.com/s/i/short-term/release/materialsymbolsrounded/science/") or any(
        f"/{key}/_stcore/" in url for key in PAGES
    )


# Each chart of the page: its container, whether Vega drew into it (a canvas or svg under .vega-embed), and the
# drawing's size; with the nearest heading above it, to name it in a failure.
CHARTS_JS = """() => Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]')).map((chart, i) => {
  const drawn = chart.querySelector('.vega-embed canvas, .vega-embed svg.marks');
  const box = drawn ? drawn.getBoundingClientRect() : {width: 0, height: 0};
  let heading = '', node = chart;
  while (node && !heading) {
    let sibling = node.previousElementSibling;
    while (sibling && !heading) {
      const h = sibling.matches('h1,h2,h3,h4') ? sibling : sibling.querySelector('h1,h2,h3,h4');
      if (h) heading = h.innerText;
      sibling = sibling.previousElementSibling;
    }
    node = node.parentElement;
  }
  return {index: i, drawn: !!drawn, width: box.width, height: box.height, heading: heading.trim()};
})"""


def new_page(browser, timeout_ms: int = 60_000):
    """(a 1500×1400 page, the errors it reports from now on: collect_errors), every wait `timeout_ms` at most."""
    page = browser.new_page(viewport={"width": 1500, "height": 1400})
    page.set_default_timeout(timeout_ms)
    return page, collect_errors(page)


def collect_errors(page) -> list[str]:
    """The console errors (not `ignored`) and uncaught page errors the page reports from now on, as they come."""
    messages: list[str] = []

    def on_console(message) -> None:
        url = (message.location or {}).get("url", "")
        if message.type == "error" and not ignored(url):
            messages.append(f"console error: {message.text} ({url})")

    page.on("console", on_console)
    page.on("pageerror", lambda error: messages.append(f"page error: {error}"))
    return messages


def page_problems(page, shown: str, messages: list[str], charted: bool) -> tuple[list[str], int]:
    """What is wrong with the page as drawn (console errors since the last look, charts not drawn, no chart where
    `charted` says there are some), and how many charts it has."""
    found = [f"{shown}: {m}" for m in messages]
    messages.clear()
    deadline = page.evaluate("Date.now()") + DRAW_TIMEOUT_MS
    while True:
        charts = page.evaluate(CHARTS_JS)
        blank = [c for c in charts if not c["drawn"] or c["height"] <= 0 or c["width"] <= 0]
        if (charts or not charted) and not blank or page.evaluate("Date.now()") > deadline:
            break
        page.wait_for_timeout(250)
    if charted and not charts:  # a view that lost its charts altogether would pass every other check
        found.append(f"{shown}: no chart at all")
    for c in blank:
        size = f"{c['width']:.0f}x{c['height']:.0f} px" if c["drawn"] else "nothing drawn"
        found.append(f"{shown}: chart {c['index']} under {c['heading']!r}: {size}")
    found += [f"{shown}: {m}" for m in messages]
    messages.clear()
    # A Python exception on the page (Streamlit shows it in place of the rest of the page).
    found += [
        f"{shown}: exception on the page: {text[:500]}"
        for text in page.locator('[data-testid="stException"]').all_inner_texts()
    ]
    return found, len(charts)
