"""Findings from a stored confirm (storage/analysis/findings/confirm.py): in the server, a configuration that gains
or loses at a concurrency, beside the lab's figure at the same batch size (a lab gain the server does not show is a
warning); greedy outputs that speculation changed in the server (an error); the first draft position where the server's
acceptance lies outside the lab run's interval. And a confirm's counters are not also reported as "production" (they are
the same prompts, not traffic)."""

from __future__ import annotations

import json

from storage.analysis.findings import findings
from tests.chart_data import seed_confirm
from tests.meaning import missing
from tests.test_confirm_job import lab  # noqa: F401 - the fixture: a tiny k 1,2 experiment run through the CLI
from tests.test_pages import empty_db  # noqa: F401 - the fixture grid needs
from tests.test_pages_schedule import grid  # noqa: F401 - the fixture: a crafted k grid, k 2 / 1 / off


def _confirm_findings(store, eid) -> dict[str, dict]:
    return {f["title"]: f for f in findings(store, eid) if f["kind"] == "confirm"}


def test_the_server_gains_or_loses_at_each_concurrency_beside_the_lab(grid):  # noqa: F811
    store, eid, ids = grid
    seed_confirm(store, eid, concurrency=(1, 4, 16))  # vLLM: 2× at 1, 0.91× at 4, 0.29× at 16 (tight intervals)
    found = _confirm_findings(store, eid)
    gains = found["In vLLM, schedule (k=2) at concurrency 1 gains"]
    assert gains["severity"] == "info" and not missing(gains["detail"], "1.40× (1.32–1.48)", "batch size 1")
    assert gains["data"]["speedup"] == 2.0 and gains["data"]["gains"] is True
    loses = found["In vLLM, schedule (k=1) at concurrency 4 loses"]
    assert loses["severity"] == "warning"  # the lab gained there (1.10×, 1.05–1.15): it does not carry over
    assert not missing(loses["detail"], "1.10× (1.05–1.15)", "batch size 4"), loses["detail"]
    off = found["In vLLM, schedule (k=0) at concurrency 16 loses"]
    assert off["severity"] == "info" and not missing(off["detail"], "target alone", "batch size 16")
    assert not [f for f in findings(store, eid) if f["kind"] == "production"]


def test_changed_outputs_and_acceptance_outside_the_labs_interval(lab):  # noqa: F811
    from app.serving.completions_load import PassRecord, RequestRecord
    from app.serving.production_scrape import SpecCounters
    from storage.records.confirms import add_measurement, finish_confirm, start_confirm, summarize

    doc, store = lab
    eid = doc["experiment_id"]
    run = next(r for r in doc["runs"] if r["k"] == 2)
    passes = [PassRecord(1, 1.0, [RequestRecord(0, 0.0, [0.5, 1.0], [1, 2], [1, 2, 3])])]
    cid = start_confirm(store, eid, configs="all", concurrency=[1], repeats=1)
    add_measurement(
        store,
        cid,
        eid,
        label=f"run {run['run_id']}",
        k=2,
        run_id=run["run_id"],
        concurrency=1,
        speculative_config=json.dumps({"method": "draft_model", "num_speculative_tokens": 2}),
        passes=passes,
        figures=summarize(passes),
        speedup=(1.1, None),
        counters=SpecCounters(drafts=1000, draft_tokens=2000, accepted=3, per_position={1: 2, 2: 1}),
        matches={
            "outputs_match_server_baseline": 0.5,
            "outputs_match_lab": 0.5,
            "first_divergence": "prompt 1 differs from the server's baseline at token 4 (server 7, "
            "the server's baseline 9)",
        },
    )
    finish_confirm(store, cid, engine_version="x", wall_seconds=1.0, errors=[])
    found = _confirm_findings(store, eid)
    where = f"run {run['run_id']} (k=2) at concurrency 1"
    changed = found[f"In vLLM, {where} changes the outputs"]
    assert changed["severity"] == "error" and "only 50 % of the prompts" in changed["detail"]
    assert not missing(changed["detail"], "prompt 1", "baseline", "token 4"), changed["detail"]
    accepts = found[f"In vLLM, {where} accepts differently at position 1"]
    assert not missing(accepts["detail"], "server accepts 0.002", "position 1"), accepts["detail"]
    assert accepts["data"]["position"]["position"] == 1
    assert not any("gains" in t or "loses" in t for t in found)  # one pass: no interval, nothing said
    assert not [f for f in findings(store, eid) if f["kind"] == "production"]  # the confirm's rule says it


def test_a_schedules_positions_are_judged_only_where_every_served_k_reaches(lab):  # noqa: F811
    from app.serving.completions_load import PassRecord, RequestRecord
    from app.serving.production_scrape import SpecCounters
    from storage.records.confirms import add_measurement, finish_confirm, start_confirm, summarize
    from storage.records.production import lab_positions

    doc, store = lab
    eid = doc["experiment_id"]
    run = next(r for r in doc["runs"] if r["k"] == 2)
    first = float(lab_positions(store, run["run_id"])["conditional"].iloc[0])
    # k 1 for a lone request, 2 from two on: at concurrency 2 rounds of k 1 and 2 mix, position 2 is not comparable
    schedule = {
        "method": "draft_model",
        "num_speculative_tokens": 2,
        "num_speculative_tokens_per_batch_size": [[1, 1, 1], [2, 8, 2]],
    }
    passes = [PassRecord(2, 1.0, [RequestRecord(0, 0.0, [0.5, 1.0], [1, 2], [1, 2, 3])])]
    cid = start_confirm(store, eid, configs="schedule", concurrency=[2], repeats=1)
    add_measurement(
        store,
        cid,
        eid,
        label="schedule",
        k=2,
        run_id=run["run_id"],
        concurrency=2,
        speculative_config=json.dumps(schedule),
        passes=passes,
        figures=summarize(passes),
        counters=SpecCounters(
            drafts=1000,
            draft_tokens=1500,
            accepted=round(1000 * first) + 1,
            per_position={1: round(1000 * first), 2: 1},
        ),
        matches={"outputs_match_server_baseline": 1.0, "outputs_match_lab": 1.0, "first_divergence": None},
    )
    finish_confirm(store, cid, engine_version="x", wall_seconds=1.0, errors=[])
    assert not [t for t in _confirm_findings(store, eid) if "accepts differently" in t]
