"""The experiment-detail page's sections in Chromium (issue 35, items 15 and 10): `draftlab ui` on tests/chart_data.py's
seeded database, in which the validation experiment's run is rewritten as the issue's first demo run (best k 2 at
1.13×, 0.95–1.31: not measurably faster than the target alone).

- Every section of every kind of experiment opens from its link (`?section=`) with that tab selected, no console or
  page error, no Python exception, every chart drawn with a size, the sections that draw charts with some; no
  table runs past the 1,400 px window.
- A click on a tab builds that section (and only then: the Verdict's first screen has the one speedup chart) and
  writes it into the URL.
- The headline agrees with the verdict: what it serves, the target alone included.
Needs Debian's chromium at /usr/bin/chromium, like the other browser tests."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.browser import SCREENSHOTS, chromium, collect_errors, dashboard, needs_chromium, page_problems, settle

pytestmark = needs_chromium
WIDTH = 1400  # the window: tables were cut off at 1,400 px
CHARTED = {"Verdict", "Why drafts are rejected"}  # sections that draw a chart for every kind of experiment


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from sqlalchemy import text

    from storage import open_store
    from tests.chart_data import idle_worker, seed

    tmp = tmp_path_factory.mktemp("detail")
    store = open_store(f"sqlite:///{tmp / 'draftlab.db'}")
    ids = seed(store, tmp / "models")
    idle_worker(store)
    with store.write() as conn:
        conn.execute(
            text(
                "UPDATE runs SET speedup = 1.13, speedup_ci_lo = 0.95, speedup_ci_hi = 1.31 "
                "WHERE experiment_id = :eid AND kind = 'speculative'"
            ),
            {"eid": ids["validation"]},
        )
    store.dispose()
    with dashboard(tmp, DRAFTLAB_MODELS=str(tmp / "models")) as running:
        yield {**running, "ids": ids}


def _selected_tab(page) -> str:
    return page.locator('[data-testid="stTab"][aria-selected="true"]').first.inner_text().strip()


def _overflowing_tables(page) -> list[str]:
    """Tables whose box runs past the window's right edge (cut off), by their first column headers."""
    boxes = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stDataFrame"]')].map(t => {
      const box = t.getBoundingClientRect(); return {right: box.right, text: t.innerText.slice(0, 60)}; })""")
    return [f"{b['text']!r} ends at {b['right']:.0f} px" for b in boxes if b["right"] > WIDTH]


def _headline(page) -> dict[str, str]:
    return dict(
        zip(
            page.locator('[data-testid="stMetricLabel"]').all_inner_texts(),
            page.locator('[data-testid="stMetricValue"]').all_inner_texts(),
        )
    )


def test_every_section_opens_from_its_link_and_draws_its_charts(served):
    from pages.panels import sections
    from tests.chart_data import NAMES

    url, ids = served["url"], served["ids"]
    problems, drawn = [], {}
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 1200})
        page.set_default_timeout(60_000)
        messages = collect_errors(page)
        for kind in NAMES:
            for section in sections.ORDER:
                shown = f"{section} of the {kind} experiment"
                page.goto(f"{url}/experiment?experiment={ids[kind]}&section={quote(section)}")
                page.locator("h1").first.wait_for()
                settle(page)
                found, count = page_problems(page, shown, messages, section in CHARTED)
                if _selected_tab(page) != section:
                    found.append(f"{shown}: the link opened {_selected_tab(page)!r}")
                found += [f"{shown}: {t}" for t in _overflowing_tables(page)]
                if found:
                    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(SCREENSHOTS / f"detail-{kind}-{len(problems)}.png"), full_page=True)
                problems += found
                drawn[shown] = count
    assert not problems, (
        "\n".join(problems)
        + f"\n(charts per section: {drawn})\nui log tail:\n"
        + served["log"].read_text(errors="replace")[-2000:]
    )


def test_a_click_opens_a_section_and_the_headline_is_the_verdicts(served):
    from storage import open_store
    from storage.analysis.verdict import verdict

    url, ids = served["url"], served["ids"]
    store = open_store(served["db"])
    with chromium() as browser:
        page = browser.new_page(viewport={"width": WIDTH, "height": 1200})
        page.set_default_timeout(60_000)
        messages = collect_errors(page)
        # The first demo run: the headline serves the target alone, as its verdict says.
        page.goto(f"{url}/experiment?experiment={ids['validation']}")
        settle(page)
        judged = verdict(store, ids["validation"])
        assert judged.k == 0
        headline = _headline(page)
        assert headline["k to serve"] == "0 (target alone)" and headline["Speedup"] == "1× (target alone)"
        said = page.locator('[data-testid="stAlert"]').filter(has_text="Verdict").inner_text()
        assert "serve the target alone (k = 0)" in said and "Best k" not in headline

        # A sweep whose verdict serves a cheaper tied k: that k heads the page, the best measured beside it.
        page.goto(f"{url}/experiment?experiment={ids['k']}")
        settle(page)
        judged = verdict(store, ids["k"])
        headline = _headline(page)
        assert headline["k to serve"] == str(judged.chosen.value) != str(judged.best.value)
        assert (
            f"take the cheaper tied k = {judged.chosen.value}"
            in page.locator('[data-testid="stAlert"]').filter(has_text="Verdict").inner_text()
        )
        assert f"best measured: k {judged.best.value}" in page.locator('[data-testid="stMetricDelta"]').inner_text()
        assert page.locator('[data-testid="stVegaLiteChart"]').count() == 1  # the answer's chart, nothing else
        assert "section=" not in page.url

        page.get_by_role("tab", name="Predictions and cost").click()
        settle(page)
        assert "section=Predictions" in page.url and _selected_tab(page) == "Predictions and cost"
        assert page.get_by_text("Predicted against measured").count() == 1
        assert page.locator('[data-testid="stVegaLiteChart"]').count() == 0  # the Verdict's chart is not redrawn
        page.get_by_role("tab", name="Verdict").click()
        settle(page)
        assert page.locator('[data-testid="stVegaLiteChart"]').count() == 1
        found, _ = page_problems(page, "tabs clicked", messages, True)
        assert not found, found
    store.dispose()
