"""Monte Carlo rounds of speculative decoding on random distributions, in numpy (the reference article's demo).

A target and a draft distribution over a small vocabulary are drawn from Dirichlet priors; every draft position
proposes from the same pair, so the per-token acceptance probability is exactly β = Σ_x min(p_d(x), p_t(x)) and
the simulated α̂ should match the formulas of SPEC.md (engine/metrics/theory.py) up to sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from engine.metrics import theory


@dataclass
class SimulationSetup:
    vocab: int = 20
    target_concentration: float = 0.5  # Dirichlet concentration: small = peaked distribution
    draft_concentration: float = 0.15
    c: float = 10.0
    rounds: int = 2000
    seed: int = 42


def random_distribution(rng: np.random.Generator, vocab: int, concentration: float) -> np.ndarray:
    return rng.dirichlet([concentration] * vocab)


def overlap(draft: np.ndarray, target: np.ndarray) -> float:
    """β = Σ_x min(p_d(x), p_t(x)): the probability a draft token is accepted under lossless sampling."""
    return float(np.minimum(draft, target).sum())


def simulate_rounds(
    draft: np.ndarray, target: np.ndarray, k: int, rounds: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Accepted drafts a_r per round and the token each round emits at its first position.

    Draft token i is accepted with probability min(1, p_t/p_d) while all before it were accepted; at a rejection
    the correction comes from normalize(max(0, p_t − p_d)). The first emitted token of each round is distributed
    exactly as the target (the lossless property), which callers can check.
    """
    vocab = len(draft)
    proposals = rng.choice(vocab, size=(rounds, k), p=draft)
    accept = rng.random((rounds, k)) < np.minimum(1.0, target[proposals] / draft[proposals])
    accepted = np.cumprod(accept, axis=1).sum(axis=1)
    residual = np.maximum(0.0, target - draft)
    corrections = rng.choice(vocab, size=rounds, p=residual / residual.sum()) if residual.sum() > 0 else proposals[:, 0]
    first_emitted = np.where(accept[:, 0], proposals[:, 0], corrections)
    return accepted, first_emitted


def simulate(setup: SimulationSetup, ks: list[int]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One row per k: simulated counts and metrics next to the formula's prediction from β.

    Speedup uses SPEC's cost model: a round costs one target step plus k draft steps of 1/c each.
    """
    rng = np.random.default_rng(setup.seed)
    target = random_distribution(rng, setup.vocab, setup.target_concentration)
    draft = random_distribution(rng, setup.vocab, setup.draft_concentration)
    beta = overlap(draft, target)
    rows, first_tokens = [], []
    for k in ks:
        accepted, first_emitted = simulate_rounds(draft, target, k, setup.rounds, rng)
        first_tokens.append(first_emitted)
        n_accepted, n_rejected = int(accepted.sum()), int((accepted < k).sum())
        alpha = n_accepted / (n_accepted + n_rejected) if n_accepted + n_rejected else 1.0
        tokens_per_round = float(accepted.mean() + 1)
        rows.append(
            {
                "k": k,
                "rounds": setup.rounds,
                "proposed": k * setup.rounds,
                "accepted": n_accepted,
                "rejected": n_rejected,
                "alpha": alpha,
                "tokens_per_round": tokens_per_round,
                "speedup": tokens_per_round / (1 + k / setup.c),
                "expected_tokens_per_round": theory.expected_tokens_per_round(beta, k),
                "predicted_speedup": theory.predicted_speedup(beta, k, setup.c),
            }
        )
    emitted = np.concatenate(first_tokens) if first_tokens else np.array([], dtype=int)
    empirical = np.bincount(emitted, minlength=setup.vocab) / max(len(emitted), 1)
    summary = {
        "beta": beta,
        "target": target,
        "draft": draft,
        "first_token_total_variation": float(0.5 * np.abs(empirical - target).sum()),
    }
    return pd.DataFrame(rows), summary
