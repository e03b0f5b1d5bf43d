"""`--k auto` at batch sizes (issue 20 item 5): the predictor's maths on synthetic inputs whose answer is known,
and `--k auto:K --batch-size 1,2` end to end on tiny random models: a curve per batch size from its own run at K,
confirmations queued at each batch size with a fresh baseline there, each with its prediction_error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from app.sweep import parse_sweep
from engine.metrics.theory import (
    anchored_curve,
    expected_batch_rounds,
    expected_round_length,
    modelled_seconds,
    simulated_rounds,
)
from storage import open_store
from storage.jobs.experiments import load_verify_profiles
from storage.records import queries as q


def test_rounds_follow_the_acceptance_and_the_budget_caps_the_last_drafts():
    rng = np.random.default_rng(0)
    # Every draft accepted: each round emits k+1 tokens, the last rounds draft only what the budget leaves.
    assert simulated_rounds([1.0] * 4, 4, 10, 8, rng).tolist() == [2.0] * 8
    assert simulated_rounds([1.0] * 4, 4, 11, 8, rng).tolist() == [3.0] * 8
    # Nothing accepted: one token a round.
    assert simulated_rounds([0.0] * 4, 4, 7, 8, rng).tolist() == [7.0] * 8
    # A long decode averages budget / E[L] rounds.
    acceptance = [0.8, 0.7, 0.6, 0.5]
    mean = simulated_rounds(acceptance, 4, 4000, 64, rng).mean()
    assert mean == pytest.approx(4000 / expected_round_length(acceptance), rel=0.02)


def test_a_batch_lasts_as_long_as_its_slowest_row():
    fast, slow = ([1.0] * 3, 12), ([0.0] * 3, 12)
    assert expected_batch_rounds([fast], 3) == 3  # 12 tokens, 4 a round
    assert expected_batch_rounds([slow], 3) == 12
    assert expected_batch_rounds([fast, slow], 3) == 12  # the fast row waits for the slow one
    # Random rows: the batch's expected rounds exceed each row's own (the max of noisy rows).
    noisy = ([0.6] * 3, 48)
    alone = expected_batch_rounds([noisy], 3, samples=512)
    assert expected_batch_rounds([noisy] * 8, 3, samples=512) > 1.1 * alone


def test_a_known_curve_is_recovered_from_the_run_at_k_max_whatever_the_profile_level():
    """Rows accept exactly their first two drafts (deterministic), so the rounds at every k are known: the true
    decode time is T(k) = prefill + Σ_batches rounds(k) · (k·d + v(k+1) + o). Measured at K = 5 only (its speedup
    against a baseline), with a verify profile whose level is off by 1.7x (measured at another moment), the
    predictor must return base / T(k) for every k."""
    d, o, prefill, base, tokens = 0.002, 0.001, 0.05, 3.0, 30
    v = {n: 0.010 + 0.0015 * n for n in range(1, 7)}
    batches = [[([1.0, 1.0, 0.0, 0.0, 0.0], tokens)] * 2, [([1.0, 1.0, 0.0, 0.0, 0.0], tokens)]]

    def rounds(k):  # per batch: each round emits min(k, 2) + 1 tokens
        return math.ceil(tokens / (min(k, 2) + 1))

    def truth(k):
        return prefill + len(batches) * rounds(k) * (k * d + v[k + 1] + o)

    K = 5
    seconds = modelled_seconds(
        batches,
        K,
        draft_per_round=K * d,
        verify_per_round=v[K + 1],
        other_per_round=o,
        first_round_extra=prefill,
        verify_shape={n: 1.7 * t for n, t in v.items()},
    )
    curve = anchored_curve(seconds, K, measured_speedup=base / truth(K))
    assert sorted(curve) == [1, 2, 3, 4, 5]
    for k in curve:
        assert curve[k] == pytest.approx(base / truth(k), rel=1e-9), k
    assert max(curve, key=curve.get) == 2  # drafting past the second position only costs


def test_cli_parses_k_auto_with_batch_sizes_as_a_grid():
    options = {
        "k": "auto:4",
        "temperature": "0",
        "top_k": "0",
        "top_p": "1",
        "batch_size": "4,1",
        "draft": "d",
        "drafter": "model",
        "draft_sampling": "probabilistic",
    }
    sweep = parse_sweep(options)
    assert (sweep.variable, sweep.values, sweep.k_auto, sweep.batch_sizes) == ("k", [4], 4, [1, 4])


def test_k_auto_at_two_batch_sizes_end_to_end(tmp_path, model_dirs, capsys):
    """`--k auto:3 --batch-size 1,2`: a profile and a predicted curve per batch size, confirmations at each batch
    size paired with a fresh baseline of that batch size, each with its prediction_error."""
    from tests.cli_runs import run_json

    doc, db = run_json(
        tmp_path,
        model_dirs,
        capsys,
        "--k",
        "auto:3",
        "--batch-size",
        "1,2",
        "--max-new-tokens",
        "12",
        "--repeats",
        "1",
        name="auto.db",
    )
    store = open_store(db)
    eid = doc["experiment_id"]
    experiment = q.experiment(store, eid)
    assert json.loads(experiment["batch_sizes"]) == [1, 2]
    profiles = load_verify_profiles(store, eid)
    assert sorted(profiles) == [1, 2] and all(sorted(p) == [1, 2, 3, 4] for p in profiles.values())
    curves = q.predicted_curves(experiment)
    assert sorted(curves) == [1, 2]
    assert sorted(doc["predicted_curves"]) == ["1", "2"]
    runs = q.runs(store, eid)
    size_of = runs.set_index("run_id")["batch_size"].to_dict()
    for size, (curve, confirmed) in curves.items():
        assert sorted(curve) == [1, 2, 3] and all(v > 0 for v in curve.values())
        assert confirmed and 3 not in confirmed
        assert set(confirmed) == set(sorted(curve, key=lambda k: -curve[k])[:3]) - {3}  # the best predicted
        at_size = [r for r in doc["runs"] if r["batch_size"] == size]
        probe = next(r for r in at_size if r["k"] == 3)
        checks = [r for r in at_size if r["k"] != 3]
        assert sorted(r["k"] for r in checks) == confirmed
        for r in checks:
            assert r["status"] == "done"
            assert size_of[r["baseline_run_id"]] == size  # its baseline decodes at the run's batch size
            assert r["baseline_run_id"] != probe["baseline_run_id"]  # a fresh one, timed with the confirmations
            assert r["predicted"] == pytest.approx(curve[r["k"]])
            assert r["prediction_error"] == pytest.approx(curve[r["k"]] / r["speedup"] - 1)


def test_a_version_11_database_gains_the_batched_profile_and_keeps_its_batch_1_profile(db_url):
    """Schema v12: the per-batch-size verify profile table; a v11 database (no such table) upgrades, and the
    batch-1 profile it stored still reads as batch size 1."""
    from sqlalchemy import inspect, text

    from storage.db.schema import SCHEMA_VERSION
    from storage.jobs.experiments import enqueue_experiment, store_verify_profile, store_verify_profiles

    assert SCHEMA_VERSION >= 12
    store = open_store(db_url)
    eid = enqueue_experiment(store, name="old", target="t", draft="d", prompts="p", sampling={}, k_auto=3)
    store_verify_profile(store, eid, {1: 0.01, 2: 0.012, 3: 0.013, 4: 0.015})
    with store.write() as conn:  # back to what a v11 database holds
        conn.execute(text("DROP TABLE batch_verify_profile"))
        conn.execute(text("UPDATE schema_info SET version = 11"))
    store = open_store(db_url)
    with store.read() as conn:
        assert conn.execute(text("SELECT version FROM schema_info")).scalar() == SCHEMA_VERSION
        assert inspect(conn).has_table("batch_verify_profile")
    assert load_verify_profiles(store, eid) == {1: {1: 0.01, 2: 0.012, 3: 0.013, 4: 0.015}}
    store_verify_profiles(store, eid, {1: {1: 0.02, 2: 0.03}, 4: {1: 0.05, 2: 0.07}})
    assert load_verify_profiles(store, eid) == {1: {1: 0.02, 2: 0.03}, 4: {1: 0.05, 2: 0.07}}


def test_k_auto_at_one_batch_size_above_1_predicts_at_that_batch_size(tmp_path, model_dirs, capsys):
    """`--k auto:2 --batch-size 2` (no grid): the profile, the curve and the confirmation are at batch size 2."""
    from tests.cli_runs import run_json

    doc, db = run_json(
        tmp_path,
        model_dirs,
        capsys,
        "--k",
        "auto:2",
        "--batch-size",
        "2",
        "--max-new-tokens",
        "8",
        "--repeats",
        "1",
        name="auto2.db",
    )
    store = open_store(db)
    assert sorted(load_verify_profiles(store, doc["experiment_id"])) == [2]
    assert list(doc["predicted_curves"]) == ["2"] and doc["predicted_curves"]["2"]["confirmed"] == [1]
    check = next(r for r in doc["runs"] if r["k"] == 1)
    base_of = {b["run_id"]: b["batch_size"] for b in doc["baselines"]}
    assert check["batch_size"] == 2 and base_of[check["baseline_run_id"]] == 2
    assert check["prediction_error"] == pytest.approx(doc["predicted_curves"]["2"]["curve"]["1"] / check["speedup"] - 1)
