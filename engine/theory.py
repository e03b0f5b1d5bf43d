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


def expected_round_length(per_position_acceptance: list[float]) -> float:
    """E[L] = 1 + Σ_i Π_{j≤i} a_j: tokens a round emits, from the measured conditional acceptance per position."""
    length, survive = 1.0, 1.0
    for a in per_position_acceptance:
        survive *= a
        length += survive
    return length


def refined_speedup(expected_length: float, t_target: float, draft_seconds_per_round: float,
                    verify_seconds_per_round: float) -> float | None:
    """SPEC's predicted_speedup_refined: E[L] · t_target / (draft time per round + verify time per round), the
    article's formula with the verify pass at its measured cost instead of one target step."""
    cost = draft_seconds_per_round + verify_seconds_per_round
    return expected_length * t_target / cost if cost > 0 else None


def predicted_curve(per_position_acceptance: list[float], draft_step_seconds: float, round_overhead_seconds: float,
                    verify_seconds: dict[int, float], target_seconds_per_token: float) -> dict[int, float]:
    """Predict the speedup of every k = 1..len(per_position_acceptance) from one run at the largest k
    (`--k auto`): E[L_k] from the first k positions' acceptance, a round costing k draft steps, the
    target's verify forward over k+1 tokens (its measured profile) and the run's per-round overhead."""
    curve = {}
    for k in range(1, len(per_position_acceptance) + 1):
        if k + 1 not in verify_seconds:
            break
        cost = k * draft_step_seconds + verify_seconds[k + 1] + round_overhead_seconds
        curve[k] = expected_round_length(per_position_acceptance[:k]) * target_seconds_per_token / cost
    return curve
