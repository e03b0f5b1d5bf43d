"""A block-verification run's chart in Chromium: `draftlab ui` on a database holding a verify sweep (a real tiny
decode recorded through storage), the block run's "Why drafts are rejected" section draws, per draft position, one
SVG bar for each nonzero count of rounds one rule accepted and the other rejected (an empty or blank chart fails), no
console or page error; the standard run of the same sweep draws no such chart. Needs Debian's chromium at
/usr/bin/chromium."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from pages.panels.block_panel import TITLE
from tests.browser import chromium, collect_errors, dashboard, needs_chromium, page_problems, settle
from tests.test_browser_tree import BARS_JS

pytestmark = needs_chromium
SECTION = "Why drafts are rejected"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from storage import open_store
    from storage.records.block_positions import block_gain_by_position
    from tests.test_block_positions import fill_verify_experiment

    tmp = tmp_path_factory.mktemp("block")
    store = open_store(f"sqlite:///{tmp / 'draftlab.db'}")
    eid, by_rule, _ = fill_verify_experiment(store)
    store.dispose()
    with dashboard(tmp) as running:
        gain = block_gain_by_position(open_store(running["db"]), by_rule["block"])
        yield {**running, "eid": eid, "block": by_rule["block"], "standard": by_rule["standard"], "gain": gain}


def _open(page, served, run: int) -> None:
    page.goto(f"{served['url']}/experiment?experiment={served['eid']}&section={quote(SECTION)}&run={run}")
    page.locator("h1").first.wait_for()
    settle(page)


def test_the_block_chart_draws_its_bars_and_the_standard_run_has_none(served):
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.set_default_timeout(60_000)
        messages = collect_errors(page)
        _open(page, served, served["block"])
        problems, _ = page_problems(page, "the block run", messages, charted=True)
        page.wait_for_function(f"() => ({BARS_JS})({TITLE!r}) >= 0", timeout=15_000)
        bars = page.evaluate(BARS_JS, TITLE)
        _open(page, served, served["standard"])
        problems += page_problems(page, "the standard run", messages, charted=True)[0]
        standard = page.evaluate(BARS_JS, TITLE)
    assert not problems, "\n".join(problems) + "\n" + served["log"].read_text(errors="replace")[-2000:]
    gain = served["gain"]
    drawn = int((gain["block_only"] > 0).sum() + (gain["standard_only"] > 0).sum())
    assert bars == drawn > 0, (bars, gain)  # one bar per nonzero count the query returns, not an empty chart
    assert standard == -1  # a standard run has no block chart
