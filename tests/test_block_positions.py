"""What block verification accepted that the standard rule rejected, per draft position: the storage query
(storage/records/block_positions.py, SQLite and PostgreSQL) against a count over the engine's own rounds of a real
block decode recorded through storage, and the detail page's chart (built by pages/widgets/charts/acceptance.py,
placed by pages/panels/block_panel.py) drawn from exactly the query's rows; a standard run of the same sweep has
neither."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.decoding import runs as decoding
from engine.decoding.sampling import SamplingConfig
from pages.panels.block_panel import TITLE
from pages.widgets.charts import BLOCK_ONLY, STANDARD_ONLY
from storage import open_store
from storage.jobs import run_state
from storage.jobs.experiments import enqueue_experiment
from storage.records import queries as q
from storage.records.block_positions import block_gain_by_position
from tests import tiny_models as tm
from tests.test_pages import app, assert_clean, chart_data
from tests.test_storage import record

PROMPTS = [f"t{i} t{i + 3} t{i + 7}" for i in range(2, 14)]
K, NEW = 4, 24


def fill_verify_experiment(store):
    """A verify sweep (standard, block) at k = K, temperature 1, every run done with a real tiny decode: (experiment
    id, {verify: run id}, {run id: its PromptResults})."""
    eid = enqueue_experiment(
        store,
        name="verify",
        target="tgt",
        draft="drf",
        prompts="inline",
        sampling={"temperature": 1.0, "max_new_tokens": NEW},
        k=K,
        sweep_variable="verify",
        sweep_values=["standard", "block"],
        prompt_texts=PROMPTS,
    )
    frame = q.runs(store, eid)
    baseline_id = int(frame[frame["kind"] == "baseline"]["run_id"].iloc[0])
    by_rule = {str(r.verify): int(r.run_id) for r in frame[frame["kind"] == "speculative"].itertuples()}
    target = tm.llama(0, layers=2, sharpness=4.0)
    pair = tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.6))
    ids = decoding.encode_prompts(pair, PROMPTS, NEW)
    indices = list(range(len(PROMPTS)))
    results = {
        baseline_id: [
            decoding.baseline_decoder(pair, SamplingConfig(temperature=1.0, max_new_tokens=NEW)).generate(p, i, n)
            for n, (p, i) in enumerate(zip(PROMPTS, ids))
        ]
    }
    for rule, rid in by_rule.items():
        cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=2, verify=rule)
        results[rid] = decoding.speculative_decoder(pair, cfg, K).generate_batch(PROMPTS, ids, indices)
    run_state.claim_group(store, eid, "test-worker")
    for rid, rows in results.items():
        run_state.start_run(store, rid, len(PROMPTS), "cpu")
        for result in rows:
            record(store, rid, "baseline" if rid == baseline_id else "speculative", result)
        run_state.finish_run(store, rid, "done")
    return eid, by_rule, results


@pytest.fixture
def verify_experiment(store):
    return fill_verify_experiment(store)


def test_the_query_counts_what_each_rule_accepted_per_position(store, verify_experiment):
    _, by_rule, results = verify_experiment
    block = block_gain_by_position(store, by_rule["block"])
    expected: dict[str, Counter] = {name: Counter() for name in block.columns if name != "position"}
    for prompt in results[by_rule["block"]]:
        for rd in prompt.rounds:
            for i in range(1, rd.k + 1):
                expected["drafted"][i] += 1
                expected["block"][i] += i <= rd.accepted
                expected["standard"][i] += i <= rd.accepted_standard
                expected["block_only"][i] += rd.accepted_standard < i <= rd.accepted
                expected["standard_only"][i] += rd.accepted < i <= rd.accepted_standard
    assert block["position"].tolist() == list(range(1, K + 1))
    for name, counts in expected.items():
        assert block[name].tolist() == [counts[i] for i in range(1, K + 1)], name
    assert block["block_only"].sum() > 0  # the decode has rounds where the rules differ
    assert (block["block"] - block["standard"]).tolist() == (block["block_only"] - block["standard_only"]).tolist()
    assert block_gain_by_position(store, by_rule["standard"]).empty
    runs = q.runs(store, verify_experiment[0]).set_index("run_id")
    assert runs.loc[by_rule["block"], "accepted_standard"] == sum(
        rd.accepted_standard for p in results[by_rule["block"]] for rd in p.rounds
    )


def _gain_datasets(at):
    return [d for datasets in chart_data(at) for d in datasets if {"position", "which", "share"} <= set(d.columns)]


def test_the_detail_page_draws_the_block_runs_gain_and_none_for_the_standard_run(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'draftlab.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    store = open_store(url)
    eid, by_rule, _ = fill_verify_experiment(store)
    at = app("experiment", experiment=eid, section="Why drafts are rejected", run=by_rule["block"])
    assert_clean(at)
    assert TITLE in [s.value for s in at.subheader]
    (drawn,) = _gain_datasets(at)
    expected = block_gain_by_position(store, by_rule["block"])
    for which, column in ((BLOCK_ONLY, "block_only"), (STANDARD_ONLY, "standard_only")):
        got = drawn[drawn["which"] == which].sort_values("position")
        assert got["rounds"].tolist() == expected[column].tolist()
        assert got["share"].tolist() == pytest.approx((expected[column] / expected["drafted"]).tolist())
    run = q.runs(store, eid).set_index("run_id").loc[by_rule["block"]]
    text = " ".join(m.value for m in at.markdown)
    assert (
        f"{run['accepted'] / run['rounds']:.2f}" in text and f"{run['accepted_standard'] / run['rounds']:.2f}" in text
    )
    at = app("experiment", experiment=eid, section="Why drafts are rejected", run=by_rule["standard"])
    assert_clean(at)
    assert TITLE not in [s.value for s in at.subheader] and not _gain_datasets(at)
