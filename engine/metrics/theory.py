"""The formulas of SPEC.md / the reference article (Leviathan et al. 2023), in one place."""

from __future__ import annotations

import numpy as np


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


def cost_aware_speedup(expected_length: float, draft_cost: float, verify_cost: float) -> float | None:
    """The cost-aware prediction, in one place: tokens a round emits over what the round costs in target steps,
    E[L] / (draft cost + verify cost). With a geometric E[L_k] from α, draft cost k/c and verify cost 1 it is
    predicted_speedup; a run's own measured figures make it SPEC's predicted_speedup_refined (refined_speedup)."""
    cost = draft_cost + verify_cost
    return expected_length / cost if cost > 0 else None


def refined_speedup(
    expected_length: float, t_target: float, draft_seconds_per_round: float, verify_seconds_per_round: float
) -> float | None:
    """SPEC's predicted_speedup_refined: E[L] · t_target / (draft time per round + verify time per round), the
    article's formula with the verify pass at its measured cost instead of one target step: cost_aware_speedup with
    the round's draft and verify time in target steps."""
    if t_target <= 0:
        return None
    return cost_aware_speedup(expected_length, draft_seconds_per_round / t_target, verify_seconds_per_round / t_target)


def predicted_curve(
    per_position_acceptance: list[float],
    draft_step_seconds: float,
    round_overhead_seconds: float,
    verify_seconds: dict[int, float],
    target_seconds_per_token: float,
) -> dict[int, float]:
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


def simulated_rounds(
    per_position_acceptance: list[float], k: int, tokens: int, samples: int, rng: np.random.Generator
) -> np.ndarray:
    """Rounds a row needs to emit `tokens` tokens at k, in `samples` simulated decodes: each round the draft at
    position i is accepted with probability per_position_acceptance[i-1] while every draft before it was; the
    round emits the accepted drafts plus one; the last rounds draft no more than the budget leaves (as the
    loops cap them)."""
    a = np.asarray(list(per_position_acceptance[:k]) + [0.0] * (k - len(per_position_acceptance[:k])))
    emitted = np.zeros(samples)
    rounds = np.zeros(samples)
    while (emitted < tokens).any():
        running = emitted < tokens
        cap = np.clip(tokens - emitted - 1, 0, k)  # drafts this round may propose
        survive = np.cumprod(rng.random((samples, k)) < a[None, :], axis=1)  # every draft so far accepted
        accepted = (survive * (np.arange(1, k + 1)[None, :] <= cap[:, None])).sum(1)
        emitted += running * (accepted + 1)
        rounds += running
    return rounds


def expected_batch_rounds(rows: list[tuple[list[float], int]], k: int, samples: int = 256, seed: int = 0) -> float:
    """E[rounds of a batch]: its rows ((per-position acceptance, tokens to emit) each) share every round's
    forward and the batch runs until its slowest row is done (rows that finish leave, the others go on), so a
    batch lasts the max over its rows of each row's rounds. Monte Carlo over `samples` decodes, seeded."""
    rng = np.random.default_rng(seed)
    longest = np.zeros(samples)
    for acceptance, tokens in rows:
        longest = np.maximum(longest, simulated_rounds(acceptance, k, int(tokens), samples, rng))
    return float(longest.mean())


def modelled_seconds(
    batches: list[list[tuple[list[float], int]]],
    k_max: int,
    draft_per_round: float,
    verify_per_round: float,
    other_per_round: float,
    first_round_extra: float,
    verify_shape: dict[int, float],
    samples: int = 256,
    seed: int = 0,
) -> dict[int, float]:
    """Seconds to decode a prompt set at every k = 1..k_max (its batches one after another), modelled from the
    run at k_max:
        T(k) = first_round_extra + Σ_batches E[rounds of the batch at k] · c(k)
        c(k) = draft_per_round · k / k_max + verify_per_round · t_verify(k+1) / t_verify(k_max+1) + other_per_round
    Every per-round figure is the k_max run's own (a batch round costs what the whole batch waited for: one
    draft forward per step and one verify forward for all its rows); `verify_shape` is the verify-cost profile at
    this batch size, of which only the shape in n is used (its level drifts with the machine's load between the
    profile and the run); E[rounds] comes from each row's per-position acceptance (expected_batch_rounds)."""
    seconds = {}
    for k in range(1, k_max + 1):
        if k + 1 not in verify_shape or k_max + 1 not in verify_shape:
            break
        cost = (
            draft_per_round * k / k_max
            + verify_per_round * verify_shape[k + 1] / verify_shape[k_max + 1]
            + other_per_round
        )
        seconds[k] = first_round_extra + sum(expected_batch_rounds(rows, k, samples, seed) for rows in batches) * cost
    return seconds


def anchored_curve(seconds: dict[int, float], k_max: int, measured_speedup: float) -> dict[int, float]:
    """The speedup of every k from modelled_seconds, anchored on the speedup measured at k_max against its
    interleaved baseline: S(k) = measured_speedup · T(k_max) / T(k). What the model leaves out at k_max (the
    prefill, the baseline's own cost, the machine's load at that moment) cancels; only how the cost changes
    with k is predicted."""
    return {k: measured_speedup * seconds[k_max] / t for k, t in seconds.items()}
