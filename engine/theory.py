"""The formulas of SPEC.md / the reference article (Leviathan et al. 2023), in one place."""
from __future__ import annotations


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """(1 - α^(k+1)) / (1 - α): tokens a round emits, accepted drafts plus the correction/bonus."""
    if alpha >= 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_accepted(alpha: float, k: int) -> float:
    """α(1 - α^k) / (1 - α): the article's E[N], accepted drafts per round."""
    return expected_tokens_per_round(alpha, k) - 1


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """(1 - α^(k+1)) / ((1 - α)(1 + k/c)): tokens per round over the round's cost in target steps."""
    return expected_tokens_per_round(alpha, k) / (1 + k / c)


def best_k(alpha: float, c: float, k_max: int = 32) -> tuple[int, float]:
    """The k in 1..k_max with the highest predicted speedup, and that speedup."""
    return max(((k, predicted_speedup(alpha, k, c)) for k in range(1, k_max + 1)), key=lambda kv: kv[1])
