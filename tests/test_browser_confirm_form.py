"""Queue confirm is offered only where pressing it queues a confirm, in Chromium (issue 35 item 10): the panel
offers the configurations storage/serving/confirm_jobs.py's check (the one pressing runs) lets through and says why the
others are not offered; with none, or with a confirm unfinished, its button is disabled with the reason beside it.

- A k sweep whose every run is measurably slower than the target alone (its stored speedups set to 0.9) and
  lossless: the verdict serves the target alone, so `chosen` is not offered (it says so), `all` is, and pressing
  the button queues a confirm (a toast, no error); the button is then disabled while that confirm is queued.
- A draft sweep whose speculative runs failed: nothing can be confirmed, the button is disabled and says why.

Data: tests/chart_data.py's seeded database (its idle worker claims nothing)."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from sqlalchemy import text

from tests.browser import chromium, needs_chromium, new_page, page_problems, seeded_dashboard, settle

pytestmark = needs_chromium
CONFIRM_SECTION = "Confirm in vLLM"  # the detail page's tab that holds the panel
CONFIGS_JS = """() => (document.querySelector('[data-testid="stSelectbox"] input[aria-label="Configurations"]')
  || {}).value || ''"""  # what the Configurations selector shows


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with seeded_dashboard(tmp_path_factory.mktemp("confirm-form")) as running:
        yield running


def _speculative(db: str, experiment_id: int, sql: str) -> None:
    """Run `sql` (an UPDATE of runs `WHERE id IN (...)`) over the experiment's speculative runs."""
    from storage import open_store

    store = open_store(db)
    try:
        with store.write() as conn:
            ids = [
                r
                for (r,) in conn.execute(
                    text("SELECT id FROM runs WHERE experiment_id = :e AND kind = 'speculative'"), {"e": experiment_id}
                )
            ]
            conn.execute(text(sql.format(ids=", ".join(str(int(i)) for i in ids))))
    finally:
        store.dispose()


# The seeded runs' outputs are crafted, not their baselines': give each speculative run its baseline's outputs.
LOSSLESS = """UPDATE prompt_results SET output_ids = (
    SELECT bp.output_ids FROM prompt_results bp JOIN runs r ON bp.run_id = r.baseline_run_id
    WHERE r.id = prompt_results.run_id AND bp.prompt_index = prompt_results.prompt_index)
    WHERE run_id IN ({ids})"""


def _open(page, url: str, experiment_id: int) -> None:
    page.goto(f"{url}/experiment?experiment={experiment_id}&section={quote(CONFIRM_SECTION)}")
    settle(page)
    page.get_by_role("button", name="Queue confirm").wait_for()


def test_queue_confirm_offers_what_it_would_queue_and_is_disabled_with_its_reason_otherwise(served):
    from storage import open_store
    from storage.serving.confirm_jobs import confirm_jobs

    ids, db = served["ids"], served["db"]
    _speculative(
        db, ids["k"], "UPDATE runs SET speedup = 0.9, speedup_ci_lo = 0.85, speedup_ci_hi = 0.95 WHERE id IN ({ids})"
    )  # every k measurably slower: serve the target alone
    _speculative(db, ids["k"], LOSSLESS)  # and each run's outputs its baseline's: `all` can confirm them
    _speculative(db, ids["draft"], "UPDATE runs SET status = 'failed', error = 'seeded failure' WHERE id IN ({ids})")
    with chromium() as browser:
        page, messages = new_page(browser)

        _open(page, served["url"], ids["k"])
        shown = page.evaluate(CONFIGS_JS)
        button = page.get_by_role("button", name="Queue confirm")
        enabled = button.is_enabled()
        reason = page.get_by_text("chosen is not offered").first.inner_text()
        button.click()
        page.get_by_text("queued: a worker runs it").first.wait_for()  # the toast: queued, no error
        settle(page)
        busy = page.get_by_role("button", name="Queue confirm").is_disabled()
        busy_reason = page.get_by_text("one confirm of an experiment at a time").count()
        problems, _ = page_problems(page, "k sweep served alone", messages, charted=False)

        _open(page, served["url"], ids["draft"])
        disabled = page.get_by_role("button", name="Queue confirm").is_disabled()
        nothing = page.get_by_text("Nothing to queue now").first.inner_text()
        found, _ = page_problems(page, "draft sweep with no finished run", messages, charted=False)
        problems += found
    assert shown.startswith("all:") and enabled, (shown, enabled)  # only what it would queue, chosen first no more
    assert "target alone" in reason, reason
    store = open_store(db)
    queued = confirm_jobs(store, ids["k"])
    store.dispose()
    assert list(queued["status"]) == ["queued"] and list(queued["configs"]) == ["all"], queued
    assert busy and busy_reason, "the button stays pressable while its confirm is queued"
    assert disabled and "no finished lossless speculative run" in nothing, nothing
    assert not problems, "\n".join(problems)
