"""Logits processing and sampling, shared verbatim by the draft, the target and the baseline.

`probabilities` is the one place temperature / top-k / top-p are applied; both models' logits go through it
before the acceptance test, so p_t and p_d always mean the same thing. Sampling draws with an explicit
torch.Generator and never syncs with the host (Gumbel-style `probs / Exp(1)` then argmax, as in gpt-fast).
"""

from __future__ import annotations

import torch

from engine.config.sampling_config import SamplingConfig as SamplingConfig  # the settings applied (torch-free)


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


def sample_rows(
    probs: torch.Tensor, cfg: SamplingConfig, generators: list[torch.Generator], draw: list[bool] | None = None
) -> torch.Tensor:
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


def row_uniforms(ks: list[int], generators: list[torch.Generator], width: int, device: torch.device) -> torch.Tensor:
    """[B, width] uniforms on [0, 1) for a verification's acceptance tests: row r draws its first ks[r] from
    generators[r] (what a one-row decode of it draws), 1 past them. No host sync."""
    draws = [torch.rand(k, generator=g, device=device) for k, g in zip(ks, generators)]
    return torch.stack([torch.nn.functional.pad(d, (0, width - d.shape[0]), value=1.0) for d in draws])


def prompt_generator(seed: int, prompt_index: int, device: torch.device | str) -> torch.Generator:
    """The generator prompt i of a run draws from, seeded by (seed, i): reproducible per prompt, any order."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + prompt_index) % (2**63 - 1))
    return g
