"""Logits processing and sampling, shared verbatim by the draft, the target and the baseline.

`probabilities` is the one place temperature / top-k / top-p are applied; both models' logits go through it
before the acceptance test, so p_t and p_d always mean the same thing. Sampling draws with an explicit
torch.Generator and never syncs with the host (Gumbel-style `probs / Exp(1)` then argmax, as in gpt-fast).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .errors import DraftLabError
from .drafter_specs import DRAFT_SAMPLING
from .variables import MIN_TEMPERATURE


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    max_new_tokens: int = 128
    # How a draft model proposes (engine/drafting.py): "probabilistic" draws each draft from p_d; "greedy" proposes
    # p_d's argmax and verification treats it as a point mass (still lossless), as vLLM's V1 drafter long did.
    draft_sampling: str = "probabilistic"
    # The temperature a draft model proposes at (engine/drafting.py): 0 = the target's. Verification uses the
    # distribution the draft sampled from, so any value is lossless; only acceptance changes.
    draft_temperature: float = 0.0

    def __post_init__(self):
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise DraftLabError(f"draft sampling must be one of {', '.join(DRAFT_SAMPLING)} (got "
                                f"{str(self.draft_sampling)[:40]!r})")
        if self.temperature < 0:
            raise DraftLabError(f"temperature must be >= 0 (got {self.temperature}); use 0 for greedy decoding")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise DraftLabError(f"temperature {self.temperature:g} is too small to compute with (a value above 0 must "
                                f"be at least {MIN_TEMPERATURE:g}); use 0 for greedy decoding")
        if self.draft_temperature < 0 or 0 < self.draft_temperature < MIN_TEMPERATURE:
            raise DraftLabError(f"draft temperature {self.draft_temperature:g} is not 0 (the target's) or at least "
                                f"{MIN_TEMPERATURE:g}; use e.g. 0.5")
        if self.top_k < 0:
            raise DraftLabError(f"top-k must be >= 0 (got {self.top_k}); use 0 to disable it")
        if not 0 < self.top_p <= 1:
            raise DraftLabError(f"top-p must be in (0, 1] (got {self.top_p}); use 1.0 to disable it")
        if self.max_new_tokens <= 0:
            raise DraftLabError(f"max-new-tokens must be > 0 (got {self.max_new_tokens})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_draft(self) -> "SamplingConfig":
        """The settings a draft model proposes under: these, at the draft temperature when one is set."""
        return replace(self, temperature=self.draft_temperature) if self.draft_temperature else self


def probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Processed next-token distributions for logits [..., V] (float32).

    Greedy runs decide by argmax; the distributions they report (p_draft, p_target, beta) are the
    temperature-1 ones after the same top-k / top-p filtering, which keeps the diagnostics informative.
    """
    logits = logits.float()
    if not cfg.greedy and cfg.temperature != 1.0:
        logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """One token per row of probs [..., V]: argmax when greedy, else an exact draw without a host sync."""
    if cfg.greedy:
        return probs.argmax(-1)
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)


def sample_rows(probs: torch.Tensor, cfg: SamplingConfig, generators: list[torch.Generator],
                draw: list[bool] | None = None) -> torch.Tensor:
    """One token per row of probs [B, V], row r drawing from generators[r] exactly as `sample` would (the same
    noise, so a row consumes its generator as a batch-1 decode of it does). Rows with draw[r] False take no noise
    from their generator (their token is the argmax, for a row that needs none). No host sync."""
    if cfg.greedy:
        return probs.argmax(-1)
    ones = None
    noise = []
    for r, g in enumerate(generators):
        if draw is None or draw[r]:
            noise.append(torch.empty_like(probs[r]).exponential_(1.0, generator=g))
        else:
            ones = torch.ones_like(probs[r]) if ones is None else ones
            noise.append(ones)
    return (probs / torch.stack(noise)).argmax(-1)


def prompt_generator(seed: int, prompt_index: int, device: torch.device | str) -> torch.Generator:
    """The generator prompt i of a run draws from, seeded by (seed, i): reproducible per prompt, any order."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + prompt_index) % (2**63 - 1))
    return g
