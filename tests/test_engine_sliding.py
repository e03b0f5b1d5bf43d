"""Sliding-window and hybrid (sliding + full, chunked) attention: rollback works past the window, and greedy
speculative decoding equals target-only decoding and transformers' own generate() (which keeps only the
window), with prompts and outputs well past it. A model whose cache cannot roll back is refused by name."""

from typing import Any

import pytest
import torch
import transformers

from engine.decoding import runs
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import speculative_metrics
from tests import tiny_models as tm
from tests.test_engine_reference import reference_rounds

WINDOW = 16
ALTERNATE = None  # sliding, full, sliding, ... as many as the model has layers
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"sliding_window": WINDOW, "use_sliding_window": True, "max_window_layers": 2},
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"sliding_window": WINDOW, "head_dim": 8, "layer_types": ALTERNATE},
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"sliding_window": WINDOW, "head_dim": 8, "layer_types": ALTERNATE},
    ),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", {"sliding_window": WINDOW, "layer_types": ALTERNATE}),
    "llama4-chunked": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        {"attention_chunk_size": WINDOW, "head_dim": 8, "intermediate_size_mlp": 64},
    ),
}
PROMPTS = [" ".join(f"t{20 + (s + 7 * i) % 44}" for i in range(n)) for s, n in ((0, 24), (3, 5), (5, 40))]
NEW = 40


def build(family: str, seed: int = 0, layers: int = 4):
    config_cls, model_cls, extra = FAMILIES[family]
    if "layer_types" in extra:
        extra = {**extra, "layer_types": (["sliding_attention", "full_attention"] * layers)[:layers]}
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tm.EOS,
        bos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
        **extra,
    )
    return tm._sharpen(getattr(transformers, model_cls)(cfg), 4.0)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_pair(request):
    target = build(request.param)
    return request.param, tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.5))


def test_greedy_speculative_equals_target_only_and_generate_past_the_window(family_pair):
    family, p = family_pair
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), PROMPTS, ids))
    model = p.target.model
    for prompt_ids, b in zip(ids, base):
        out = model.generate(
            prompt_ids,
            do_sample=False,
            max_new_tokens=NEW,
            eos_token_id=sorted(runs.eos_ids(p)),
            attention_mask=torch.ones_like(prompt_ids),
            pad_token_id=0,
        )
        assert out[0, prompt_ids.shape[1] :].tolist() == b.output_ids, family
    assert max(i.shape[1] + b.new_tokens for i, b in zip(ids, base)) > 3 * WINDOW
    for k in (2, 5):
        spec = list(runs.run_prompts(runs.speculative_decoder(p, cfg, k), PROMPTS, ids))
        assert [s.output_ids for s in spec] == [b.output_ids for b in base], (family, k)
        m = speculative_metrics(spec, base)
        assert m["rejected"] > 3 and m["accepted"] > 0  # rollbacks happened, most of them past the window


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_sampled_rounds_match_full_recompute_past_the_window(family):
    """Every round's drafts, probabilities and outcomes equal a no-cache reference that recomputes the prefix."""
    target = build(family, layers=2)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.5))
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=30, seed=2)
    prompt = PROMPTS[0]
    prompt_ids = runs.encode_prompts(p, [prompt], cfg.max_new_tokens)[0]
    got = runs.speculative_decoder(p, cfg, 3).generate(prompt, prompt_ids, 0)
    out, ref = reference_rounds(target, p.draft.model, p.vocab_size, cfg, prompt_ids, 0, 3, runs.eos_ids(p))
    assert got.output_ids == out and len(got.rounds) == len(ref)
    for r, (drafted, _accepted, emitted, outcomes, _p_d, p_t, *_) in zip(got.rounds, ref):
        assert [t.token_id for t in r.draft_tokens] == drafted and r.emitted_ids == emitted
        assert [t.outcome for t in r.draft_tokens] == outcomes
        assert [t.p_target for t in r.draft_tokens] == pytest.approx(p_t, rel=1e-3, abs=1e-5)
    assert sum(r.rejected for r in got.rounds) >= 2


def test_a_model_whose_cache_cannot_roll_back_is_refused_by_name():
    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        layer_types=["linear_attention", "full_attention"],
        eos_token_id=tm.EOS,
    )
    model = transformers.Qwen3NextForCausalLM(cfg).eval()
    model.config.name_or_path = "tiny/qwen3-next"
    p = tm.pair(model, tm.llama(1))
    with pytest.raises(DraftLabError) as err:
        runs.speculative_decoder(p, SamplingConfig(), 4)
    message = str(err.value)
    assert "tiny/qwen3-next" in message and "linear_attention" in message and "\n" not in message
