"""Target-only autoregressive decoding: the denominator of every speedup.

Same logits processing, same per-prompt generator, same KV cache wrapper and stopping rules as the
speculative loop, so the two differ only in drafting.
"""
from __future__ import annotations

from typing import Callable

import torch

from .cached_model import CachedModel
from .clock import RoundClock
from .records import PromptResult
from .sampling import SamplingConfig, probabilities, prompt_generator, sample


class TargetOnlyDecoder:
    def __init__(self, target_model, vocab_size: int, cfg: SamplingConfig, tokenizer, eos_ids: set[int]):
        self.target = CachedModel(target_model, vocab_size)
        self.clock = RoundClock(self.target.device)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    @torch.inference_mode()
    def generate(self, prompt: str, prompt_ids: torch.Tensor, prompt_index: int,
                 on_progress: Callable[[int], None] | None = None, max_new_tokens: int | None = None) -> PromptResult:
        """Decode one prompt; on_progress(new tokens so far) runs after each token (raise there to cancel)."""
        cfg, g = self.cfg, prompt_generator(self.cfg.seed, prompt_index, self.target.device)
        limit = max_new_tokens or cfg.max_new_tokens
        start = self.clock.wall()
        token = sample(probabilities(self.target.prefill(prompt_ids), cfg), cfg, g)
        output = [int(token)]
        first_done = self.clock.wall()  # int() above already waited: this sync costs nothing
        arrivals = [first_done - start]  # when each token reached the host, seconds from the start
        while len(output) < limit and output[-1] not in self.eos_ids:
            logits = self.target.forward(token.view(1, 1), keep=1)[0]
            token = sample(probabilities(logits, cfg), cfg, g)
            output.append(int(token))  # the per-token EOS check syncs, as any generate() loop does
            arrivals.append(self.clock.now() - start)
            if on_progress is not None:
                on_progress(len(output))
        end = self.clock.wall()
        text = self.tokenizer.decode(output, skip_special_tokens=True)
        return PromptResult(prompt_index, prompt, output, text, end - start,
                            decode_steps=len(output) - 1, decode_seconds=end - first_done, token_seconds=arrivals)

    def peak_cache_bytes(self) -> int:
        """Peak KV-cache bytes since the last reset (engine/memory.py)."""
        return self.target.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.target.reset_peak()
