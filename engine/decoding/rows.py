"""The host-side state of the rows a decoder still runs: which prompt each batch row is, its committed tokens (on
the device and on the host) and its generator. Shared by the speculative loop and the target-only decoder."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.decoding.records import PromptResult
from engine.decoding.sampling import SamplingConfig, prompt_generator


class OneRow:
    """`generate`: one prompt decoded as the one-row batch of a decoder's `generate_batch` (no second loop)."""

    cfg: SamplingConfig

    def generate_batch(
        self,
        prompts: list[str],
        prompt_ids: list[torch.Tensor],
        prompt_indices: list[int],
        on_progress: Callable[[int, int], None] | None = None,
        max_new_tokens: int | None = None,
    ) -> list[PromptResult]:
        """Decode prompts together (prompt_ids[i] is [1, n_i]); one PromptResult per prompt, in input order."""
        raise NotImplementedError

    def generate(
        self,
        prompt: str,
        prompt_ids: torch.Tensor,
        prompt_index: int,
        on_progress: Callable[[int], None] | None = None,
        max_new_tokens: int | None = None,
    ) -> PromptResult:
        """Decode one prompt; on_progress(new tokens so far) runs between rounds / tokens (raise there to cancel)."""
        step = None if on_progress is None else (lambda index, tokens: on_progress(tokens))
        return self.generate_batch([prompt], [prompt_ids], [prompt_index], step, max_new_tokens)[0]


class Rows:
    """Row r of the batch (r indexes what is still running) is input prompt `live[r]`."""

    def __init__(
        self, prompt_ids: list[torch.Tensor], prompt_indices: list[int], cfg: SamplingConfig, device: torch.device
    ) -> None:
        self.live = list(range(len(prompt_ids)))
        self.seqs = [ids[0] for ids in prompt_ids]  # committed tokens per row, on the device
        self.history = [ids[0].tolist() for ids in prompt_ids]  # the same on the host (read once per batch)
        self.generators = [prompt_generator(cfg.seed, i, device) for i in prompt_indices]

    def select(self, rows: list[int]) -> None:
        """Keep only batch rows `rows` (finished rows leave)."""
        self.live = [self.live[r] for r in rows]
        self.seqs = [self.seqs[r] for r in rows]
        self.history = [self.history[r] for r in rows]
        self.generators = [self.generators[r] for r in rows]
