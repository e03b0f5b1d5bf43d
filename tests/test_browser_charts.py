"""Every chart draws, in a real browser: `draftlab ui` on a database seeded (tests/chart_data.py) with one finished
experiment of each kind (k sweep, its validation, draft sweep, drafter sweep with k_r varying, temperature sweep,
`--k auto`, a batch × k grid with its k schedule and a stored vLLM confirm of that schedule, whose charts must draw),
production counters beside the k sweep and a finished training job, every name, label, draft,
target, prompt and token text holding quotes, apostrophes, `<`, `&` and non-ASCII. Every page of the navigation
is opened (the detail page once per kind of experiment, the Round explorer on a draft sweep's run, Compare with
all six and runs of three, Train on the job, Theory loaded from a measured run), every expander opened, and the
test fails on any console error or uncaught page error (Vega's "Unexpected identifier" when a name is pasted into
an expression), on a Python exception shown on the page, on any chart with no drawing or a drawing of height 0,
and on a view that should have charts and has none.

Console errors that are not the dashboard's are ignored, recognised by their URL only (tests/browser.py's
`ignored`): the favicon fetch, which fails offline, and Streamlit's client probing /PAGE/_stcore/ before the
root. On a failure a screenshot of the view is saved (tests/browser.py's SCREENSHOTS). Needs Debian's chromium
at /usr/bin/chromium, like test_browser_e2e.py."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.browser import (
    CHARTS_JS,
    SCREENSHOTS,
    chromium,
    needs_chromium,
    new_page,
    page_problems,
    seeded_dashboard,
    settle,
)
from tests.chart_data import NAMES

pytestmark = needs_chromium


CONFIRM_HEADINGS = (
    "Speedup vs concurrency",
    "Acceptance by draft position, vLLM and lab",
)  # pages/panels/confirm_panel.py
CONFIRM_SECTION = f"section={quote('Confirm in vLLM')}"  # the detail page's section that draws them


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with seeded_dashboard(tmp_path_factory.mktemp("charts")) as running:
        yield running


def visits(ids: dict) -> list[tuple[str, str, str, bool]]:
    """(navigation key, what is shown, path and query, whether it has charts) of every view the test opens."""
    experiments = ",".join(str(ids[kind]) for kind in NAMES)
    from storage import open_store
    from storage.records import queries as q

    store = open_store(ids["db"])
    runs = {kind: q.runs(store, ids[kind]) for kind in NAMES}
    store.dispose()
    speculative = {
        kind: [int(r) for r in frame.loc[frame["kind"] == "speculative", "run_id"]] for kind, frame in runs.items()
    }
    compared = ",".join(str(r) for r in speculative["draft"] + speculative["drafter"][:2] + speculative["k"][:1])
    out = [
        ("experiments", "Experiments", "", False),
        ("new", "New experiment", f"new?name={quote(NAMES['k'])}", False),
        *[
            ("experiment", f"detail of the {kind} experiment", f"experiment?experiment={ids[kind]}", True)
            for kind in NAMES
        ],  # its Verdict section; every section: test_browser_detail.py
        ("experiment", "Confirm in vLLM of the grid", f"experiment?experiment={ids['grid']}&{CONFIRM_SECTION}", True),
        ("rounds", "Round explorer", f"rounds?experiment={ids['draft']}&run={speculative['draft'][0]}&prompt=0", True),
        ("compare", "Compare", f"compare?experiments={experiments}&runs={compared}", True),
        ("train", "Train", f"train?job={ids['job']}", True),
        ("theory", "Theory", "theory", True),
    ]
    return out


def _open_expanders(page) -> None:
    """Open every closed expander, so the charts inside are laid out too (a closed one has no height)."""
    closed = page.locator('[data-testid="stExpander"] details:not([open]) > summary')
    for _ in range(closed.count()):
        closed.first.click()
    page.wait_for_timeout(300)


def _load_theory_from_a_run(page, experiment: str) -> None:
    """Theory: 'Load from experiment' a measured run, which adds the cost-aware curve to the main chart."""
    page.get_by_label("Load from experiment", exact=True).click()
    page.get_by_role("option", name=experiment, exact=True).click()
    settle(page)


def test_every_page_draws_every_chart_with_names_that_hold_quotes_tags_and_non_ascii(served):
    from pages.widgets.nav import PAGES

    ids = {**served["ids"], "db": served["db"]}
    problems, drawn, opened = [], {}, set()
    with chromium() as browser:
        page, messages = new_page(browser)
        for key, shown, path, charted in visits(ids):
            page.goto(f"{served['url']}/{path}")
            page.locator("h1").first.wait_for()
            settle(page)
            if key == "theory":
                _load_theory_from_a_run(page, f"#{ids['k']} · {NAMES['k']} (done)")
            _open_expanders(page)
            found, count = page_problems(page, shown, messages, charted)
            if path.endswith(CONFIRM_SECTION):  # the grid's stored vLLM confirm's charts must draw too
                headings = {c["heading"] for c in page.evaluate(CHARTS_JS) if c["drawn"] and c["height"] > 0}
                found += [f"{shown}: no drawn chart under {h!r}" for h in CONFIRM_HEADINGS if h not in headings]
            if found:
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOTS / f"charts-{key}-{len(problems)}.png"), full_page=True)
            problems += found
            drawn[shown] = count
            opened.add(key)
        page.close()
    assert opened == set(PAGES), f"pages never opened: {set(PAGES) - opened}"
    assert not problems, (
        "\n".join(problems)
        + f"\n(charts per view: {drawn}; screenshots in {SCREENSHOTS})"
        + "\nui log tail:\n"
        + served["log"].read_text(errors="replace")[-2000:]
    )
