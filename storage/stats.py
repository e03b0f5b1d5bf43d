"""Uncertainty of a measured speedup: a paired bootstrap over prompts, and which configurations tie.

`speedup` pairs a run with its baseline prompt by prompt (timing protocol v2): throughput over the prompts
both finished, run / baseline. Its interval resamples prompts with replacement, keeping each prompt's two
timings together, so drift that hits both arms of a prompt cancels instead of widening the interval.
"""
from __future__ import annotations

import numpy as np

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95
# A spread this wide (hi / lo of the best configuration) is too wide to pick a configuration by.
TOO_WIDE = 1.25


def paired_speedup(base_tokens, base_seconds, run_tokens, run_seconds) -> float | None:
    """(Σ run tokens / Σ run seconds) / (Σ baseline tokens / Σ baseline seconds) over paired prompts. With
    equal token counts (greedy) this is SPEC's Σ median baseline time / Σ median run time."""
    bt, bs, rt, rs = (np.asarray(v, dtype=float) for v in (base_tokens, base_seconds, run_tokens, run_seconds))
    if bt.size == 0 or bs.sum() <= 0 or rs.sum() <= 0 or bt.sum() <= 0:
        return None
    return float((rt.sum() / rs.sum()) / (bt.sum() / bs.sum()))


def paired_bootstrap_ci(base_tokens, base_seconds, run_tokens, run_seconds, samples: int = BOOTSTRAP_SAMPLES,
                        confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float] | None:
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


def tied_with(best: tuple[float, float], others: dict) -> list:
    """Keys of `others` ({key: (lo, hi)}) whose interval overlaps the best configuration's (lo, hi)."""
    lo, hi = best
    return [key for key, (o_lo, o_hi) in others.items() if o_lo <= hi and o_hi >= lo]
