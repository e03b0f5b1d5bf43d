"""Each round's k is capped at what is left: the token budget (a round emits at most k_r + 1 tokens) and the
models' positions. A huge k costs nothing past the budget, a prompt near the context limit does not crash,
and a k that can never fit the context is refused up front."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from engine.decoding import runs
from engine.decoding.drafting import ModelDrafter
from engine.decoding.sampling import SamplingConfig
from engine.decoding.speculative import SpeculativeDecoder
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import speculative_metrics
from engine.text.token_types import TokenTyper
from tests import tiny_models as tm


def gpt2(seed: int, positions: int):
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=positions,
        eos_token_id=tm.EOS,
        bos_token_id=0,
        tie_word_embeddings=False,
    )
    return tm._sharpen(GPT2LMHeadModel(cfg), 4.0)


def llama(seed: int, positions: int):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        eos_token_id=tm.EOS,
        tie_word_embeddings=False,
    )
    return tm._sharpen(LlamaForCausalLM(cfg), 4.0)


def _prompt(n: int, start: int = 2) -> str:
    """n tokens (ids 20..63: the EOS token's text "t1" would split a word like "t12")."""
    return " ".join(f"t{20 + (start + i * 7) % 44}" for i in range(n))


@pytest.mark.parametrize("prompt_len", [22, 24, 28, 31])
def test_prompt_near_the_position_limit_does_not_crash(prompt_len):
    """GPT-2 (absolute positions: an index past n_positions is an IndexError on CPU, a device assert on CUDA)."""
    target = gpt2(0, positions=32)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.6))
    new = 32 - prompt_len
    prompts = [_prompt(prompt_len, s) for s in range(4)]
    cfg = SamplingConfig(temperature=0, max_new_tokens=new)
    ids = runs.encode_prompts(p, prompts, new)
    assert all(i.shape[1] == prompt_len for i in ids)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), prompts, ids))
    spec = list(runs.run_prompts(runs.speculative_decoder(p, cfg, 8), prompts, ids))
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    for s in spec:
        for r in s.rounds:
            assert r.k <= 32 - prompt_len - 1


class SpyDrafter(ModelDrafter):
    """Records each round's (sequence length, max_tokens) and checks the proposal honours the cap."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def propose(self, seqs, history, generators, caps):
        proposal = super().propose(seqs, history, generators, caps)
        self.calls.append((seqs[0].shape[0], caps[0], proposal.ks[0]))
        assert proposal.ks[0] <= caps[0]
        return proposal


@pytest.mark.parametrize("noise", [0.0, 0.6])
def test_huge_k_drafts_no_further_than_the_budget(noise):
    target = llama(0, positions=4096)
    draft = copy.deepcopy(target) if noise == 0 else tm.noisy_copy(target, 1, noise)
    p = tm.pair(target, draft)
    cfg = SamplingConfig(temperature=0, max_new_tokens=16)
    prompts = [_prompt(5, s) for s in range(3)]
    ids = runs.encode_prompts(p, prompts, 16)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), prompts, ids))
    spec = list(runs.run_prompts(runs.speculative_decoder(p, cfg, 1000), prompts, ids))
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    for s in spec:
        left = 16
        for r in s.rounds:
            assert r.k <= left - 1  # the round's k_r + 1 tokens fit what is left
            left -= len(r.emitted_ids)
        # Each round emits >= 1 token, so at most 15 + 14 + ... + 0 drafts: not 1000 per round.
        assert sum(r.k for r in s.rounds) <= 16 * 15 // 2
    m = speculative_metrics(spec, base)
    if noise == 0:  # the draft is the target: one round of 15 accepted drafts plus the bonus per prompt
        assert m["rounds"] == len(prompts) and m["proposed"] == m["accepted"] == 15 * len(prompts)


def test_the_loop_passes_the_cap_to_the_drafter():
    target = gpt2(0, positions=40)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.6))
    cfg = SamplingConfig(temperature=0, max_new_tokens=10)
    drafter = SpyDrafter(p.draft.model, p.vocab_size, 6, cfg)
    decoder = SpeculativeDecoder(p.target.model, drafter, p.vocab_size, cfg, TokenTyper(p.tokenizer), runs.eos_ids(p))
    prompt = _prompt(30)
    ids = runs.encode_prompts(p, [prompt], 10)[0]
    result = decoder.generate(prompt, ids, 0)
    done = 0
    for (length, cap, k), r in zip(drafter.calls, result.rounds):
        assert length == 30 + done
        assert cap == min(10 - done - 1, 40 - length) and k == r.k == min(6, cap)
        done += len(r.emitted_ids)
    assert done == result.new_tokens == 10


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_token_budget_is_a_round_without_drafts(temperature):
    """k_r = 0: the round is one plain target step; its token is the target's own (a bonus)."""
    target = tm.llama(0, layers=2, sharpness=4.0)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.6))
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=1, seed=3)
    ids = runs.encode_prompts(p, ["t3 t4 t5"], 1)
    base = runs.baseline_decoder(p, cfg).generate("t3 t4 t5", ids[0], 0)
    spec = runs.speculative_decoder(p, cfg, 4).generate("t3 t4 t5", ids[0], 0)
    assert [r.k for r in spec.rounds] == [0] and spec.rounds[0].draft_tokens == []
    assert spec.rounds[0].emitted_kinds == ["bonus"] and spec.new_tokens == 1
    if temperature == 0:
        assert spec.output_ids == base.output_ids
    m = speculative_metrics([spec])
    assert m["proposed"] == m["accepted"] == m["rejected"] == 0 and m["tokens_per_round"] == 1


def test_k_that_cannot_fit_the_context_is_refused():
    target = gpt2(0, positions=32)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.6))
    cfg = SamplingConfig(temperature=0, max_new_tokens=4)
    runs.speculative_decoder(p, cfg, 31)  # a one-token prompt plus 31 drafts fits
    for k in (32, 1000):
        with pytest.raises(DraftLabError) as err:
            runs.speculative_decoder(p, cfg, k)
        message = str(err.value)
        assert f"k {k}" in message and "32 positions" in message and "--k" in message and "\n" not in message
