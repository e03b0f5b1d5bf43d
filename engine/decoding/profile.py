"""The target's verify-cost profile: t_verify(n), one forward over n new tokens on top of a cached prompt.

A verify pass feeds k+1 tokens; on a GPU that costs about one single-token step, on a CPU (or a large batch)
it grows with n. `--k auto` measures the profile once per experiment and predicts the whole speedup-vs-k curve
from it and one run at the largest k (engine.metrics.theory.predicted_curve).
"""

from __future__ import annotations

import statistics
import time

import torch

from engine.decoding.batched_cache import BatchCache, left_pad
from engine.decoding.sampling import SamplingConfig, probabilities
from engine.decoding.torch_types import Model, inference_mode


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def verify_profile(
    model: Model,
    vocab_size: int,
    prompt_ids: torch.Tensor,
    n_max: int,
    cfg: SamplingConfig | None = None,
    repeats: int = 9,
) -> dict[int, float]:
    """Seconds of one verify step over n = 1..n_max new tokens after prompt_ids [1, L]: the one-row case of
    `batched_verify_profile` (the target forward, the processed distributions of its n rows and one host sync, as
    the loop does it; interleaved over n, repeated, made non-decreasing in n: feeding more tokens never costs less,
    and a noisy machine otherwise bends the predicted curve)."""
    return batched_verify_profile(model, vocab_size, [prompt_ids], [1], n_max, cfg, repeats)[1]


def non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return [m for m, c in blocks for _ in range(int(c))]


@inference_mode
def batched_verify_profile(
    model: Model,
    vocab_size: int,
    prompt_ids: list[torch.Tensor],
    batch_sizes: list[int],
    n_max: int,
    cfg: SamplingConfig | None = None,
    repeats: int = 9,
) -> dict[int, dict[int, float]]:
    """t_verify(B, n): seconds of one verify step of B rows over n = 1..n_max new tokens each, through the
    batched cache path the batched loop verifies with (engine/decoding/batched_cache.py: left-padded rows, the first B
    prompts of prompt_ids [1, L] each, every row's positions its own): the forward, the processed distributions
    of the B x n rows and one host sync. Every (B, n) is interleaved with the others in each repeat (so a
    loaded stretch of the machine lands on all of them), the order reversed every other repeat; the per-(B, n)
    medians are made non-decreasing in n. Returns {B: {n: seconds}}."""
    cfg = cfg or SamplingConfig()
    caches = {}
    for size in sorted(set(int(b) for b in batch_sizes)):
        rows = [ids[0] for ids in prompt_ids[:size]]
        if len(rows) < size:
            raise ValueError(f"a verify profile at batch size {size} needs {size} prompts, got {len(rows)}")
        lm = BatchCache(model, vocab_size)
        lm.reset(size)
        ids, valid = left_pad(rows, lm.device)
        lm.forward(ids, valid, keep=1)
        caches[size] = (lm, lm.lengths.clone(), rows[0][-1:].expand(size, n_max).contiguous())

    def step(size: int, n: int) -> float:
        lm, lengths, fill = caches[size]
        ones = torch.ones(size, n, dtype=torch.bool, device=lm.device)
        start = _clock(lm.device)
        probabilities(lm.forward(fill[:, :n], ones, keep=n), cfg).sum().item()
        elapsed = time.perf_counter() - start
        lm.rollback(lengths)  # every row drops its n tokens: the n last columns are holes in every row
        lm.trim(n)
        return elapsed

    order = [(size, n) for size in caches for n in range(1, n_max + 1)]
    for size in caches:
        step(size, n_max)  # warm-up at each batch size's largest shape
    times: dict[tuple[int, int], list[float]] = {key: [] for key in order}
    for repeat in range(repeats):
        for key in order if repeat % 2 == 0 else reversed(order):
            times[key].append(step(*key))
    return {
        size: dict(
            zip(range(1, n_max + 1), non_decreasing([statistics.median(times[(size, n)]) for n in range(1, n_max + 1)]))
        )
        for size in caches
    }
