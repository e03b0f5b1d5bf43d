"""Every status on screen follows the database without a reload, in Chromium: a page is opened while work runs,
the work ends in the database (as a worker or `draftlab confirm` ends it), and the page that was open says so
within a few seconds.

- Experiments: two experiments run; one ends while the other still runs (the timer stays the same), and the
  selector's label of the one that ended turns from "(running)" to "(done)" beside the table.
- Confirm in vLLM: a confirm at "running · 108 of 108" is closed as done; the progress goes and its results are
  drawn.

Data: tests/chart_data.py's seeded database, one run put back to running (its heartbeat fresh, held by the idle
worker the seed registers, so no sweep takes it), and its seeded confirm put back to running."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
from sqlalchemy import text

from tests.browser import chromium, needs_chromium, new_page, page_problems, seeded_dashboard, settle

pytestmark = needs_chromium
FOLLOWS_WITHIN_S = 8.0  # a 2 s refresh, a page redraw on a loaded 2-core machine, and some slack
WORKER = "chart-test (idle)"  # tests/chart_data.py's idle_worker
CONFIRM_SECTION = "Confirm in vLLM"  # the detail page's tab that holds the panel (a page of one scroll ignores it)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with seeded_dashboard(tmp_path_factory.mktemp("live")) as running:
        yield running


def _write(db: str, sql: str, **params) -> None:
    from storage import open_store
    from storage.db.schema import utcnow

    store = open_store(db)
    try:
        with store.write() as conn:
            conn.execute(text(sql), {"now": utcnow(), **params})
    finally:
        store.dispose()


def _run_again(db: str, experiment_id: int) -> int:
    """Put the experiment's first speculative run back to running, held by the live idle worker; returns its id."""
    from storage import open_store
    from storage.records import queries as q

    store = open_store(db)
    runs = q.runs(store, experiment_id)
    store.dispose()
    run_id = int(runs.loc[runs["kind"] == "speculative", "run_id"].iloc[0])
    _write(db, "UPDATE runs SET status = 'running', heartbeat = :now, worker_id = :w WHERE id = :r", w=WORKER, r=run_id)
    return run_id


def _seconds_until(page, predicate_js: str, arg, limit_s: float = 30.0) -> float:
    started = time.monotonic()
    page.wait_for_function(predicate_js, arg=arg, timeout=limit_s * 1000)
    return time.monotonic() - started


SELECTED_JS = """() => (document.querySelector('[data-testid="stSelectbox"] input[aria-label="Experiment"]') || {})
  .value || ''"""  # what the Experiment selector shows


def test_the_experiments_selector_follows_a_run_that_ends_while_another_runs(served):
    ids, db = served["ids"], served["db"]
    ended = _run_again(db, ids["k"])
    _run_again(db, ids["draft"])  # still running after the other ends: the page's timer stays the same
    with chromium() as browser:
        page, messages = new_page(browser)
        page.goto(f"{served['url']}/experiments?experiment={ids['k']}")
        page.wait_for_function(f"() => ({SELECTED_JS})().includes('(running)')")
        page.wait_for_timeout(3000)  # the page settles into its 2 s refresh
        _write(db, "UPDATE runs SET status = 'done' WHERE id = :r", r=ended)
        waited = _seconds_until(page, f"() => ({SELECTED_JS})().includes('(done)')", None)
        label = page.evaluate(SELECTED_JS)
        problems, _ = page_problems(page, "Experiments", messages, charted=False)
    assert waited <= FOLLOWS_WITHIN_S, f"the selector said (running) {waited:.1f} s after the run ended: {label!r}"
    assert f"#{ids['k']} ·" in label and "(done)" in label, label
    assert not problems, "\n".join(problems)


ENDED_JS = """() => !document.body.innerText.includes('108 of 108 requests') && Array.from(
  document.querySelectorAll('h4')).some(h => h.innerText.trim() === 'Speedup vs concurrency')"""  # results, no progress


def test_the_confirm_panel_follows_a_confirm_that_ends(served):
    from storage import open_store
    from storage.records.confirms import finish_confirm

    ids, db, confirm_id = served["ids"], served["db"], served["ids"]["confirm"]
    _write(
        db,
        "UPDATE server_confirms SET status = 'running', phase = 'measuring', requests_done = 108, "
        "requests_total = 108, heartbeat = :now WHERE id = :c",
        c=confirm_id,
    )
    with chromium() as browser:
        page, messages = new_page(browser)
        page.goto(f"{served['url']}/experiment?experiment={ids['grid']}&section={quote(CONFIRM_SECTION)}")
        page.get_by_text("108 of 108 requests").first.wait_for()
        assert page.get_by_text("Speedup vs concurrency", exact=True).count() == 0  # no results while it runs
        page.wait_for_timeout(3000)
        store = open_store(db)
        finish_confirm(store, confirm_id, engine_version="0.32.0", wall_seconds=95.0, errors=[])
        store.dispose()
        waited = _seconds_until(page, ENDED_JS, None)
        settle(page)
        problems, charts = page_problems(page, "Confirm in vLLM", messages, charted=True)
    assert waited <= FOLLOWS_WITHIN_S, f"the panel said running {waited:.1f} s after the confirm ended"
    assert not problems, "\n".join(problems)
