"""Compare draws each experiment against its own swept variable, in Chromium: a k sweep, a draft sweep and a
drafter sweep (tests/chart_data.py's seeded database) side by side give one set of charts per variable, each
x axis titled with the variable's words, a draft or drafter sweep's axis a category per name (never its runs'
indices 0 and 1 beside another experiment's k = 1..4); a draft sweep's runs are labelled by their drafts, never
"k=2". The Experiments page polls a listing that holds a k sweep's numbers beside a draft sweep's names: the
server's log holds no ArrowInvalid. Fails on console errors, page errors, exceptions and charts not drawn."""

from __future__ import annotations

import re

import pytest

from tests.browser import chromium, needs_chromium, new_page, page_problems, seeded_dashboard, settle
from tests.chart_data import DRAFTS

pytestmark = needs_chromium
AXES_JS = """() => Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"] [aria-label^="X-axis"]'))
  .map(e => e.getAttribute('aria-label'))"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with seeded_dashboard(tmp_path_factory.mktemp("compare")) as running:
        yield running


def _runs_of(db: str, experiment_id: int) -> list[int]:
    from storage import open_store
    from storage.records import queries as q

    store = open_store(db)
    try:
        runs = q.runs(store, experiment_id)
    finally:
        store.dispose()
    return [int(r) for r in runs.loc[runs["kind"] == "speculative", "run_id"]]


def test_compare_plots_each_experiment_on_its_own_variable_and_names_a_draft_sweeps_runs(served):
    from pages.experiments import IDLE_POLL_SECONDS

    ids = served["ids"]
    draft_runs = _runs_of(served["db"], ids["draft"])
    chosen = f"{ids['k']},{ids['draft']},{ids['drafter']}"
    with chromium() as browser:
        page, messages = new_page(browser)
        page.goto(f"{served['url']}/experiments")
        settle(page)
        page.wait_for_timeout(int(2.5 * IDLE_POLL_SECONDS * 1000))  # the idle poll redraws the listing twice
        problems, _ = page_problems(page, "Experiments", messages, charted=False)
        log = served["log"].read_text(errors="replace")
        assert "ArrowInvalid" not in log and "Arrow table was unsuccessful" not in log, log[-3000:]
        page.goto(f"{served['url']}/compare?experiments={chosen}&runs={','.join(map(str, draft_runs))}")
        settle(page)
        found, charts = page_problems(page, "Compare", messages, charted=True)
        problems += found
        axes = page.evaluate(AXES_JS)
        headings = page.locator("h3").all_inner_texts()
        chosen_runs = "\n".join(page.locator('[data-testid="stMultiSelect"]').all_inner_texts()).splitlines()
    assert not problems, "\n".join(problems)
    assert charts == 3 * (3 + 1) + 2, f"per variable three panels and their legend, then the runs' two: {charts}"
    sweeps = [h for h in headings if h.startswith("Speedup, alpha and tokens per round vs ")]
    assert [h.rsplit(" vs ", 1)[1] for h in sweeps] == ["k", "draft", "drafter"], headings
    assert not [a for a in axes if "swept value" in a], axes  # no axis shared by different variables
    k_axes = [a for a in axes if a.startswith("X-axis titled 'k'")]
    assert len(k_axes) == 3 and all("values from 1 to" in a for a in k_axes), k_axes  # k from 1: never a 0 index
    for title, names in (("draft", DRAFTS), ("drafter", ["model", "confidence:0.3", "prompt-lookup:3"])):
        ours = [a for a in axes if a.startswith(f"X-axis titled '{title}'")]
        assert len(ours) == 3, axes
        assert all("discrete scale" in a and all(n in a for n in names) for a in ours), ours  # its names, in words
    run_tags = [t for t in chosen_runs if re.search(r"· run \d+ ·", t)]  # the Runs picker's chosen runs
    assert len(run_tags) == len(draft_runs), chosen_runs
    for text in run_tags:
        assert "draft=" in text and "k=" not in text and any(n in text for n in DRAFTS), text
    log = served["log"].read_text(errors="replace")
    assert "ArrowInvalid" not in log and "Arrow table was unsuccessful" not in log, log[-3000:]  # Compare's too
