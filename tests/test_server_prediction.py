"""engine/metrics/server_prediction.py: the server's speedup from a lab run's acceptance and a server cost profile.
A hand-computed case, a Monte-Carlo server whose measured tokens-per-second ratio the intervals must cover, the
interpolation between measured ks and the refusal beyond them, intervals that widen with fewer prompts, the
schedule's rule, and the seed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from engine.errors import DraftLabError
from engine.metrics.server_prediction import (
    Prediction,
    interpolated_step_seconds,
    pooled_acceptance,
    predict_server_speedups,
    server_schedule,
    tokens_per_step,
)
from engine.metrics.theory import expected_round_length

# two prompts, each: 10 rounds reached position 1 and 8 accepted there, 8 reached position 2 and 4 accepted
REACHED = [[10, 8], [10, 8]]
ACCEPTED = [[8, 4], [8, 4]]


def _by_k(predictions: list[Prediction], concurrency: int = 1) -> dict[int, Prediction]:
    return {p.k: p for p in predictions if p.concurrency == concurrency}


def test_a_hand_computed_case_gives_the_exact_speedups():
    # α = [0.8, 0.5]: E[L_1] = 1.8, E[L_2] = 1 + 0.8 + 0.8·0.5 = 2.2; t_0 = 10 ms, t_1 = 12 ms, t_2 = 13 ms
    profile = {1: {0: [0.010, 0.010], 1: [0.012, 0.012], 2: [0.013, 0.013]}}
    assert pooled_acceptance(REACHED, ACCEPTED) == pytest.approx([0.8, 0.5])
    got = _by_k(predict_server_speedups(REACHED, ACCEPTED, profile, samples=200))
    assert sorted(got) == [1, 2]
    assert got[1].tokens_per_step == pytest.approx(1.8)
    assert got[2].tokens_per_step == pytest.approx(2.2)
    assert got[1].step_seconds_ratio == pytest.approx(1.2)
    assert got[2].step_seconds_ratio == pytest.approx(1.3)
    assert got[1].speedup == pytest.approx(1.8 * 10 / 12)  # 1.5
    assert got[2].speedup == pytest.approx(2.2 * 10 / 13)  # 1.6923...
    # identical prompts and identical passes: every resample is the point
    for p in got.values():
        assert (p.lo, p.hi) == pytest.approx((p.speedup, p.speedup))
        assert not p.interpolated
    assert tokens_per_step([0.8, 0.5])[0] == pytest.approx(
        [expected_round_length([0.8]), expected_round_length([0.8, 0.5])]
    )


def _lab_counts(
    alpha: list[float], prompts: int, rounds: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A lab run at K = len(alpha): each round reaches position j while every draft before it was accepted."""
    K = len(alpha)
    accepted_at = np.cumprod(rng.random((prompts, rounds, K)) < np.asarray(alpha), axis=2)  # accepted at j
    reached_at = np.concatenate([np.ones((prompts, rounds, 1)), accepted_at[:, :, :-1]], axis=2)
    return reached_at.sum(1), accepted_at.sum(1)


def _step(concurrency: int, k: int) -> float:
    """The simulated server's true step seconds: linear in k, dearer per draft at a higher concurrency."""
    return 0.010 * (1 + 0.2 * concurrency) * (1 + 0.15 * concurrency * k)


def _passes(concurrency: int, ks: list[int], passes: int, rng: np.random.Generator) -> dict[int, list[float]]:
    """Profile passes: interleaved, so each pass's drift lands on every k alike, plus each measurement's own noise."""
    drift = rng.lognormal(0, 0.06, passes)
    return {k: list(_step(concurrency, k) * drift * rng.lognormal(0, 0.02, passes)) for k in ks}


def _served_ratio(alpha: list[float], k: int, concurrency: int, rounds: int, rng: np.random.Generator) -> float:
    """The simulated server's tokens per second at k over its target-only tokens per second: `rounds` steps each, a
    step emitting its accepted drafts plus one and costing the true step with noise."""
    accepted = np.cumprod(rng.random((rounds, k)) < np.asarray(alpha[:k]), axis=1).sum(1)
    spec = (accepted + 1).sum() / (_step(concurrency, k) * rng.lognormal(0, 0.05, rounds)).sum()
    base = rounds / (_step(concurrency, 0) * rng.lognormal(0, 0.05, rounds)).sum()
    return float(spec / base)


def test_the_interval_covers_a_simulated_servers_measured_speedup():
    alpha = [0.8, 0.6, 0.5]
    rng = np.random.default_rng(7)
    served = {(k, c): _served_ratio(alpha, k, c, 400_000, rng) for k in (1, 2, 3) for c in (1, 4)}
    covered, errors = [], []
    for replication in range(40):
        reached, accepted = _lab_counts(alpha, prompts=30, rounds=40, rng=rng)
        # 20 passes: with 5 the percentile bootstrap over passes runs narrow (about 83 % of a nominal 95 % here)
        # k 2 is not profiled: interpolated between k 1 and k 3 (exact here, the true step being linear in k)
        profile = {c: _passes(c, [0, 1, 3], passes=20, rng=rng) for c in (1, 4)}
        for p in predict_server_speedups(reached, accepted, profile, samples=400, seed=replication):
            truth = served[(p.k, p.concurrency)]
            covered.append(p.lo <= truth <= p.hi)
            errors.append(abs(p.speedup / truth - 1))
    assert len(covered) == 40 * 3 * 2
    assert np.mean(covered) >= 0.88, f"the 95 % intervals covered the served speedup {np.mean(covered):.0%} of the time"
    assert np.median(errors) < 0.03
    # the two concurrencies disagree on whether to speculate at all, as the simulated costs say
    assert served[(3, 1)] > 1.3 and served[(3, 4)] < 1.0


def test_a_k_between_measured_ks_is_interpolated_and_one_beyond_them_refused():
    measured = {0: 0.010, 1: 0.012, 3: 0.016, 5: 0.024}
    assert interpolated_step_seconds(measured, 2, 1) == pytest.approx(0.014)
    assert interpolated_step_seconds(measured, 4, 1) == pytest.approx(0.020)
    assert interpolated_step_seconds(measured, 3, 1) == 0.016
    with pytest.raises(DraftLabError, match=r"cannot predict k 6 at concurrency 1: .*measured k 0, 1, 3, 5 there"):
        interpolated_step_seconds(measured, 6, 1)

    profile = {1: {k: [v] for k, v in measured.items()}}
    K7 = ([[100, 80, 64, 50, 40, 30, 20]], [[80, 64, 50, 40, 30, 20, 10]])
    got = _by_k(predict_server_speedups(*K7, profile, samples=50))
    assert sorted(got) == [1, 2, 3, 4, 5]  # by default up to the profile's largest k, not the run's K 7
    assert got[2].interpolated and got[4].interpolated and not got[3].interpolated
    assert got[2].step_seconds_ratio == pytest.approx(1.4)
    assert got[2].speedup == pytest.approx(got[2].tokens_per_step / 1.4)
    with pytest.raises(DraftLabError, match=r"cannot predict k 6 at concurrency 1: .*measured k 0, 1, 3, 5"):
        predict_server_speedups(*K7, profile, ks=[6])
    with pytest.raises(DraftLabError, match=r"k 3.*positions 1..2"):
        predict_server_speedups(REACHED, ACCEPTED, profile, ks=[3])
    with pytest.raises(DraftLabError, match=r"concurrency 4 did not measure k 0 \(the target alone\), only k 1, 3"):
        predict_server_speedups(REACHED, ACCEPTED, {4: {1: [0.01], 3: [0.02]}})
    with pytest.raises(DraftLabError, match="never more accepted than reached"):
        predict_server_speedups([[1, 1]], [[2, 1]], profile)


def test_fewer_prompts_give_a_wider_interval_that_holds_the_point():
    rng = np.random.default_rng(3)
    # prompts differ: each draws its own acceptance around the run's
    per_prompt = [np.clip(rng.normal([0.75, 0.6, 0.5], 0.15), 0.05, 0.95) for _ in range(200)]
    counts = [_lab_counts(list(a), prompts=1, rounds=30, rng=rng) for a in per_prompt]
    reached = np.concatenate([r for r, _ in counts])
    accepted = np.concatenate([a for _, a in counts])
    profile = {1: _passes(1, [0, 1, 2, 3], passes=8, rng=rng)}
    many = _by_k(predict_server_speedups(reached, accepted, profile))
    few = _by_k(predict_server_speedups(reached[:15], accepted[:15], profile))
    for k in (1, 2, 3):
        assert few[k].hi - few[k].lo > many[k].hi - many[k].lo
        for p in (many[k], few[k]):
            assert p.lo < p.speedup < p.hi


def _p(k: int, concurrency: int, speedup: float, lo: float, hi: float) -> Prediction:
    return Prediction(k, concurrency, speedup, lo, hi, tokens_per_step=1.0, step_seconds_ratio=1.0, interpolated=False)


def test_the_schedule_takes_the_best_k_and_0_where_no_interval_lies_above_1():
    predictions = [
        _p(1, 1, 1.30, 1.10, 1.50),
        _p(2, 1, 1.45, 1.20, 1.70),  # the best at concurrency 1
        _p(3, 1, 1.40, 1.15, 1.65),
        _p(1, 4, 1.05, 0.95, 1.15),  # tied with 1
        _p(2, 4, 0.90, 0.80, 1.00),  # touches 1 from below: not above it
        _p(1, 16, 0.70, 0.60, 0.80),  # loses
        _p(1, 8, 1.20, 1.01, 1.40),
        _p(2, 8, 1.20, 0.90, 1.50),  # ties the best point: the smaller k
    ]
    assert server_schedule(predictions) == {1: 2, 4: 0, 8: 1, 16: 0}
    assert server_schedule([]) == {}

    # end to end: a server whose drafts cost little at concurrency 1 and much at 16
    profile = {
        1: {0: [0.010] * 3, 1: [0.011] * 3, 3: [0.013] * 3},
        16: {0: [0.020] * 3, 1: [0.040] * 3, 3: [0.070] * 3},
    }
    rng = np.random.default_rng(5)
    reached, accepted = _lab_counts([0.8, 0.7, 0.6], prompts=40, rounds=30, rng=rng)
    schedule = server_schedule(predict_server_speedups(reached, accepted, profile))
    assert schedule == {1: 3, 16: 0}


def test_the_same_seed_gives_the_same_interval():
    rng = np.random.default_rng(11)
    reached, accepted = _lab_counts([0.7, 0.5], prompts=25, rounds=20, rng=rng)
    profile = {1: _passes(1, [0, 1, 2], passes=6, rng=rng), 4: _passes(4, [0, 2], passes=4, rng=rng)}
    first = predict_server_speedups(reached, accepted, profile, seed=1)
    assert predict_server_speedups(reached, accepted, profile, seed=1) == first
    other = predict_server_speedups(reached, accepted, profile, seed=2)
    assert [p.speedup for p in other] == [p.speedup for p in first]  # the point takes no resample
    assert [(p.lo, p.hi) for p in other] != [(p.lo, p.hi) for p in first]


def test_importing_it_imports_no_torch():
    """A formula: storage and the pages import it without torch (as engine.metrics.theory and stats)."""
    code = (
        "import sys, engine.metrics.server_prediction; "
        "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'safetensors') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
