"""Uncertainty of a measured speedup (a paired bootstrap over prompts, and which configurations tie) and of a rate
pooled over prompts (α, a position's acceptance: a ratio with a prompt-level standard error).

`speedup` pairs a run with its baseline prompt by prompt (timing protocol v2): throughput over the prompts
both finished, run / baseline. Its interval resamples prompts with replacement, keeping each prompt's two
timings together, so drift that hits both arms of a prompt cancels instead of widening the interval.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike

Key = TypeVar("Key")

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95
# A spread this wide (hi / lo of the best configuration) is too wide to pick a configuration by.
TOO_WIDE = 1.25


def paired_speedup(
    base_tokens: ArrayLike, base_seconds: ArrayLike, run_tokens: ArrayLike, run_seconds: ArrayLike
) -> float | None:
    """(Σ run tokens / Σ run seconds) / (Σ baseline tokens / Σ baseline seconds) over paired prompts. With
    equal token counts (greedy) this is SPEC's Σ median baseline time / Σ median run time."""
    bt, bs, rt, rs = (np.asarray(v, dtype=float) for v in (base_tokens, base_seconds, run_tokens, run_seconds))
    if bt.size == 0 or bs.sum() <= 0 or rs.sum() <= 0 or bt.sum() <= 0:
        return None
    return float((rt.sum() / rs.sum()) / (bt.sum() / bs.sum()))


def paired_bootstrap_ci(
    base_tokens: ArrayLike,
    base_seconds: ArrayLike,
    run_tokens: ArrayLike,
    run_seconds: ArrayLike,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile interval of paired_speedup under resampling of prompts (deterministic for a seed)."""
    bt, bs, rt, rs = (np.asarray(v, dtype=float) for v in (base_tokens, base_seconds, run_tokens, run_seconds))
    n = bt.size
    if n == 0 or paired_speedup(bt, bs, rt, rs) is None:
        return None
    idx = np.random.default_rng(seed).integers(0, n, size=(samples, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (rt[idx].sum(1) / rs[idx].sum(1)) / (bt[idx].sum(1) / bs[idx].sum(1))
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return None
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def tied_with(best: tuple[float, float], others: Mapping[Key, tuple[float, float]]) -> list[Key]:
    """Keys of `others` ({key: (lo, hi)}) whose interval overlaps the best configuration's (lo, hi)."""
    lo, hi = best
    return [key for key, (o_lo, o_hi) in others.items() if o_lo <= hi and o_hi >= lo]


def clustered_ratio_se(
    numerators: Iterable[float], denominators: Iterable[float | None]
) -> tuple[float, float | None, int] | None:
    """(Σnum / Σden, its standard error, prompts) treating each pair (a prompt) as one independent draw: the ratio
    estimator's sqrt(n / (n - 1) · Σ (num_i − r·den_i)²) / Σden. Tokens of one prompt are not independent draws (they
    share its text and its drafts), so this is the error of α, not √(α(1 − α)/N). Pairs without a denominator are
    left out; the error is None under two prompts; None without a denominator at all."""
    pairs = [(float(a), float(b)) for a, b in zip(numerators, denominators) if b and b > 0]
    total = sum(b for _, b in pairs)
    if not pairs or total <= 0:
        return None
    ratio = sum(a for a, _ in pairs) / total
    n = len(pairs)
    if n < 2:
        return ratio, None, n
    return ratio, math.sqrt(n / (n - 1) * sum((a - ratio * b) ** 2 for a, b in pairs)) / total, n


def percentile(values: Collection[float] | np.ndarray, q: float) -> float | None:
    """The q-th percentile of the values, linearly interpolated between the two nearest ranks (numpy's default
    method: rank (n - 1) * q / 100 from 0); None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def wilson_interval(successes: float, trials: float, z: float = 1.959964) -> tuple[float, float] | None:
    """The Wilson score interval (95 % by default) of a rate of `successes` in `trials` independent trials; None
    without trials. A mean of per-trial shares in [0, 1] (a round's accepted share of its drafts) has a variance no
    larger than a Bernoulli's of the same mean, so the interval bounds it too, conservatively."""
    if trials <= 0:
        return None
    p = min(1.0, max(0.0, successes / trials))
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)
