"""Whether speculation changed a server's SAMPLED outputs (`draftlab confirm` under sampling): the speculative
server's answers against the target-only server's to the same prompts, two tests that can fail. Lossless speculative
sampling leaves the output distribution exactly the target's, so any difference the tests find is the server's,
never chance beyond the stated level.

    compare_sampled(spec_lengths, base_lengths, spec_ids, base_ids) -> dict   (each a list per prompt)

The unit is the PROMPT: its answers on each server over all passes. Answers of one prompt need not be independent
draws (a request's `seed` makes vLLM answer a prompt the same way every pass: confirming a sampled experiment with
the deploy export's one seed gave 18 prompts, 36 answers, 18 distinct), so neither test counts passes as samples.
Prompts must be independent of each other (app/serving/confirm.py's `pass_seeds` gives every request its own seed).
Under the null hypothesis a prompt's two sides are draws of one process, so they are exchangeable:
  - lengths: scipy's Wilcoxon signed-rank test on the paired differences of the prompts' mean output lengths
    (two-sided; zero differences dropped, Wilcoxon's rule): a server that stops early or runs on shifts them;
  - tokens: a paired permutation test (scipy.stats.permutation_test, permutation_type="samples": each prompt's two
    sides swapped or not, 9,999 resamplings, seeded) of the total variation distance between the two sides' pooled
    token frequencies, over the pooled 255 most frequent tokens and one bucket for the rest (a binning chosen from
    both sides together does not depend on which side a token came from, so the test keeps its level).
Each at ALPHA / 2 (Bonferroni: family-wise ALPHA = 1 % per configuration and concurrency). Under MIN_PROMPTS prompts
neither test can reach that level, so nothing is concluded (`differs` None). The first token alone is not tested: a
server samples it from the target's prefill, before any draft.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ALPHA = 0.01  # family-wise, per configuration and concurrency
MIN_PROMPTS = 10  # the fewest prompts whose exact tests can reach ALPHA / 2 (Wilcoxon: 2 / 2**10 = 0.002)
RESAMPLES = 9999
TOKEN_BINS = 255  # the most frequent tokens of both sides, each its own bin; the rest share one
TESTS = (
    "per prompt: Wilcoxon signed-rank on paired mean output lengths; paired permutation test on token "
    "frequencies (total variation distance)"
)


def _lengths_p(spec: np.ndarray, base: np.ndarray) -> float:
    from scipy.stats import wilcoxon

    if not np.any(spec != base):
        return 1.0  # every pair the same length: no evidence of a shift (scipy would divide by zero)
    return float(wilcoxon(spec, base, zero_method="wilcox", alternative="two-sided").pvalue)


def _token_counts(units: list[list[list[int]]]) -> np.ndarray:
    """Per unit (a prompt's answers on one side), its count in each bin (the pooled TOKEN_BINS most frequent tokens,
    then the rest)."""
    flat = [[t for answer in unit for t in answer] for unit in units]
    rows = np.repeat(np.arange(len(flat)), [len(u) for u in flat])
    tokens = np.concatenate([np.asarray(u, dtype=np.int64) for u in flat] or [np.zeros(0, np.int64)])
    values, inverse, freq = np.unique(tokens, return_inverse=True, return_counts=True)
    rank = np.empty(len(values), dtype=np.int64)
    rank[np.argsort(-freq, kind="stable")] = np.arange(len(values))
    bins = np.minimum(rank[inverse], TOKEN_BINS)  # the rarer tokens share the last bin
    counts = np.zeros((len(flat), TOKEN_BINS + 1))
    np.add.at(counts, (rows, bins), 1)
    return counts


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Total variation distance between token-count vectors' frequencies along the last axis (1 when one side has
    no tokens, 0 when neither has)."""
    sa, sb = a.sum(-1, keepdims=True), b.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = 0.5 * np.abs(a / sa - b / sb).sum(-1)
    empty = (sa[..., 0] == 0) | (sb[..., 0] == 0)
    return np.where(empty, np.where(sa[..., 0] == sb[..., 0], 0.0, 1.0), d)


def _tokens_p(spec_ids: list[list[list[int]]], base_ids: list[list[list[int]]], seed: int) -> tuple[float, float]:
    from scipy.stats import permutation_test

    n = len(spec_ids)
    counts = _token_counts([*spec_ids, *base_ids])
    spec_total, total = counts[:n].sum(0), counts.sum(0)
    swap = counts[n:] - counts[:n]  # what a prompt's swap moves onto the speculative side

    def statistic(
        x: np.ndarray, y: np.ndarray, axis: int = -1
    ) -> np.ndarray:  # x: unit indices the test put on the speculative side (prompts swapped or not)
        spec_side = spec_total + (np.moveaxis(x, axis, -1) >= n).astype(float) @ swap
        return _distance(spec_side, total - spec_side)

    result = permutation_test(
        (np.arange(n), np.arange(n, 2 * n)),
        statistic,
        permutation_type="samples",
        vectorized=True,
        n_resamples=RESAMPLES,
        alternative="greater",
        rng=np.random.default_rng(seed),
    )
    return float(result.pvalue), float(result.statistic)


def _means(lengths: list[list[int]]) -> np.ndarray:
    return np.array([np.mean(x) if len(x) else 0.0 for x in lengths], dtype=float)


def compare_sampled(
    spec_lengths: list[list[int]],
    base_lengths: list[list[int]],
    spec_ids: list[list[list[int]]] | None,
    base_ids: list[list[list[int]]] | None,
    seed: int = 0,
) -> dict[str, Any]:
    """The two tests over the prompts both sides answered (see the module docstring); each argument holds one list
    per prompt (its answers' lengths, or token ids, over the passes). `*_ids` None (a server without token ids):
    lengths only. `differs`: True when either p-value is under ALPHA / 2, False when neither is, None under
    MIN_PROMPTS prompts."""
    n = min(len(spec_lengths), len(base_lengths))
    spec, base = _means(spec_lengths[:n]), _means(base_lengths[:n])
    pooled = [[x for lengths in side[:n] for x in lengths] for side in (spec_lengths, base_lengths)]
    out: dict[str, Any] = {
        "tests": TESTS,
        "alpha": ALPHA,
        "prompts": n,
        "answers": len(pooled[0]),
        "speculative_mean_length": float(np.mean(pooled[0])) if pooled[0] else None,
        "baseline_mean_length": float(np.mean(pooled[1])) if pooled[1] else None,
        "lengths_p": None,
        "tokens_p": None,
        "token_distance": None,
        "differs": None,
    }
    if n < MIN_PROMPTS:
        return out
    out["lengths_p"] = _lengths_p(spec, base)
    if spec_ids is not None and base_ids is not None and any(map(any, spec_ids[:n])) and any(map(any, base_ids[:n])):
        out["tokens_p"], out["token_distance"] = _tokens_p(list(spec_ids[:n]), list(base_ids[:n]), seed)
    out["differs"] = bool(min(p for p in (out["lengths_p"], out["tokens_p"]) if p is not None) < ALPHA / 2)
    return out
