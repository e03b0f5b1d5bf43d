"""Greedy speculative decoding is lossless: token for token equal to target-only decoding and to
transformers' own generate(), for Llama-style (rotary) and GPT-2-style (absolute positions) models."""

import pytest
import torch

from engine.decoding import runs
from engine.decoding.records import ACCEPTED, DISCARDED, REJECTED
from engine.decoding.sampling import SamplingConfig
from engine.metrics.metrics_oracle import speculative_metrics
from tests import tiny_models as tm

PROMPTS = ["t5", "t9 t3 t22", "t40 t41 t2 t8 t9 t10 t11 t12 t13 t14 t15 t16 t17 t18 t19 t20 t21 t22 t23 t24 t25"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def family_pair(request):
    build = getattr(tm, request.param)
    target = build(0, layers=2, sharpness=4.0)
    return tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.6))


@pytest.fixture(scope="module")
def baseline(family_pair):
    cfg = SamplingConfig(temperature=0, max_new_tokens=40)
    ids = runs.encode_prompts(family_pair, PROMPTS, 40)
    return cfg, ids, list(runs.run_prompts(runs.baseline_decoder(family_pair, cfg), PROMPTS, ids))


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_speculative_equals_target_only(family_pair, baseline, k):
    cfg, ids, base = baseline
    spec = list(runs.run_prompts(runs.speculative_decoder(family_pair, cfg, k), PROMPTS, ids))
    for s, b in zip(spec, base):
        assert s.output_ids == b.output_ids
    m = speculative_metrics(spec, base)
    # The draft is a noisy copy: the comparison is only meaningful if it both hits and misses.
    assert 0 < m["accepted"] < m["proposed"] and m["rejected"] > 0


def test_target_only_equals_transformers_generate(family_pair, baseline):
    cfg, ids, base = baseline
    model = family_pair.target.model
    for prompt_ids, b in zip(ids, base):
        out = model.generate(
            prompt_ids,
            do_sample=False,
            max_new_tokens=40,
            eos_token_id=sorted(runs.eos_ids(family_pair)),
            attention_mask=torch.ones_like(prompt_ids),
            pad_token_id=0,
        )
        assert out[0, prompt_ids.shape[1] :].tolist() == b.output_ids


@pytest.mark.parametrize("k", [1, 3, 8])
def test_round_identities(family_pair, baseline, k):
    cfg, ids, base = baseline
    spec = list(runs.run_prompts(runs.speculative_decoder(family_pair, cfg, k), PROMPTS, ids))
    for s in spec:
        # The first round starts from the prompt, so every new token comes from a round.
        assert sum(len(r.emitted_ids) for r in s.rounds) == s.new_tokens
        left = 40
        for r in s.rounds:
            outcomes = [t.outcome for t in r.draft_tokens]
            assert len(outcomes) == r.k == min(k, left - 1)  # k_r + 1 tokens fit what is left of the budget
            left -= len(r.emitted_ids)
            assert outcomes.count(ACCEPTED) + outcomes.count(REJECTED) + outcomes.count(DISCARDED) == r.k
            assert outcomes.count(ACCEPTED) == r.accepted and outcomes.count(REJECTED) <= 1
            # Accepted ones form a prefix; the rejected one (if any) comes right after it.
            assert outcomes == sorted(outcomes, key=[ACCEPTED, REJECTED, DISCARDED].index)
            assert r.emitted_ids[: r.accepted] == [t.token_id for t in r.draft_tokens[: r.accepted]]
            assert r.emitted_kinds[-1] in ("correction", "bonus") or len(r.emitted_ids) == r.accepted  # EOS cut
            assert [t.position for t in r.draft_tokens] == list(range(1, r.k + 1))
    m = speculative_metrics(spec, base)
    assert (
        m["accepted"]
        + m["rejected"]
        + sum(t.outcome == DISCARDED for s in spec for r in s.rounds for t in r.draft_tokens)
        == m["proposed"]
    )


def test_eos_stops_both_decoders_identically():
    target = tm.llama(3, sharpness=3.0, eos=tm.EOS)
    with torch.no_grad():  # make EOS likely so it is actually hit mid-generation
        target.lm_head.bias = None
        target.lm_head.weight[tm.EOS] += 0.9 * target.lm_head.weight.std() * 6
    p = tm.pair(target, tm.noisy_copy(target, 2, 0.5))
    prompts = [f"t{i} t{i + 1}" for i in range(2, 30)]
    cfg = SamplingConfig(temperature=0, max_new_tokens=30)
    ids = runs.encode_prompts(p, prompts, 30)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), prompts, ids))
    assert any(b.output_ids[-1] == tm.EOS and b.new_tokens < 30 for b in base), "test needs EOS to occur"
    for k in (2, 4):
        spec = list(runs.run_prompts(runs.speculative_decoder(p, cfg, k), prompts, ids))
        assert [s.output_ids for s in spec] == [b.output_ids for b in base]
