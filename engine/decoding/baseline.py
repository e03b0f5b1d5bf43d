"""Target-only autoregressive decoding: the denominator of every speedup.

Same logits processing, same per-prompt generator, same KV cache path (engine/decoding/batched_cache.py) and
stopping rules as the speculative loop (engine/decoding/speculative.py), so the two differ only in drafting; B prompts
decode together and a single prompt is the one-row case.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.decoding.batched_cache import BatchCache, left_pad, to_device
from engine.decoding.clock import RoundClock
from engine.decoding.records import PromptResult
from engine.decoding.rows import OneRow, Rows
from engine.decoding.sampling import SamplingConfig, probabilities, sample_rows
from engine.decoding.torch_types import Model, Tokenizer, inference_mode


class TargetOnlyDecoder(OneRow):
    """Target-only decoding of B prompts through the speculative loop's BatchCache: one forward per token for every
    running row; a row leaves the batch when it finishes (one cache gather). One host read per token (the EOS
    check, as any generate() loop)."""

    def __init__(
        self, target_model: Model, vocab_size: int, cfg: SamplingConfig, tokenizer: Tokenizer, eos_ids: set[int]
    ) -> None:
        self.target = BatchCache(target_model, vocab_size)
        self.clock = RoundClock(self.target.device)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    @inference_mode
    def generate_batch(
        self,
        prompts: list[str],
        prompt_ids: list[torch.Tensor],
        prompt_indices: list[int],
        on_progress: Callable[[int, int], None] | None = None,
        max_new_tokens: int | None = None,
    ) -> list[PromptResult]:
        cfg, clock, target = self.cfg, self.clock, self.target
        limit = max_new_tokens or cfg.max_new_tokens
        count = len(prompts)
        start = clock.wall()
        state = Rows(prompt_ids, prompt_indices, cfg, target.device)
        target.reset(count)
        ids, valid = left_pad(state.seqs, target.device)
        token = sample_rows(probabilities(target.forward(ids, valid, keep=1)[:, 0], cfg), cfg, state.generators)
        outputs = [[t] for t in token.tolist()]
        first_done = clock.wall()  # tolist() above already waited
        arrivals = [[first_done - start] for _ in range(count)]
        ones = torch.ones(count, 1, dtype=torch.bool, device=target.device)
        walls, decode = [0.0] * count, [0.0] * count
        while True:
            keep = [
                r for r, o in enumerate(state.live) if len(outputs[o]) < limit and outputs[o][-1] not in self.eos_ids
            ]
            if len(keep) < len(state.live):
                now = clock.wall()
                for r, o in enumerate(state.live):
                    if r not in keep:
                        walls[o], decode[o] = now - start, now - first_done
                if not keep:
                    break
                index = to_device(keep, target.device)
                token = token.index_select(0, index)
                target.select(keep)
                state.select(keep)
                ones = ones[: len(keep)]
            logits = target.forward(token[:, None], ones, keep=1)[:, 0]
            token = sample_rows(probabilities(logits, cfg), cfg, state.generators)
            step = token.tolist()
            arrived = clock.now() - start
            for o, t in zip(state.live, step):
                outputs[o].append(t)
                arrivals[o].append(arrived)
                if on_progress is not None:
                    on_progress(prompt_indices[o], len(outputs[o]))
        return [
            PromptResult(
                prompt_indices[o],
                prompts[o],
                outputs[o],
                self.tokenizer.decode(outputs[o], skip_special_tokens=True),
                walls[o],
                decode_steps=len(outputs[o]) - 1,
                decode_seconds=decode[o],
                token_seconds=arrivals[o],
            )
            for o in range(count)
        ]

    def peak_cache_bytes(self) -> int:
        return self.target.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.target.reset_peak()
