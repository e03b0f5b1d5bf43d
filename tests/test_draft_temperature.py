"""draft_temperature: the draft proposes at its own temperature and the output still follows the target's
distribution exactly (the target verifies against the distribution each draft was drawn from); the queue stores it
per run and the worker's sampling configuration carries it."""

import numpy as np
import pytest

from engine.decoding import runs
from engine.decoding.sampling import SamplingConfig
from tests.test_engine_sampling import NEW, K, V, chi2_pvalue, sample_counts_with, setup  # noqa: F401 - fixture


@pytest.mark.parametrize("draft_temperature", [0.4, 2.5])
def test_a_draft_at_its_own_temperature_stays_lossless(setup, draft_temperature):  # noqa: F811 - the fixture
    p, prompt_ids, probs = setup
    counts, acceptance = sample_counts_with(p, prompt_ids, draft_temperature=draft_temperature)
    assert chi2_pvalue(counts, probs) > 1e-3
    _, same = sample_counts_with(p, prompt_ids)
    assert abs(acceptance - same) > 0.02  # the draft really proposed at another temperature


def test_drafts_record_the_distribution_they_were_drawn_from(setup):  # noqa: F811 - the fixture
    """p_draft of each proposed token is its probability under the draft at the draft temperature."""
    import torch

    p, prompt_ids, _ = setup
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=3, draft_temperature=0.4)
    result = runs.speculative_decoder(p, cfg, K).generate("t2 t3", prompt_ids, 0)
    first = result.rounds[0].draft_tokens[0]
    with torch.no_grad():
        logits = p.draft.model(prompt_ids).logits[0, -1, :V].float()
    expected = (logits / 0.4).softmax(-1)[first.token_id].item()
    assert first.p_draft == pytest.approx(expected, rel=1e-4)


def test_each_run_of_a_sweep_decodes_at_its_draft_temperature(store):
    from engine.config.run_config import RunConfig
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q

    cfg = RunConfig.make(
        target="t", prompts="code", draft="d", sweep="draft_temperature", values="0,0.5,1.5", temperature=0.7
    )
    eid = enqueue_experiment(store, **cfg.enqueue(), name="x", prompt_texts=["p"])
    experiment, rows = q.experiment(store, eid), q.runs(store, eid)
    assert (rows["kind"] == "baseline").sum() == 1  # the target's own decoding does not depend on it
    spec = rows[rows["kind"] == "speculative"]
    sampling = [RunConfig.of_run(row.to_dict(), experiment).sampling() for _, row in spec.iterrows()]
    assert sorted(s.draft_temperature for s in sampling) == [
        0.0,
        0.5,
        1.5,
    ]  # what app/worker/timing.py hands the engine
    assert all(s.temperature == 0.7 for s in sampling)


def test_a_bad_draft_temperature_is_one_line():
    from engine.config.run_config import RunConfig
    from engine.errors import DraftLabError

    with pytest.raises(DraftLabError, match=r"draft_temperature\b.*'0\.0001'.*too small"):
        RunConfig.make(target="t", prompts="code", draft_temperature="0.0001")
    with pytest.raises(DraftLabError, match="draft temperature -1 is not 0"):
        SamplingConfig(draft_temperature=-1.0)
    assert np.isfinite(SamplingConfig(draft_temperature=100.0).for_draft().temperature)


def test_a_version_13_database_gains_the_column(tmp_path):
    """schema v15: a database from before the variable gets its column on experiments and runs when opened; its
    old rows read as the default (0: the target's temperature)."""
    from sqlalchemy import inspect, text

    from storage import open_store
    from storage.db.schema import SCHEMA_VERSION

    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = open_store(url)
    with store.write() as conn:
        for table in ("experiments", "runs"):
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN draft_temperature"))
        conn.execute(text("UPDATE schema_info SET version = 13"))
    store.dispose()
    store = open_store(url)
    with store.read() as conn:
        for table in ("experiments", "runs"):
            assert "draft_temperature" in {c["name"] for c in inspect(conn).get_columns(table)}
        assert conn.execute(text("SELECT version FROM schema_info")).scalar() == SCHEMA_VERSION >= 15
    store.dispose()
