"""A lab run's predicted server speedup at every k and concurrency of a server cost profile, with its bootstrap
interval and the k schedule per concurrency: the run JSON's `server_predicted` (issue 37, "Prediction for every lab
run").

It reads the run's per-prompt, per-position acceptance counts through storage.records.prompt_positions and predicts
with engine/metrics/server_prediction.py (its docstring holds the formula, the joint bootstrap over prompts and
profile passes, the assumptions and what a prediction cannot stand in for). The profile is passed in as
{concurrency: {k: [step seconds per pass]}}: its storage, with what it holds for (engine and version, hardware,
dtype, target, drafter), comes with `draftlab profile` (issue 37 item 1), and so does the choice of the profile that
fits a run.

The shape (JSON as it stands: keys are strings, no NaN):

    {"run_id": 7, "prompts": 4, "positions": 3,
     "acceptance": [α_1, ..., α_K],              # pooled conditional acceptance per position (null: none reached)
     "confidence": 0.95, "samples": 2000, "seed": 0,
     "concurrency": {"1": {"1": {"speedup": 1.4, "speedup_ci": [1.3, 1.5], "tokens_per_step": 1.8,
                                 "step_seconds_ratio": 1.2, "interpolated": false}, ...}, ...},
     "schedule": {"1": 2, "4": 0}}               # server_schedule: the k to serve, 0 where no interval lies above 1

The ks are 1 to the smallest of the run's largest drafted position and the largest k profiled at each concurrency,
less any k from the first position no round of the run reached though drafts before it were accepted (rounds cut
short: nothing to predict there). A run without draft tokens, or a profile that leaves no k, is refused in one line.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.errors import DraftLabError
from engine.metrics.server_prediction import (
    CostProfile,
    pooled_acceptance,
    predict_server_speedups,
    server_schedule,
    tokens_per_step,
)
from engine.metrics.stats import BOOTSTRAP_SAMPLES, CONFIDENCE
from storage.db.store import Store
from storage.records.prompt_positions import prompt_positions


def server_predicted(store: Store, run_id: int, profile: CostProfile, *, seed: int = 0) -> dict[str, Any]:
    """The run's `server_predicted` document (the module's docstring gives its shape) from its stored draft tokens
    and a server cost profile ({concurrency: {k: step seconds per pass}}, k 0 at every concurrency). Seeded: the
    same seed gives the same intervals. A DraftLabError, one line, for a run without draft tokens or a profile
    that leaves no k to predict (and whatever predict_server_speedups refuses in the profile)."""
    prompts, reached, accepted = prompt_positions(store, run_id)
    if not prompts:
        raise DraftLabError(
            f"run {run_id} stored no draft tokens (a target-only run, or none recorded yet): no acceptance to "
            f"predict a server speedup from"
        )
    K = reached.shape[1]
    alpha = pooled_acceptance(reached, accepted)
    length = tokens_per_step(np.asarray(alpha)[None, :])[0]
    profiled = min((max(by_k, default=0) for by_k in profile.values()), default=0)
    ks = [k for k in range(1, min(K, profiled) + 1) if np.isfinite(length[:k]).all()]
    if not ks:
        raise DraftLabError(
            f"cannot predict run {run_id}: the server cost profile measured no k from 1 to {K} at every "
            f"concurrency (largest k profiled at all of them: {profiled}), or no round reached position 1"
        )
    predictions = predict_server_speedups(reached, accepted, profile, ks=ks, seed=seed)
    by_concurrency: dict[str, dict[str, dict[str, Any]]] = {}
    for p in predictions:
        by_concurrency.setdefault(str(p.concurrency), {})[str(p.k)] = {
            "speedup": p.speedup,
            "speedup_ci": [p.lo, p.hi],
            "tokens_per_step": p.tokens_per_step,
            "step_seconds_ratio": p.step_seconds_ratio,
            "interpolated": p.interpolated,
        }
    return {
        "run_id": run_id,
        "prompts": len(prompts),
        "positions": K,
        "acceptance": [a if math.isfinite(a) else None for a in alpha],
        "confidence": CONFIDENCE,
        "samples": BOOTSTRAP_SAMPLES,
        "seed": seed,
        "concurrency": by_concurrency,
        "schedule": {str(c): k for c, k in server_schedule(predictions).items()},
    }
