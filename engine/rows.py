"""The host-side state of the rows a decoder still runs: which prompt each batch row is, its committed tokens (on
the device and on the host) and its generator. Shared by the speculative loop and the target-only decoder."""
from __future__ import annotations

import torch

from .sampling import SamplingConfig, prompt_generator


class Rows:
    """Row r of the batch (r indexes what is still running) is input prompt `live[r]`."""

    def __init__(self, prompt_ids: list[torch.Tensor], prompt_indices: list[int], cfg: SamplingConfig, device):
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
