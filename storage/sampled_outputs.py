"""Whether speculation changed a server's SAMPLED outputs (`draftlab confirm` under sampling): the speculative
server's answers against the target-only server's, the same prompts in the same pass pair (A B), two tests that can
fail. Lossless speculative sampling leaves the output distribution exactly the target's, so any difference the
tests find is the server's, never chance beyond the stated level.

    compare_sampled(spec_lengths, base_lengths, spec_ids, base_ids) -> dict

Pairs: request i of each side answered the same prompt in the same pair of passes; under the null hypothesis its two
answers are draws from one distribution, so within a pair they are exchangeable (nothing is assumed across prompts).
  - lengths: scipy's Wilcoxon signed-rank test on the paired differences of output lengths (two-sided; zero
    differences dropped, Wilcoxon's rule): a server that stops early or runs on shifts them;
  - tokens: a paired permutation test (scipy.stats.permutation_test, permutation_type="samples": each pair's two
    answers swapped or not, 9,999 resamplings, seeded) of the total variation distance between the two sides' pooled
    token frequencies, over the pooled 255 most frequent tokens and one bucket for the rest (a binning chosen from
    both sides together does not depend on which side a token came from, so the test keeps its level). Tokens of one
    answer are not independent draws; swapping whole answers keeps them together.
Each at ALPHA / 2 (Bonferroni: family-wise ALPHA = 1 % per configuration and concurrency). Under MIN_PAIRS pairs
neither test can reach that level, so nothing is concluded (`differs` None). The first token alone is not tested: a
server samples it from the target's prefill, before any draft.
"""
from __future__ import annotations

import numpy as np

ALPHA = 0.01  # family-wise, per configuration and concurrency
MIN_PAIRS = 10  # the fewest pairs whose exact tests can reach ALPHA / 2 (Wilcoxon: 2 / 2**10 = 0.002)
RESAMPLES = 9999
TOKEN_BINS = 255  # the most frequent tokens of both sides, each its own bin; the rest share one
TESTS = ("Wilcoxon signed-rank on paired output lengths; paired permutation test on token frequencies (total "
         "variation distance)")


def _lengths_p(spec: np.ndarray, base: np.ndarray) -> float:
    from scipy.stats import wilcoxon

    if not np.any(spec != base):
        return 1.0  # every pair the same length: no evidence of a shift (scipy would divide by zero)
    return float(wilcoxon(spec, base, zero_method="wilcox", alternative="two-sided").pvalue)


def _token_counts(answers: list[list[int]]) -> np.ndarray:
    """Per answer, its count in each bin (the pooled TOKEN_BINS most frequent tokens, then the rest)."""
    rows = np.repeat(np.arange(len(answers)), [len(a) for a in answers])
    tokens = np.concatenate([np.asarray(a, dtype=np.int64) for a in answers] or [np.zeros(0, np.int64)])
    values, inverse, freq = np.unique(tokens, return_inverse=True, return_counts=True)
    rank = np.empty(len(values), dtype=np.int64)
    rank[np.argsort(-freq, kind="stable")] = np.arange(len(values))
    bins = np.minimum(rank[inverse], TOKEN_BINS)  # the rarer tokens share the last bin
    counts = np.zeros((len(answers), TOKEN_BINS + 1))
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


def _tokens_p(spec_ids: list[list[int]], base_ids: list[list[int]], seed: int) -> tuple[float, float]:
    from scipy.stats import permutation_test

    n = len(spec_ids)
    counts = _token_counts([*spec_ids, *base_ids])
    spec_total, total = counts[:n].sum(0), counts.sum(0)
    swap = counts[n:] - counts[:n]  # what a pair's swap moves onto the speculative side

    def statistic(x, y, axis=-1):  # x: answer indices the test put on the speculative side (pairs swapped or not)
        spec_side = spec_total + (np.moveaxis(x, axis, -1) >= n).astype(float) @ swap
        return _distance(spec_side, total - spec_side)

    result = permutation_test((np.arange(n), np.arange(n, 2 * n)), statistic, permutation_type="samples",
                              vectorized=True, n_resamples=RESAMPLES, alternative="greater",
                              rng=np.random.default_rng(seed))
    return float(result.pvalue), float(result.statistic)


def compare_sampled(spec_lengths, base_lengths, spec_ids: list[list[int]] | None,
                    base_ids: list[list[int]] | None, seed: int = 0) -> dict:
    """The two tests over paired answers (see the module docstring). `*_ids` None (a server without token ids):
    lengths only. `differs`: True when either p-value is under ALPHA / 2, False when neither is, None under
    MIN_PAIRS pairs."""
    spec, base = np.asarray(spec_lengths, dtype=float), np.asarray(base_lengths, dtype=float)
    n = int(min(len(spec), len(base)))
    spec, base = spec[:n], base[:n]
    out = {"tests": TESTS, "alpha": ALPHA, "pairs": n,
           "speculative_mean_length": float(spec.mean()) if n else None,
           "baseline_mean_length": float(base.mean()) if n else None,
           "lengths_p": None, "tokens_p": None, "token_distance": None, "differs": None}
    if n < MIN_PAIRS:
        return out
    out["lengths_p"] = _lengths_p(spec, base)
    with_ids = spec_ids is not None and base_ids is not None and any(spec_ids[:n]) and any(base_ids[:n])
    if with_ids:
        out["tokens_p"], out["token_distance"] = _tokens_p(list(spec_ids[:n]), list(base_ids[:n]), seed)
    out["differs"] = bool(min(p for p in (out["lengths_p"], out["tokens_p"]) if p is not None) < ALPHA / 2)
    return out
