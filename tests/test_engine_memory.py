"""Per-run memory: the weights a model holds, and the peak bytes the decoders' KV caches held since a reset
(not the process's cumulative RSS). Exact figures for tiny models: 2 layers x (keys + values) x 2 KV heads x
head_dim 8 x 4 bytes = 256 bytes per cached token."""

from transformers import GPT2Config, GPT2LMHeadModel

from engine.decoding import runs
from engine.decoding.memory import cache_bytes, model_bytes
from engine.decoding.sampling import SamplingConfig
from tests import tiny_models as tm

TOKEN_BYTES = 2 * 2 * 2 * 8 * 4


def test_model_bytes_counts_parameters_and_buffers_once():
    model = tm.llama(0)
    params = sum(p.numel() * 4 for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert buffers > 0 and model_bytes(model) == params + buffers
    tied = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64, tie_word_embeddings=True)
    )
    assert tied.lm_head.weight.data_ptr() == tied.transformer.wte.weight.data_ptr()
    assert model_bytes(tied) == sum(p.numel() * 4 for p in tied.parameters()) + sum(
        b.numel() * b.element_size() for b in tied.buffers()
    )
    full = model_bytes(tied)
    assert model_bytes(tied.half()) == full // 2  # the element size, not the parameter count


def _pair():
    target = tm.llama(0, layers=2, sharpness=4.0)
    return tm.pair(target, tm.noisy_copy(target, 1, 0.6))


def test_baseline_peak_cache_bytes_is_the_longest_prompt_not_a_running_total():
    p = _pair()
    cfg = SamplingConfig(temperature=0, max_new_tokens=20)
    prompts = ["t3 t4 t5 t6 t7 t8 t9 t20 t21 t22", "t3 t4"]
    ids = runs.encode_prompts(p, prompts, 20)
    decoder = runs.baseline_decoder(p, cfg)
    assert decoder.peak_cache_bytes() == 0
    long, short = (decoder.generate(prompts[i], ids[i], i) for i in range(2))
    # The baseline feeds every token but the last one it emits.
    assert decoder.peak_cache_bytes() == (10 + long.new_tokens - 1) * TOKEN_BYTES
    decoder.reset_peak_cache_bytes()
    assert decoder.peak_cache_bytes() == 0
    decoder.generate(prompts[1], ids[1], 1)
    assert decoder.peak_cache_bytes() == (2 + short.new_tokens - 1) * TOKEN_BYTES
    assert cache_bytes(decoder.target.cache) == decoder.target.width * TOKEN_BYTES


def test_speculative_peak_cache_bytes_counts_both_caches_at_their_longest():
    p = _pair()
    cfg = SamplingConfig(temperature=0, max_new_tokens=30)
    prompt = "t3 t4 t5 t6 t7 t8"
    ids = runs.encode_prompts(p, [prompt], 30)[0]
    decoder = runs.speculative_decoder(p, cfg, 4)
    result = decoder.generate(prompt, ids, 0)
    # Round r starts at length L_r; the target's verify holds L_r + k_r tokens, the draft's last forward
    # L_r + k_r - 1 (its last draft is never fed).
    starts = [6 + sum(len(r.emitted_ids) for r in result.rounds[:i]) for i in range(len(result.rounds))]
    target_peak = max(s + r.k for s, r in zip(starts, result.rounds))
    draft_peak = max(s + r.k - 1 for s, r in zip(starts, result.rounds) if r.k)
    assert decoder.peak_cache_bytes() == (target_peak + draft_peak) * TOKEN_BYTES
    decoder.reset_peak_cache_bytes()
    assert decoder.peak_cache_bytes() == 0


def test_a_drafter_without_a_cache_adds_nothing():
    from engine.decoding.speculative import SpeculativeDecoder
    from engine.text.token_types import TokenTyper
    from tests.test_drafter_interface import PromptLookupDrafter

    p = _pair()
    cfg = SamplingConfig(temperature=0, max_new_tokens=12)
    decoder = SpeculativeDecoder(
        p.target.model,
        PromptLookupDrafter(3, p.vocab_size),
        p.vocab_size,
        cfg,
        TokenTyper(p.tokenizer),
        runs.eos_ids(p),
    )
    ids = runs.encode_prompts(p, ["t3 t4 t5 t3 t4"], 12)[0]
    decoder.generate("t3 t4 t5 t3 t4", ids, 0)
    assert 0 < decoder.peak_cache_bytes() <= (5 + 12) * TOKEN_BYTES
    assert decoder.peak_cache_bytes() % TOKEN_BYTES == 0
