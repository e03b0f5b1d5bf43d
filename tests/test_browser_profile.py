"""The "Server cost profile" panel of the experiment detail page, in Chromium:

- a page open while a profile runs shows its progress (requests done of the total, from the database) and, once the
  profile ends in the database (as a worker ends it), its cost table and its t_k / t_0 chart, without a reload;
- a page opened on an experiment with a finished profile draws the table (its CSV: each concurrency and k, t_k / t_0
  with its interval, the server's tokens per step) and the chart, says what the profile holds for and what it cannot
  stand in for; its form refuses bad ks in one line and queues a good profile (then shows it waiting for a worker).

Data: tests/chart_data.py's seeded database (its idle worker claims nothing); each profile is claimed by that worker
and its measurements written as the measuring loop writes them (storage/records/confirms.py)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest
from playwright.sync_api import expect
from sqlalchemy import text

from tests.browser import (
    chromium,
    collect_errors,
    field,
    needs_chromium,
    new_page,
    page_problems,
    seeded_dashboard,
    settle,
)
from tests.meaning import missing

pytestmark = needs_chromium
SECTION = "Confirm in vLLM"  # the detail page's tab that holds the confirm and profile panels
WORKER = "chart-test (idle)"  # tests/chart_data.py's idle_worker
FOLLOWS_WITHIN_S = 8.0  # a 2 s refresh, a page redraw on a loaded 2-core machine, and some slack
STEP = {0: 0.010, 1: 0.013, 2: 0.016}  # seconds per engine step of each k at concurrency 1 (×1.5 at 2)
HARDWARE = "1 × test CPU <b>&"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with seeded_dashboard(tmp_path_factory.mktemp("profile")) as running:
        yield running


def _running_profile(db: str, experiment_id: int) -> int:
    """A profile of the experiment's default run at k 1 and 2, concurrency 1 and 2, queued, claimed by the idle
    worker and reporting 12 of 32 requests done."""
    from storage import open_store
    from storage.serving.confirm_jobs import PROFILE, claim_confirm, enqueue_confirm, report_confirm

    store = open_store(db)
    try:
        pid = enqueue_confirm(store, experiment_id, configs=PROFILE, ks="1,2", concurrency=[1, 2], repeats=2)
        assert claim_confirm(store, pid, WORKER)
        report_confirm(store, pid, WORKER, phase="k=2 concurrency 2 pass 1/2", requests_total=32, requests_done=12)
    finally:
        store.dispose()
    return pid


def _finish(db: str, experiment_id: int, profile_id: int) -> None:
    """The profile's measurements as the measuring loop stores them, then the profile closed as done."""
    from app.serving.completions_load import PassRecord, RequestRecord
    from storage import open_store
    from storage.records.confirms import add_measurement, describe_confirm, finish_confirm, summarize
    from storage.serving.confirm_jobs import get_confirm
    from storage.serving.deploy import deploy_document

    store = open_store(db)
    try:
        job = get_confirm(store, profile_id)
        assert job is not None
        vllm = deploy_document(store, experiment_id, job["profile_run_id"])["engines"]["vllm"]
        spec = json.loads(vllm["speculative_config"])
        spec.pop("num_speculative_tokens_per_batch_size", None)
        describe_confirm(store, profile_id, hardware=HARDWARE, target="the target")
        for c in (1, 2):
            for k in (0, 1, 2):
                step = STEP[k] * (1 + (c - 1) / 2)
                passes = [
                    PassRecord(
                        c,
                        1.0,
                        [RequestRecord(0, 0.0, [step * (j + p / 10) for j in range(9)], [1] + [1 + k] * 8, [1] * 9)],
                        decode_steps=8,
                    )
                    for p in range(2)
                ]
                add_measurement(
                    store,
                    profile_id,
                    experiment_id,
                    label="target-only" if k == 0 else f"run {job['profile_run_id']} at k={k}",
                    k=k,
                    run_id=None,
                    speculative_config=json.dumps({**spec, "num_speculative_tokens": k}) if k else None,
                    concurrency=c,
                    passes=passes,
                    figures=summarize(passes),
                )
        assert finish_confirm(
            store, profile_id, engine_version="0.32.0", wall_seconds=42.0, errors=[], worker_id=WORKER
        )
    finally:
        store.dispose()


def _open(page, url: str, experiment_id: int) -> None:
    page.goto(f"{url}/experiment?experiment={experiment_id}&section={quote(SECTION)}")
    settle(page)
    page.get_by_role("button", name="Queue profile").wait_for()


ENDED_JS = """() => !document.body.innerText.includes('12 of 32 requests') && Array.from(
  document.querySelectorAll('h4')).some(h => h.innerText.trim() === 't_k / t_0 vs k')"""  # results, no progress


COST_TABLE = "Step cost per concurrency and k"  # the table's heading
COST_CHART = "t_k / t_0 vs k"  # the chart's heading


def _column(page, heading: str):
    """The page column under `heading` (the panel's table and chart are side by side)."""
    return page.locator('[data-testid="stColumn"]', has=page.get_by_role("heading", name=heading, exact=True)).last


def _drawn(page) -> list[str]:
    """What is missing of the profile's results on the page: its table (drawn, with a size) and its chart (drawn under
    its heading)."""
    from tests.browser import CHARTS_JS

    found = []
    box = _column(page, COST_TABLE).locator('[data-testid="stDataFrame"]').bounding_box()
    if not box or box["height"] < 40 or box["width"] < 100:
        found.append(f"the cost table is not drawn: {box}")
    charts = [c for c in page.evaluate(CHARTS_JS) if c["heading"] == COST_CHART]
    if len(charts) != 1 or not charts[0]["drawn"] or charts[0]["height"] <= 0:
        found.append(f"the t_k / t_0 chart is not drawn: {charts}")
    return found


def _costs(page) -> pd.DataFrame:
    """The cost table's CSV, downloaded from its button."""
    with page.expect_download(timeout=60_000) as info:
        _column(page, COST_TABLE).locator('[data-testid="stDownloadButton"] button').click()
    return pd.read_csv(io.BytesIO(Path(info.value.path()).read_bytes()))


def test_the_page_open_while_a_profile_runs_shows_it_once_it_ends(served):
    ids, db = served["ids"], served["db"]
    pid = _running_profile(db, ids["k"])
    with chromium() as browser:
        page, messages = new_page(browser)
        _open(page, served["url"], ids["k"])
        page.get_by_text("12 of 32 requests").first.wait_for()
        progress = page.get_by_text(f"Profile {pid} (").first.inner_text()
        results_while_running = page.get_by_text(COST_CHART, exact=True).count()
        disabled = page.get_by_role("button", name="Queue profile").is_disabled()
        page.wait_for_timeout(3000)
        _finish(db, ids["k"], pid)
        started = time.monotonic()
        page.wait_for_function(ENDED_JS, timeout=30_000)
        waited = time.monotonic() - started
        settle(page)
        problems, _ = page_problems(page, "Server cost profile", messages, charted=True)
        problems += _drawn(page)
    assert not missing(progress, "k 1,2", "concurrency 1,2", "k=2 concurrency 2 pass 1/2"), progress
    assert results_while_running == 0 and disabled, "no results, and nothing to queue, while it runs"
    assert waited <= FOLLOWS_WITHIN_S, f"the panel said running {waited:.1f} s after the profile ended"
    assert not problems, "\n".join(problems)


def test_a_finished_profile_draws_its_table_and_chart_and_the_form_queues_another(served):
    from storage import open_store
    from storage.serving.confirm_jobs import confirm_jobs

    ids, db = served["ids"], served["db"]
    eid = ids["draft"]
    pid = _running_profile(db, eid)
    _finish(db, eid, pid)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1500, "height": 1400}, accept_downloads=True)
        page.set_default_timeout(60_000)
        messages = collect_errors(page)
        _open(page, served["url"], eid)
        page.get_by_text(COST_CHART, exact=True).wait_for()
        problems, _ = page_problems(page, "Server cost profile", messages, charted=True)
        problems += _drawn(page)
        costs = _costs(page)
        text = page.locator('[data-testid="stMain"]').inner_text()

        field(page, "k values").fill("1,x")
        page.get_by_role("button", name="Queue profile").click()
        settle(page)
        refused = page.locator(
            '[data-testid="stAlertContentError"] [data-testid="stMarkdownContainer"]'
        ).all_inner_texts()
        field(page, "k values").fill("2,1")
        page.get_by_role("button", name="Queue profile").click()
        page.get_by_text("queued: a worker runs it").first.wait_for()  # the toast
        page.get_by_text("queued, waiting for a worker").first.wait_for()  # its progress, from the database
        # no settle: the page now refreshes every 2 s while the profile is queued
        expect(page.get_by_role("button", name="Queue profile")).to_be_disabled()
        found, _ = page_problems(page, "after queuing", messages, charted=True)
        problems += found
    assert not problems, "\n".join(problems)
    assert sorted(zip(costs["concurrency"], costs["k"])) == [(c, k) for c in (1, 2) for k in (0, 1, 2)], costs
    by = costs.set_index(["concurrency", "k"])
    for c in (1, 2):
        assert pd.isna(by.loc[(c, 0), "cost_ratio"]) and by.loc[(c, 0), "tokens_per_step"] == 1.0
        for k in (1, 2):
            row = by.loc[(c, k)]
            assert row["step_ms"] == pytest.approx(1000 * STEP[k] * (1 + (c - 1) / 2))
            assert row["cost_ratio"] == pytest.approx(STEP[k] / STEP[0])
            assert row["lo"] <= row["cost_ratio"] <= row["hi"] and row["tokens_per_step"] == 1 + k
            assert row["interval"] == f"{row['lo']:.2f}–{row['hi']:.2f}"
    # what it holds for, and what it cannot stand in for
    assert not missing(text, "vLLM 0.32.0", HARDWARE, "the target", "cannot stand in for", "proof"), text[-2000:]
    assert len(refused) == 1 and "\n" not in refused[0].strip() and not missing(refused[0], "'x'", "1,2,3,4"), refused
    store = open_store(db)
    listed = confirm_jobs(store, eid)
    store.dispose()
    assert listed["status"].tolist() == ["queued", "done"] and listed["profile_ks"].tolist() == ["1,2", "1,2"]


def test_with_no_run_vllm_can_serve_the_button_is_disabled_and_says_why(served):
    from storage import open_store

    ids, db = served["ids"], served["db"]
    eid = ids["temperature"]
    store = open_store(db)
    try:
        with store.write() as conn:
            conn.execute(
                text("UPDATE runs SET status = 'failed', error = 'seeded' WHERE experiment_id = :e AND kind = :k"),
                {"e": eid, "k": "speculative"},
            )
    finally:
        store.dispose()
    with chromium() as browser:
        page, messages = new_page(browser)
        _open(page, served["url"], eid)
        disabled = page.get_by_role("button", name="Queue profile").is_disabled()
        reasons = page.get_by_text("Nothing to queue now").all_inner_texts()  # the confirm panel's, then this one's
        problems, _ = page_problems(page, "no run to profile", messages, charted=False)
    assert disabled and len(reasons) == 2, reasons
    assert not missing(reasons[-1], "no finished lossless speculative run"), reasons
    assert not problems, "\n".join(problems)
