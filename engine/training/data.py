"""The data both trainers learn from, and how it is made: the target's own continuations of the training prompts.

Distillation (engine/training/distill.py) and EAGLE-3 head training (engine/training/head_training.py) share it:

- `Sequence`: one prompt and one continuation of it (token ids), plus what a trainer attaches per position;
- `generate`: the target's continuations exactly as target-only decoding emits them, one prompt at a time
  (held-out data, and distillation's greedy training data);
- `sample_batched`: continuations drawn from the target (or its argmax) many prompts at a time (training data);
- `pad_batch` and `chunks`: a list of sequences as one teacher-forced batch, and a pass over them in batches.

Pure torch + transformers through the engine's decoders; nothing here trains.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from engine.decoding.runs import baseline_decoder, encode_prompts, eos_ids
from engine.decoding.sampling import SamplingConfig
from engine.models.loading import ModelPair


@dataclass
class Sequence:
    """One prompt and the target's greedy continuation of it (token ids)."""

    prompt_ids: list[int]
    continuation: list[int]
    # filled by prepare(): teacher top-k per continuation position, draft position and token weight per position
    topk_ids: torch.Tensor | None = None
    topk_logp: torch.Tensor | None = None
    positions: list[int] = field(default_factory=list)
    weights: torch.Tensor | None = None
    # filled by head training's prepare() with a focus profile: the loss weight [steps, roots] of each (step, root)
    head_weights: torch.Tensor | None = None

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.continuation


def pad_batch(seqs: list[Sequence], device) -> tuple[torch.Tensor, list[int]]:
    """Teacher forcing's input: right-padded ids [B, L] (causal attention: real tokens never see the padding) and
    each sequence's length."""
    lengths = [len(s.ids) for s in seqs]
    ids = torch.zeros(len(seqs), max(lengths), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s.ids)] = torch.tensor(s.ids)
    return ids.to(device), lengths


def chunks(items: list, size: int) -> Iterator[list]:
    """`items` in consecutive slices of `size` (the last one shorter): the batches of a pass over the data."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def generate(
    pair: ModelPair, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> Iterator[Sequence]:
    """The target's continuations, exactly as target-only decoding emits them (EOS included): greedy at
    temperature 0, else drawn from p_t / temperature with the engine's per-prompt generator of `seed`."""
    cfg = SamplingConfig(temperature, 0, 1.0, seed, max_new_tokens)
    encoded = encode_prompts(pair, prompts, max_new_tokens)
    decoder = baseline_decoder(pair, cfg)
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        yield Sequence(ids[0].tolist(), list(decoder.generate(prompt, ids, i).output_ids))


@torch.no_grad()
def sample_batched(
    pair: ModelPair, prompts: list[str], max_new_tokens: int, seed: int, batch: int, greedy: bool = False
) -> Iterator[Sequence]:
    """The target's continuations drawn from p_t (temperature 1, no top-k/top-p; `greedy`: its argmax, which padding
    and batching may change in the last bits, so not the exact target-only text), `batch` prompts decoded together
    (left-padded, transformers' generate with its KV cache): one batched step costs about what one sequence's does
    on a GPU, and a few times less per token than one at a time on a CPU. Each continuation ends at EOS (kept) or
    after max_new_tokens. Batch b draws from torch's generator seeded with (seed, b): the same settings give the
    same data on the same device and batch size."""
    from transformers import GenerationConfig

    model, tok = pair.target.model, pair.tokenizer
    eos = sorted(eos_ids(pair))
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    gen_cfg = GenerationConfig(**sampling, max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos or None)
    encoded = [ids[0].tolist() for ids in encode_prompts(pair, prompts, max_new_tokens)]
    for b, start in enumerate(range(0, len(encoded), batch)):
        chunk = encoded[start : start + batch]
        width = max(len(ids) for ids in chunk)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in chunk], device=pair.device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk], device=pair.device)
        torch.manual_seed(seed * 100_003 + b)
        own, model.generation_config = model.generation_config, GenerationConfig()
        try:  # generate fills what gen_cfg leaves unset from the model's config (a repetition penalty, min_p…): not p_t
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)[:, width:].tolist()
        finally:
            model.generation_config = own
        for prompt_ids, new in zip(chunk, out):
            end = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
            yield Sequence(prompt_ids, new[:end])
