"""Sampled speculative decoding is lossless: its outputs follow the target's own distribution exactly
(chi-squared against the target's exact joint probabilities), and the test catches a broken rule."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from engine.decoding import runs, verification
from engine.decoding.sampling import SamplingConfig
from engine.metrics.metrics_oracle import speculative_metrics
from tests import tiny_models as tm
from tests.meaning import missing

V, NEW, SAMPLES, K = 6, 3, 2000, 2


@pytest.fixture(scope="module")
def setup():
    target = tm.llama(0, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)
    draft = tm.llama(7, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)  # independent: often disagrees
    p = tm.pair(target, draft, tm.tokenizer(V, eos=False))
    prompt_ids = runs.encode_prompts(p, ["t2 t3"], NEW)[0]
    return p, prompt_ids, exact_joint(target, prompt_ids)


def exact_joint(model, prompt_ids):
    """P(t1, t2, t3 | prompt) under the target at temperature 1, by enumerating every continuation."""
    with torch.no_grad():
        probs = torch.ones(1)
        seqs = prompt_ids
        for _ in range(NEW):
            nxt = model(seqs).logits[:, -1, :V].float().softmax(-1)  # [n, V]
            probs = (probs[:, None] * nxt).reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(seqs.shape[0])[:, None]], 1)
    return probs.numpy()


def sample_counts(p, prompt_ids):
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=11)
    decoder = runs.speculative_decoder(p, cfg, K)
    counts = np.zeros(V**NEW)
    for i in range(SAMPLES):  # prompt index i -> generator seeded by (seed, i): independent draws
        out = decoder.generate("t2 t3", prompt_ids, i).output_ids
        counts[np.ravel_multi_index(out, (V,) * NEW)] += 1
    return counts


def chi2_pvalue(counts, probs):
    """Goodness of fit, pooling cells whose expected count is below 5 into one."""
    expected = probs * counts.sum()
    small = expected < 5
    obs, exp = counts[~small], expected[~small]
    if small.any():
        obs, exp = np.append(obs, counts[small].sum()), np.append(exp, expected[small].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_sampled_outputs_follow_target_distribution(setup):
    p, prompt_ids, probs = setup
    assert chi2_pvalue(sample_counts(p, prompt_ids), probs) > 1e-3


def test_broken_correction_rule_is_detected(setup, monkeypatch):
    p, prompt_ids, probs = setup
    # Drawing the correction from p_t instead of normalize(max(0, p_t - p_d)) biases the output.
    monkeypatch.setattr(verification, "residual_distribution", lambda p_t, p_d: p_t)
    assert chi2_pvalue(sample_counts(p, prompt_ids), probs) < 1e-6


def test_alpha_matches_expected_alpha_within_three_standard_errors():
    target = tm.llama(0, layers=2, sharpness=3.0)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.8))
    prompts = [f"t{i} t{i + 3} t{i + 7}" for i in range(2, 26)]
    cfg = SamplingConfig(temperature=0.8, top_k=20, top_p=0.95, max_new_tokens=48, seed=3)
    ids = runs.encode_prompts(p, prompts, cfg.max_new_tokens)
    m = speculative_metrics(list(runs.run_prompts(runs.speculative_decoder(p, cfg, 4), prompts, ids)))
    n = m["accepted"] + m["rejected"]
    se = math.sqrt(m["alpha"] * (1 - m["alpha"]) / n)
    assert n > 300 and 0.2 < m["alpha"] < 0.95
    assert abs(m["alpha"] - m["expected_alpha"]) < 3 * se


def test_same_seed_same_output_different_seed_differs():
    target = tm.llama(0, layers=1, sharpness=2.0)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.8))
    ids = runs.encode_prompts(p, ["t4 t5"], 32)
    outs = []
    for seed in (5, 5, 6):
        cfg = SamplingConfig(temperature=1.0, max_new_tokens=32, seed=seed)
        outs.append(runs.speculative_decoder(p, cfg, 3).generate("t4 t5", ids[0], 0).output_ids)
    assert outs[0] == outs[1] and outs[0] != outs[2]


def sample_counts_with(p, prompt_ids, **cfg_fields):
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=11, **cfg_fields)
    decoder = runs.speculative_decoder(p, cfg, K)
    counts = np.zeros(V**NEW)
    accepted = proposed = 0
    for i in range(SAMPLES):
        result = decoder.generate("t2 t3", prompt_ids, i)
        counts[np.ravel_multi_index(result.output_ids, (V,) * NEW)] += 1
        accepted += sum(r.accepted for r in result.rounds)
        proposed += sum(r.k for r in result.rounds)
    return counts, accepted / max(proposed, 1)


def test_greedy_drafting_stays_lossless_and_proposes_the_argmax(setup):
    """--draft-sampling greedy: the draft proposes its argmax, verified as a point mass; the output still follows
    the target's distribution (chi-squared), and every proposed draft is the draft's argmax with p_draft 1."""
    p, prompt_ids, probs = setup
    counts, _ = sample_counts_with(p, prompt_ids, draft_sampling="greedy")
    assert chi2_pvalue(counts, probs) > 1e-3
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=3, draft_sampling="greedy")
    result = runs.speculative_decoder(p, cfg, K).generate("t2 t3", prompt_ids, 0)
    drafts = [t for r in result.rounds for t in r.draft_tokens]
    assert drafts and all(t.p_draft == 1.0 for t in drafts)
    assert all(t.beta == pytest.approx(t.p_target) for t in drafts)  # E[accept] of a point mass is p_t(x)


def test_greedy_drafting_without_the_point_mass_rule_is_detected(setup, monkeypatch):
    """Proposing the argmax but verifying with the full p_d (what a point-mass bug would do) biases the output."""
    from engine.decoding import drafting

    p, prompt_ids, probs = setup
    real = torch.nn.functional.one_hot
    monkeypatch.setattr(drafting.torch.nn.functional, "one_hot", lambda t, n: real(t, n) * 0 + 1.0 / n)
    counts, _ = sample_counts_with(p, prompt_ids, draft_sampling="greedy")
    assert chi2_pvalue(counts, probs) < 1e-6


def test_bad_draft_sampling_is_one_line():
    from engine.errors import DraftLabError

    with pytest.raises(DraftLabError) as err:
        SamplingConfig(temperature=1.0, draft_sampling="argmax")
    assert not missing(str(err.value), "draft sampling", "probabilistic", "greedy", "'argmax'"), err.value
