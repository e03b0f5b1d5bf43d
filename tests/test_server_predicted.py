"""storage/records/prompt_positions.py and storage/analysis/server_predicted.py on a real tiny decode (a noisy-copy
draft at k 3, greedy) recorded into SQLite and PostgreSQL: the per-prompt, per-position counts equal the engine's
rounds counted in Python, pool to production.lab_positions' conditional rates, and give the speedups
engine/metrics/server_prediction.py predicts from the same arrays, in the documented JSON shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.decoding import runs
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.metrics.server_prediction import pooled_acceptance, predict_server_speedups, server_schedule
from storage.analysis.server_predicted import server_predicted
from storage.jobs import run_state
from storage.records.production import lab_positions
from storage.records.prompt_positions import prompt_positions
from tests import tiny_models as tm
from tests.test_storage import enqueue, record, run_ids

K = 3
MAX_NEW_TOKENS = 30
PROMPTS = ["t5", "t9 t3 t22", "t40 t41 t2 t8", "t12 t13 t14 t15 t16 t17"]
# concurrency 1 profiles k 0, 1 and 3 (k 2 is interpolated), concurrency 4 every k to 3; five passes each
PROFILE = {
    1: {
        0: [0.010, 0.011, 0.010, 0.012, 0.010],
        1: [0.012, 0.012, 0.013, 0.013, 0.012],
        3: [0.015, 0.016] * 2 + [0.015],
    },
    4: {k: [0.020 * (1 + 0.3 * k) * d for d in (1.0, 1.05, 0.97, 1.02, 1.0)] for k in range(4)},
}


@pytest.fixture(scope="module")
def decoded():
    """(baseline results, speculative results at k 3) of the tiny llama pair on PROMPTS."""
    target = tm.llama(0, layers=2, sharpness=4.0)
    pair = tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.6))
    cfg = SamplingConfig(temperature=0, max_new_tokens=MAX_NEW_TOKENS)
    ids = runs.encode_prompts(pair, PROMPTS, MAX_NEW_TOKENS)
    base = list(runs.run_prompts(runs.baseline_decoder(pair, cfg), PROMPTS, ids))
    spec = list(runs.run_prompts(runs.speculative_decoder(pair, cfg, K), PROMPTS, ids))
    return base, spec


def _recorded(store, decoded) -> tuple[int, int]:
    """The decode stored as a finished k-3 experiment: (baseline run id, speculative run id)."""
    base, spec = decoded
    eid = enqueue(store, ks=(K,), prompts=len(PROMPTS), sampling={"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS})
    ids = run_ids(store, eid)
    assert sorted(run_state.claim_group(store, eid, "test-worker")) == sorted(ids.values())
    for kind, results in (("baseline", base), ("speculative", spec)):
        rid = ids[(kind, None if kind == "baseline" else K)]
        run_state.start_run(store, rid, len(PROMPTS), "cpu")
        for result in results:
            record(store, rid, kind, result)
        run_state.finish_run(store, rid, "done")
    return ids[("baseline", None)], ids[("speculative", K)]


def _oracle(results) -> tuple[list[int], np.ndarray, np.ndarray]:
    """From the engine's rounds, in Python: a round reached position j when its first j - 1 drafts were accepted and
    verification judged the j-th (j ≤ accepted + rejected: a draft past a rejection or a cut is not judged), and
    accepted there when j ≤ its accepted drafts."""
    reached = np.zeros((len(results), K), dtype=int)
    accepted = np.zeros((len(results), K), dtype=int)
    for i, result in enumerate(results):
        for r in result.rounds:
            for j in range(1, K + 1):
                reached[i, j - 1] += j <= r.accepted + r.rejected
                accepted[i, j - 1] += j <= r.accepted
    return [r.prompt_index for r in results], reached, accepted


def test_prompt_positions_count_the_engines_rounds(store, decoded):
    base_id, spec_id = _recorded(store, decoded)
    prompts, reached, accepted = prompt_positions(store, spec_id)
    want_prompts, want_reached, want_accepted = _oracle(decoded[1])
    assert prompts == want_prompts == list(range(len(PROMPTS)))
    assert reached.shape == accepted.shape == (len(PROMPTS), K)
    assert reached.tolist() == want_reached.tolist()
    assert accepted.tolist() == want_accepted.tolist()
    # the draft both hits and misses at every position, and fewer rounds reach each next position
    assert (accepted.sum(0) > 0).all() and (accepted.sum(0) < reached.sum(0)).all()
    assert (np.diff(reached.sum(0)) < 0).all()
    # per prompt, the positions' accepted drafts are the prompt's accepted drafts
    assert accepted.sum(1).tolist() == [sum(r.accepted for r in p.rounds) for p in decoded[1]]
    # a target-only run drafted nothing
    none, r0, a0 = prompt_positions(store, base_id)
    assert none == [] and r0.shape == a0.shape == (0, 0)


def test_pooled_over_prompts_they_are_lab_positions(store, decoded):
    _, spec_id = _recorded(store, decoded)
    _, reached, accepted = prompt_positions(store, spec_id)
    lab = lab_positions(store, spec_id)
    assert lab["position"].tolist() == list(range(1, K + 1))
    assert lab["reached"].tolist() == reached.sum(0).tolist()
    assert lab["conditional"].tolist() == pytest.approx(pooled_acceptance(reached, accepted), rel=1e-12)


def test_server_predicted_is_the_prediction_from_the_same_counts(store, decoded):
    base_id, spec_id = _recorded(store, decoded)
    _, reached, accepted = prompt_positions(store, spec_id)
    got = server_predicted(store, spec_id, PROFILE, seed=3)
    assert json.loads(json.dumps(got, allow_nan=False)) == got  # strict JSON as it stands
    assert set(got) == {
        "run_id",
        "prompts",
        "positions",
        "acceptance",
        "confidence",
        "samples",
        "seed",
        "concurrency",
        "schedule",
    }
    assert (got["run_id"], got["prompts"], got["positions"], got["seed"]) == (spec_id, len(PROMPTS), K, 3)
    assert got["acceptance"] == pytest.approx(pooled_acceptance(reached, accepted))
    expected = predict_server_speedups(reached, accepted, PROFILE, seed=3)
    assert sorted(got["concurrency"]) == ["1", "4"]
    assert [(c, sorted(by_k)) for c, by_k in sorted(got["concurrency"].items())] == [
        ("1", ["1", "2", "3"]),
        ("4", ["1", "2", "3"]),
    ]
    for p in expected:
        cell = got["concurrency"][str(p.concurrency)][str(p.k)]
        assert set(cell) == {"speedup", "speedup_ci", "tokens_per_step", "step_seconds_ratio", "interpolated"}
        assert cell["speedup"] == p.speedup and cell["speedup_ci"] == [p.lo, p.hi]
        assert cell["tokens_per_step"] == p.tokens_per_step and cell["step_seconds_ratio"] == p.step_seconds_ratio
        assert cell["interpolated"] == (p.concurrency == 1 and p.k == 2)
        assert cell["speedup_ci"][0] <= cell["speedup"] <= cell["speedup_ci"][1]
    assert got["schedule"] == {str(c): k for c, k in server_schedule(expected).items()}
    assert server_predicted(store, spec_id, PROFILE, seed=3) == got  # seeded
    assert server_predicted(store, spec_id, PROFILE, seed=4)["concurrency"] != got["concurrency"]
    # a profile up to k 1 at one concurrency predicts k 1 only, everywhere
    short = {**PROFILE, 2: {0: [0.01, 0.011], 1: [0.012, 0.013]}}
    assert {c: sorted(by_k) for c, by_k in server_predicted(store, spec_id, short)["concurrency"].items()} == {
        "1": ["1"],
        "2": ["1"],
        "4": ["1"],
    }
    with pytest.raises(DraftLabError, match=f"run {base_id} stored no draft tokens"):
        server_predicted(store, base_id, PROFILE)
    with pytest.raises(DraftLabError, match="measured no k from 1 to 3"):
        server_predicted(store, spec_id, {1: {0: [0.01]}})
