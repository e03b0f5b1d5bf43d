"""The collapse finding (storage/analysis/collapse.py, storage/analysis/findings/acceptance_collapse.py): a confirmed
EAGLE-3 head whose server acceptance is under half the lab's with both intervals making it certain names the head
directory and what to check (aux-layer ids, norm_before_fc, d2t, chat template); the same low rate over too few drafts
to be certain, or a server that accepts like the lab, says nothing. Counters are stored as a confirm stores them, beside
a tiny lab experiment's run (tests/test_confirm_job's `lab`)."""

from __future__ import annotations

import json

import pytest

from engine.metrics.stats import wilson_interval
from storage.analysis.collapse import lab_rate
from storage.analysis.findings import findings
from tests.meaning import missing
from tests.test_confirm_job import lab  # noqa: F401 - the fixture: a tiny k 1,2 experiment run through the CLI

HEAD = "/models/heads/llama-eagle3"


def _store_confirm(store, eid, run, *, drafts: int, accepted: int, method: str = "eagle3") -> int:
    from app.serving.completions_load import PassRecord, RequestRecord
    from app.serving.production_scrape import SpecCounters
    from storage.records.confirms import add_measurement, finish_confirm, start_confirm, summarize

    k = int(run["k"])
    passes = [PassRecord(1, 1.0, [RequestRecord(0, 0.0, [0.5, 1.0], [1, 2], [1, 2, 3])])]
    cid = start_confirm(store, eid, configs="all", concurrency=[1], repeats=1)
    config = {"method": method, "model": HEAD, "num_speculative_tokens": k}
    first = min(drafts, accepted)  # every accepted token at position 1 first, the rest at 2
    add_measurement(
        store,
        cid,
        eid,
        label=f"run {run['run_id']}",
        k=k,
        run_id=run["run_id"],
        concurrency=1,
        speculative_config=json.dumps(config),
        passes=passes,
        figures=summarize(passes),
        counters=SpecCounters(
            drafts=drafts,
            draft_tokens=k * drafts,
            accepted=accepted,
            per_position={1: first, 2: accepted - first} if k == 2 else {1: first},
        ),
        matches={"outputs_match_server_baseline": 1.0, "outputs_match_lab": 1.0, "first_divergence": None},
    )
    finish_confirm(store, cid, engine_version="x", wall_seconds=1.0, errors=[])
    return cid


def _collapses(store, eid) -> list[dict]:
    return [f for f in findings(store, eid) if f["kind"] == "confirm" and "collapses" in f["title"]]


@pytest.fixture()
def k2(lab):  # noqa: F811
    doc, store = lab
    run = next(r for r in doc["runs"] if r["k"] == 2)
    value, lo, hi, prompts = lab_rate(store, run["run_id"])
    assert prompts >= 2 and lo > 0.06, (value, lo, hi)  # a lab rate the server can fall far below (4 prompts)
    return doc["experiment_id"], store, run, (value, lo, hi)


def test_a_served_head_far_below_the_lab_names_the_head_and_what_to_check(k2):
    eid, store, run, (value, lo, hi) = k2
    _store_confirm(store, eid, run, drafts=400, accepted=8)  # 1 % of 800 draft tokens
    (found,) = _collapses(store, eid)
    assert found["severity"] == "warning"
    where = ("vLLM", "EAGLE-3", f"run {run['run_id']} ", "(k=2)", "concurrency 1", "collapses")
    assert not missing(found["title"], *where), found["title"]
    assert "server accepts 0.010" in found["detail"], found["detail"]  # 8 of 800 draft tokens
    assert f"the lab {value:.3f} ({lo:.3f}–{hi:.3f} over" in found["detail"] and HEAD in found["detail"]
    for words in (
        "INPUT of decoder layer i",
        "OUTPUT of layer i, one lower",
        "norm_before_fc",
        "SGLang never applies",
        "d + d2t[d]",
        "chat template",
        f"draftlab check-head {HEAD} --target ",
    ):
        assert words in found["next"], words
    data = found["data"]
    assert data["head"] == HEAD and data["checks"] == ["aux_layer_ids", "norm_before_fc", "d2t", "chat_template"]
    assert data["collapsed"] and data["server_hi"] < 0.5 * data["lab_lo"] and data["drafts"] == 400


def test_the_same_low_rate_over_too_few_drafts_is_not_certain(k2):
    eid, store, run, (value, lo, hi) = k2
    _store_confirm(store, eid, run, drafts=3, accepted=0)
    assert wilson_interval(0, 3)[1] > 0.5 * lo  # 0 of 3 rounds: the server's interval still reaches half the lab's
    assert not _collapses(store, eid)


def test_a_server_that_accepts_like_the_lab_does_not_collapse(k2):
    eid, store, run, (value, lo, hi) = k2
    drafts = 400
    _store_confirm(store, eid, run, drafts=drafts, accepted=round(value * 2 * drafts))
    assert not _collapses(store, eid)


def test_another_drafter_collapsing_says_the_server_drafts_with_something_else(k2):
    eid, store, run, _ = k2
    _store_confirm(store, eid, run, drafts=400, accepted=8, method="draft_model")
    (found,) = _collapses(store, eid)
    assert found["title"] == f"In vLLM, run {run['run_id']} (k=2) at concurrency 1 collapses"
    assert "the speculative config's model" in found["next"] and found["data"]["head"] is None


def test_the_collapse_rule_at_its_edges():
    """wilson_interval against known values; `collapse`'s threshold: the server's upper bound against half the
    lab's lower bound."""
    lo, hi = wilson_interval(10, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.0552, 0.1744)  # the textbook Wilson interval of 10 / 100
    assert wilson_interval(0, 0) is None and wilson_interval(0, 50)[0] == 0.0
