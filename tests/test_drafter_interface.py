"""The loop only talks to the Drafter protocol (engine/decoding/drafting.py): a model-free drafter (one-hot proposals)
and a dynamic-k policy plug in without touching engine/decoding/speculative.py, and stay lossless."""

import math

from engine.decoding import runs
from engine.decoding.drafting import HostDrafter, ModelDrafter
from engine.decoding.sampling import SamplingConfig
from engine.decoding.speculative import SpeculativeDecoder
from engine.text.token_types import TokenTyper
from tests import tiny_models as tm


class PromptLookupDrafter(HostDrafter):
    """Proposes the (up to k) tokens that followed the last earlier occurrence of the current last token; no
    occurrence, no drafts (the round is one plain target step)."""

    def __init__(self, k: int, vocab: int):
        super().__init__(vocab, k)

    def begin_row(self, history, prompt_index):
        return None

    def follow(self, state, seq, max_tokens):
        last = seq[-1]
        hits = [i for i in range(len(seq) - 1) if seq[i] == last]
        return seq[hits[-1] + 1 :][:max_tokens] if hits else []


class GrowShrinkDrafter(ModelDrafter):
    """transformers' heuristic: k += 2 after a fully accepted round, k -= 1 (min 1) otherwise."""

    def next_ks(self, ks, proposed, accepted):
        return [k + 2 if a == k else max(1, k - 1) for k, a in zip(ks, accepted)]


def _pair():
    target = tm.llama(0, layers=2, sharpness=4.0)
    return tm.pair(target, tm.noisy_copy(target, 1, 0.3))


def _decode(p, drafter, cfg, prompts):
    decoder = SpeculativeDecoder(p.target.model, drafter, p.vocab_size, cfg, TokenTyper(p.tokenizer), runs.eos_ids(p))
    ids = runs.encode_prompts(p, prompts, cfg.max_new_tokens)
    return [decoder.generate(text, i_ids, i) for i, (text, i_ids) in enumerate(zip(prompts, ids))]


PROMPTS = ["t3 t4 t5 t3 t4 t5 t3 t4", "t9 t10 t11 t12 t9 t10"]


def test_prompt_lookup_drafter_is_lossless_and_has_no_kl():
    p = _pair()
    cfg = SamplingConfig(temperature=0, max_new_tokens=30)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), PROMPTS, runs.encode_prompts(p, PROMPTS, 30)))
    spec = _decode(p, PromptLookupDrafter(3, p.vocab_size), cfg, PROMPTS)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    tokens = [t for s in spec for r in s.rounds for t in r.draft_tokens]
    assert tokens and all(math.isnan(t.kl) and t.p_draft == 1.0 for t in tokens)
    assert any(r.k == 0 for s in spec for r in s.rounds)  # rounds without a match ran without drafts


def test_dynamic_k_policy_changes_k_per_round_and_stays_lossless():
    p = _pair()
    cfg = SamplingConfig(temperature=0, max_new_tokens=40)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), PROMPTS, runs.encode_prompts(p, PROMPTS, 40)))
    spec = _decode(p, GrowShrinkDrafter(p.draft.model, p.vocab_size, 2, cfg), cfg, PROMPTS)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    ks = {r.k for s in spec for r in s.rounds}
    assert len(ks) > 1  # k really varied from round to round
