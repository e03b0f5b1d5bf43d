"""Block verification (engine/decoding/block_verification.py, `verify="block"`) is lossless: greedy output equals
target-only decoding token for token at batch 1 and 3; sampled output follows the target's exact joint (chi-squared,
probabilistic and point-mass drafts); a batched sampled row equals that prompt decoded alone; breaking the rule (the
standard residual at the block's stop, the weight without its min(1, .)) fails the chi-squared. And block accepts at
least as many drafts as the standard rule on the same drafts and uniforms, in expectation (Sun et al.'s theorem)."""

import math

import numpy as np
import pytest
import torch

from engine.decoding import block_verification, runs
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from tests import tiny_models as tm
from tests.meaning import missing
from tests.test_engine_sampling import NEW, V, chi2_pvalue, exact_joint

SAMPLES = 6000  # one batched decode of this many rows (each its own generator): a chi-squared in about a second
PROMPT = "t2 t3"


@pytest.fixture(scope="module")
def sampled_pair():
    target = tm.llama(0, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)
    draft = tm.llama(7, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)  # independent: often disagrees
    p = tm.pair(target, draft, tm.tokenizer(V, eos=False))
    prompt_ids = runs.encode_prompts(p, [PROMPT], NEW)[0]
    return p, prompt_ids, exact_joint(target, prompt_ids)


def block_outputs(p, prompt_ids, samples=SAMPLES, k=2, **cfg_fields):
    """`samples` decodes of the prompt under block verification, rows 0.. of one batch (row i draws from the
    generator seeded by (seed, i), as prompt i decoded alone would): their PromptResults."""
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=11, verify="block", **cfg_fields)
    decoder = runs.speculative_decoder(p, cfg, k)
    return decoder.generate_batch([PROMPT] * samples, [prompt_ids] * samples, list(range(samples)))


def counts_of(results):
    counts = np.zeros(V**NEW)
    for r in results:
        counts[np.ravel_multi_index(r.output_ids, (V,) * NEW)] += 1
    return counts


@pytest.mark.parametrize("draft_sampling", ["probabilistic", "greedy"])
def test_sampled_block_output_follows_the_target_distribution(sampled_pair, draft_sampling):
    """greedy draft sampling: point-mass drafts (p_d one-hot), the same rule."""
    p, prompt_ids, probs = sampled_pair
    results = block_outputs(p, prompt_ids, draft_sampling=draft_sampling)
    assert chi2_pvalue(counts_of(results), probs) > 1e-3
    rounds = [r for res in results for r in res.rounds]
    assert all(r.accepted_standard is not None for r in rounds)
    # The test has power only if block and standard verdicts differ on some rounds.
    assert any(r.accepted != r.accepted_standard for r in rounds)


# A two-draft world whose target is known exactly: tables T0 [W], T1 [W, W], T2 [W, W, W] (the target's next-token
# distributions after 0, 1 and 2 tokens) and the draft's D0, D1. Each row drafts x1 ~ D0, x2 ~ D1[x1], block
# verification emits x1..x_tau and its correction or bonus, and the target itself completes the row to three tokens:
# the three follow T0 T1 T2 exactly when the rule is lossless. One verify_block call verifies every row.
W, WORLD_ROWS = 3, 30000


def world(point_masses=False):
    """The tables (float64). Drafting x1 = 0 has p_1 = 0.3 / 0.5 = 0.6 < 1, where the block's residual
    max(0, 0.6 T1[0] - D1[0]) = [0.2, 0, 0] and the standard one [0.4, 0.1, 0] disagree."""
    t0 = torch.tensor([0.3, 0.5, 0.2], dtype=torch.float64)
    t1 = torch.tensor([[0.5, 0.4, 0.1], [0.4, 0.4, 0.2], [0.2, 0.5, 0.3]], dtype=torch.float64)
    t2 = torch.randn(W, W, W, generator=torch.Generator().manual_seed(4), dtype=torch.float64).softmax(-1)
    d0 = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    d1 = torch.tensor([[0.1, 0.3, 0.6], [0.3, 0.3, 0.4], [0.6, 0.2, 0.2]], dtype=torch.float64)
    if point_masses:  # drafts without a distribution: p_d one-hot at the draft's argmax
        d0, d1 = (torch.nn.functional.one_hot(d.argmax(-1), W).double() for d in (d0, d1))
    return t0, t1, t2, d0, d1


def world_counts(point_masses=False, rows=WORLD_ROWS):
    """(observed counts of the rows' three tokens, their exact probabilities, the Verdict)."""
    t0, t1, t2, d0, d1 = world(point_masses)
    g = torch.Generator().manual_seed(5)

    def draw(probs):
        return torch.multinomial(probs, 1, generator=g)[:, 0]

    x1 = draw(d0.expand(rows, -1))
    x2 = draw(d1[x1])
    verdict = block_verification.verify_block(
        torch.stack([x1, x2], 1),
        torch.stack([d0.expand(rows, -1), d1[x1]], 1),
        [2] * rows,
        None,
        torch.stack([t0.expand(rows, -1), t1[x1], t2[x1, x2]], 1),
        SamplingConfig(temperature=1.0, verify="block"),
        [torch.Generator().manual_seed(10_000 + r) for r in range(rows)],
    )
    tau, y = verdict.accepted, verdict.next_tokens
    first = torch.where(tau >= 1, x1, y)
    second = torch.where(tau == 2, x2, torch.where(tau == 1, y, draw(t1[first])))
    third = torch.where(tau == 2, y, draw(t2[first, second]))
    counts = np.bincount((first * W * W + second * W + third).numpy(), minlength=W**3)
    exact = (t0[:, None, None] * t1[:, :, None] * t2).reshape(-1).numpy()
    return counts, exact, verdict


@pytest.mark.parametrize("point_masses", [False, True])
def test_block_rule_is_lossless_in_a_world_known_exactly(point_masses):
    counts, exact, verdict = world_counts(point_masses)
    assert chi2_pvalue(counts, exact) > 1e-3
    assert (verdict.accepted != verdict.accepted_standard).any()  # block and standard differ: the test has power


def test_the_standard_residual_at_the_blocks_stop_is_detected(monkeypatch):
    """Drawing the correction from max(0, p_t - p_d) (the standard rule's) instead of max(0, p_tau p_t - p_d)."""
    real = block_verification.block_residual
    monkeypatch.setattr(block_verification, "block_residual", lambda w, p_t, p_d: real(torch.ones_like(w), p_t, p_d))
    assert chi2_pvalue(*world_counts()[:2]) < 1e-6


def test_the_weight_without_its_min_is_detected(sampled_pair, monkeypatch):
    """p_i = p_{i-1} p_t / p_d, never capped at 1 (the plain likelihood ratio of the prefix): in the world and in
    the models' decoding."""
    monkeypatch.setattr(
        block_verification,
        "block_weights",
        lambda ratio: torch.cat([ratio.new_ones(ratio.shape[0], 1), ratio.cumprod(1)], 1),
    )
    assert chi2_pvalue(*world_counts()[:2]) < 1e-6
    p, prompt_ids, probs = sampled_pair
    assert chi2_pvalue(counts_of(block_outputs(p, prompt_ids)), probs) < 1e-6


@pytest.fixture(scope="module")
def greedy_pair():
    target = tm.llama(0, layers=2, sharpness=4.0)
    return tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.6))


PROMPTS = ["t5", "t9 t3 t22", "t40 t41 t2 t8 t9 t10 t11 t12 t13", "t7 t7 t8", "t3 t4 t5 t6 t3 t4 t5"]


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_block_equals_target_only(greedy_pair, batch):
    cfg = SamplingConfig(temperature=0, max_new_tokens=24, verify="block")
    ids = runs.encode_prompts(greedy_pair, PROMPTS, 24)
    alone = runs.baseline_decoder(greedy_pair, cfg)
    base = [alone.generate(p, i, n).output_ids for n, (p, i) in enumerate(zip(PROMPTS, ids))]
    decoder = runs.speculative_decoder(greedy_pair, cfg, 3)
    out = []
    for s in range(0, len(PROMPTS), batch):
        e = min(s + batch, len(PROMPTS))
        out += decoder.generate_batch(PROMPTS[s:e], ids[s:e], list(range(s, e)))
    assert [r.output_ids for r in out] == base
    rounds = [r for res in out for r in res.rounds]
    assert all(r.accepted_standard == r.accepted for r in rounds)  # greedy: the one argmax rule
    assert 0 < sum(r.accepted for r in rounds) < sum(r.k for r in rounds)  # hits and misses both


@pytest.mark.parametrize("drafter", ["model", "prompt-lookup:2"])
def test_batched_sampled_block_rows_equal_each_prompt_alone(greedy_pair, drafter):
    """Ragged rows (prompt lookup proposes fewer drafts on some rows) and rows finishing at different times."""
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=24, seed=5, verify="block")
    ids = runs.encode_prompts(greedy_pair, PROMPTS, 24)
    decoder = runs.speculative_decoder(greedy_pair, cfg, 3, drafter=drafter)
    alone = [decoder.generate(p, i, n) for n, (p, i) in enumerate(zip(PROMPTS, ids))]
    batched = decoder.generate_batch(PROMPTS, ids, list(range(len(PROMPTS))))
    for row, ref in zip(batched, alone):
        assert row.output_ids == ref.output_ids
        assert [(r.k, r.accepted, r.accepted_standard) for r in row.rounds] == [
            (r.k, r.accepted, r.accepted_standard) for r in ref.rounds
        ]


def test_block_accepts_at_least_as_many_as_standard_in_expectation(greedy_pair):
    """Mean accepted vs mean accepted_standard over the same rounds (paired): the difference is not below zero
    beyond three standard errors, and block's gain shows."""
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=40, seed=3, verify="block")
    prompts = [f"t{i} t{i + 3} t{i + 7}" for i in range(2, 42)]
    ids = runs.encode_prompts(greedy_pair, prompts, 40)
    results = runs.speculative_decoder(greedy_pair, cfg, 4).generate_batch(prompts, ids, list(range(len(prompts))))
    diffs = np.array([r.accepted - r.accepted_standard for res in results for r in res.rounds if r.k >= 2])
    se = diffs.std(ddof=1) / math.sqrt(len(diffs))
    assert len(diffs) > 300 and (diffs != 0).any()
    assert diffs.mean() > -3 * se
    assert diffs.mean() > 0


def test_verify_block_by_hand():
    """One row, two drafts, the numbers worked out: p_1 = min(1, 0.6 / 0.3) = 1, so h_1 = r_1 / r_1 = 1 and the
    first draft always stands; p_2 = 0.1 / 0.5 = 0.2 = h_2. Both accepted with probability 0.2; otherwise tau = 1
    and the correction comes from max(0, p_t - p_d) at slot 1 (p_1 = 1)."""
    cfg = SamplingConfig(temperature=1.0, verify="block")
    p_t = torch.tensor([[[0.6, 0.4, 0.0], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]])
    p_d = torch.tensor([[[0.3, 0.7, 0.0], [0.5, 0.5, 0.0]]])
    tokens = torch.tensor([[0, 0]])
    draws = 20000
    verdict = block_verification.verify_block(
        tokens.expand(draws, -1),
        p_d.expand(draws, -1, -1),
        [2] * draws,
        None,
        p_t.expand(draws, -1, -1),
        cfg,
        [torch.Generator().manual_seed(r) for r in range(draws)],
    )
    accepted = verdict.accepted.numpy()
    assert set(accepted) == {1, 2}
    assert abs((accepted == 2).mean() - 0.2) < 4 * math.sqrt(0.2 * 0.8 / draws)
    assert set(verdict.next_tokens[verdict.accepted == 1].tolist()) == {2}  # max(0, [.1, .2, .7] - [.5, .5, 0])
    standard = verdict.accepted_standard.numpy()  # the same uniforms: u_2 < 0.2 accepts both under either rule
    assert (standard >= 1).all() and ((standard == 2) == (accepted == 2)).all()


def test_a_bad_verify_rule_is_one_line():
    with pytest.raises(DraftLabError) as err:
        SamplingConfig(temperature=1.0, verify="blocks")
    assert not missing(str(err.value), "verify", "standard", "block", "'blocks'"), err.value
