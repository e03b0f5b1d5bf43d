"""A token-tree run's chart in Chromium: `draftlab ui` on a database holding a tree_topk sweep (synthetic records, no
model), the run's "Why drafts are rejected" section draws the acceptance by depth and sibling rank with one SVG bar
per depth and rank the query returns (an empty or blank chart fails), no console or page error, no exception; the
chain run of the same sweep draws no such chart. Needs Debian's chromium at /usr/bin/chromium."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from pages.panels.tree_panel import TITLE
from tests.browser import chromium, collect_errors, dashboard, needs_chromium, page_problems, settle

pytestmark = needs_chromium
SECTION = "Why drafts are rejected"

# The bars Vega drew (SVG paths of its rect marks with a size) in the chart under `heading`; -1 when no drawn chart
# has that heading.
BARS_JS = """(heading) => {
  for (const chart of document.querySelectorAll('[data-testid="stVegaLiteChart"]')) {
    let title = '', node = chart;
    while (node && !title) {
      let sibling = node.previousElementSibling;
      while (sibling && !title) {
        const h = sibling.matches('h1,h2,h3,h4') ? sibling : sibling.querySelector('h1,h2,h3,h4');
        if (h) title = h.innerText.trim();
        sibling = sibling.previousElementSibling;
      }
      node = node.parentElement;
    }
    if (title !== heading) continue;
    return Array.from(chart.querySelectorAll('svg.marks .mark-rect path')).filter(p => {
      const box = p.getBBox();
      return box.width > 0 && box.height > 0;
    }).length;
  }
  return -1;
}"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from storage import open_store
    from storage.records.tree_breakdowns import acceptance_by_sibling_rank
    from tests.test_tree_breakdowns import TOPK, fill_tree_experiment

    tmp = tmp_path_factory.mktemp("tree")
    store = open_store(f"sqlite:///{tmp / 'draftlab.db'}")
    eid, by_topk, _ = fill_tree_experiment(store, (1.1, 1.3))
    store.dispose()
    with dashboard(tmp) as running:
        ranks = acceptance_by_sibling_rank(open_store(running["db"]), by_topk[TOPK])
        yield {**running, "eid": eid, "tree": by_topk[TOPK], "chain": by_topk[1], "ranks": ranks}


def _open(page, served, run: int) -> None:
    page.goto(f"{served['url']}/experiment?experiment={served['eid']}&section={quote(SECTION)}&run={run}")
    page.locator("h1").first.wait_for()
    settle(page)


def test_the_tree_chart_draws_its_bars_and_the_chain_run_has_none(served):
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.set_default_timeout(60_000)
        messages = collect_errors(page)
        _open(page, served, served["tree"])
        problems, _ = page_problems(page, "the tree run", messages, charted=True)
        page.wait_for_function(f"() => ({BARS_JS})({TITLE!r}) >= 0", timeout=15_000)
        bars = page.evaluate(BARS_JS, TITLE)
        _open(page, served, served["chain"])
        problems += page_problems(page, "the chain run", messages, charted=True)[0]
        chain = page.evaluate(BARS_JS, TITLE)
    assert not problems, "\n".join(problems) + "\n" + served["log"].read_text(errors="replace")[-2000:]
    assert bars == len(served["ranks"]) > 0, bars  # one bar per depth and rank the query returns, not an empty chart
    assert chain == -1  # a chain has no tree chart
