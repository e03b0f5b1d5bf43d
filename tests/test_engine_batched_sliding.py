"""Batched decoding is lossless on sliding-window and chunked-attention models: with prompts of different lengths
(left padding) and a random unrelated draft that rejects almost every round (holes inside every window), every
greedy row at batch 1, 3 and 8 equals that prompt's target-only decoding alone, well past the window (Mistral-,
Qwen2-, Gemma2/Gemma3-, Cohere2-style sliding and Llama4 chunked). A model the batched cache cannot decode exactly
(ALiBi counted in columns, no position_ids, a per-column temperature) is refused in one line before any forward;
ALiBi counted from the attention mask (Bloom, Falcon) is exact and runs."""

import functools

import pytest
import torch
import transformers

from engine.decoding import runs
from engine.decoding.attention_masks import batch_support
from engine.decoding.batched_cache import BatchCache
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from tests import tiny_models as tm
from tests.test_engine_batched import decode_in_batches
from tests.test_engine_sliding import FAMILIES, WINDOW, build

# Lengths 2..40 around the window of 16: rows start at different columns and most cross the window in the prompt.
PROMPTS = [
    " ".join(f"t{20 + (s + 7 * i) % 44}" for i in range(n))
    for s, n in ((0, 24), (3, 5), (5, 40), (1, 2), (7, 17), (2, 31), (4, 9), (6, 13))
]
NEW = 48
K = 4


def build_batchable(family: str, seed: int = 0):
    model = build(family, seed=seed)
    model.generation_config.eos_token_id = None  # every row decodes its NEW tokens, well past the window
    if family == "llama4-chunked":  # its NoPE temperature is per column: refused at batch > 1 (test below)
        model.config.attn_temperature_tuning = False
        for layer in model.model.layers:
            layer.self_attn.attn_temperature_tuning = False
    return model


@functools.cache
def rejecting(family: str):
    """A target and an unrelated random draft of the same family (almost every draft is rejected), the greedy
    config, the prompts' ids, and each prompt's target-only decoding alone."""
    target = build_batchable(family)
    pair = tm.pair(target, build_batchable(family, seed=9), tm.tokenizer(64, eos=False))
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(pair, PROMPTS, NEW)
    alone = runs.baseline_decoder(pair, cfg)
    return family, pair, cfg, ids, [alone.generate(p, i, n).output_ids for n, (p, i) in enumerate(zip(PROMPTS, ids))]


@pytest.fixture(scope="module", params=list(FAMILIES))
def rejecting_pair(request):
    return rejecting(request.param)


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batched_greedy_rows_equal_each_prompt_alone_past_the_window(rejecting_pair, batch):
    family, pair, cfg, ids, alone = rejecting_pair
    assert all(len(a) == NEW for a in alone) and max(i.shape[1] for i in ids) + NEW > 5 * WINDOW
    decoder = runs.speculative_decoder(pair, cfg, K)
    rows = decode_in_batches(decoder, PROMPTS, ids, batch)
    for n, (row, want) in enumerate(zip(rows, alone)):
        got = row.output_ids
        first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, f"{family} batch {batch}: prompt {n} differs from token {first}"
    drafted = sum(len(r.draft_tokens) for row in rows for r in row.rounds)
    rejected = sum(t.outcome == "rejected" for row in rows for r in row.rounds for t in r.draft_tokens)
    assert rejected > 0.8 * len(rows) * NEW / (K + 1) and rejected < drafted  # holes in nearly every round
    if batch > 1:
        assert decoder.hole_share > 0  # padding and holes inside the windows
        baseline = decode_in_batches(runs.baseline_decoder(pair, cfg), PROMPTS, ids, batch)
        assert [b.output_ids for b in baseline] == alone, family


@pytest.mark.parametrize("family", ["mistral", "gemma2"])  # all layers sliding; sliding and full alternating
def test_ragged_drafts_and_prompt_lookup_stay_exact_at_batch_8(family):
    """Rows drafting different numbers of tokens (heuristic k, prompt lookup) leave holes of every width."""
    family, pair, cfg, ids, alone = rejecting(family)
    for drafter in ("heuristic", "prompt-lookup:1"):
        rows = decode_in_batches(runs.speculative_decoder(pair, cfg, K, drafter=drafter), PROMPTS, ids, 8)
        assert [r.output_ids for r in rows] == alone, (family, drafter)


def tiny(config_name: str, model_name: str, **extra):
    """A random ALiBi model with weights wide enough (std 0.3) that its greedy outputs vary token to token."""
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=64, hidden_size=32, num_attention_heads=4, eos_token_id=tm.EOS, **extra
    )
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    model.config.name_or_path = f"tiny/{config.model_type}"
    model.generation_config.eos_token_id = None
    return model


ALIBI = {
    "bloom": lambda: tiny("BloomConfig", "BloomForCausalLM", n_layer=2),
    "falcon": lambda: tiny(
        "FalconConfig",
        "FalconForCausalLM",
        num_hidden_layers=2,
        alibi=True,
        new_decoder_architecture=False,
        multi_query=True,
    ),
    "mpt": lambda: tiny("MptConfig", "MptForCausalLM", n_layers=2, d_model=32, n_heads=4, max_seq_len=256),
}


@pytest.mark.parametrize("family", ["bloom", "falcon"])
def test_alibi_built_from_the_mask_count_is_exact_at_batch_3_and_8(family):
    """Bloom's and Falcon's ALiBi counts real tokens in the attention mask: each row's own positions, holes and all."""
    target = ALIBI[family]()
    pair = tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.15), tm.tokenizer(64, eos=False))
    assert batch_support(target) is None
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(pair, PROMPTS, NEW)
    baseline = runs.baseline_decoder(pair, cfg)
    alone = [baseline.generate(p, i, n).output_ids for n, (p, i) in enumerate(zip(PROMPTS, ids))]
    for batch in (3, 8):
        rows = decode_in_batches(runs.speculative_decoder(pair, cfg, K), PROMPTS, ids, batch)
        assert [r.output_ids for r in rows] == alone, (family, batch)
        partial = sum(0 < r.accepted < r.k for row in rows for r in row.rounds)
        assert partial > 3  # rows kept different numbers of drafts: holes between their tokens


def test_alibi_counted_in_columns_is_refused_at_batch_above_1_in_one_line():
    model = ALIBI["mpt"]()  # MPT's ALiBi is a function of the cache column: holes would shift it
    pair = tm.pair(model, tm.noisy_copy(model, seed=1, noise=0.15))
    cfg = SamplingConfig(temperature=0, max_new_tokens=4)
    ids = runs.encode_prompts(pair, PROMPTS[:3], 4)
    for decoder in (runs.speculative_decoder(pair, cfg, 2), runs.baseline_decoder(pair, cfg)):
        with pytest.raises(DraftLabError) as err:
            decoder.generate_batch(PROMPTS[:3], ids[:3], [0, 1, 2])
        message = str(err.value)
        assert message.startswith("tiny/mpt uses ALiBi") and message.endswith("run it at batch size 1")
        assert "\n" not in message
        # one row is the batch-1 case: nothing to refuse
        assert len(decoder.generate_batch(PROMPTS[:1], ids[:1], [0])[0].output_ids) == 4


class _NoPositions(transformers.LlamaForCausalLM):
    """A forward that never hears of position_ids (it counts positions in cache columns)."""

    def forward(self, input_ids=None, attention_mask=None, cache=None, use_cache=None, logits_to_keep=0):
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
        )


def test_other_models_the_cache_cannot_decode_exactly_are_refused_and_the_demo_families_are_not():
    chunked = build("llama4-chunked")  # attn_temperature_tuning on, a NoPE layer: a per-column scale
    assert "attn_temperature_tuning" in batch_support(chunked)
    assert batch_support(build_batchable("llama4-chunked")) is None
    no_positions = _NoPositions(tm.llama(0).config)
    assert "takes no position_ids" in batch_support(no_positions)
    eager_flash = build("mistral")
    eager_flash.config._attn_implementation = "flash_attention_2"
    assert "'flash_attention_2'" in batch_support(eager_flash)
    for model in (tm.llama(0), tm.gpt2(0), *(build(f) for f in FAMILIES if f != "llama4-chunked")):
        assert batch_support(model) is None, model.config.model_type
    with pytest.raises(DraftLabError, match="attn_temperature_tuning"):
        BatchCache(chunked, 64).reset(2)
    BatchCache(chunked, 64).reset(1)


def test_full_attention_models_build_no_position_masks():
    """GPT-2 / Llama keep transformers' own 2-D masks; a windowed model at batch 1 needs none either."""
    assert BatchCache(tm.llama(0), 64)._position_masks is None
    assert BatchCache(tm.gpt2(0), 64)._position_masks is None
    windowed = BatchCache(build("mistral"), 64)
    assert windowed._position_masks is not None
    built = []
    real = windowed._position_masks
    windowed._position_masks = lambda mask, width: built.append(mask.shape) or real(mask, width)
    for rows in (1, 3):
        windowed.reset(rows)
        ids = torch.arange(3, 7).repeat(rows, 1)
        windowed.forward(ids, torch.ones_like(ids, dtype=torch.bool), keep=1)
    assert built == [(3, 4)]  # the lone row went through the model's own causal path: no mask built
