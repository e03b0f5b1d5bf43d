"""`--k auto` ("predict, then confirm"): after the run at the largest k, predict the whole speedup-vs-k curve
from its per-position acceptance, its draft step time and the target's verify-cost profile, then queue a new
timed pass (fresh baseline) for the best predicted k values only."""
from __future__ import annotations

import math

from engine.theory import predicted_curve
from storage import Store
from storage.experiments import add_k_runs, load_verify_profile, set_predicted_curve
from storage import queries as q

CONFIRM = 3  # how many of the best predicted k values are measured


def plan_confirmation(store: Store, experiment_id: int, confirm: int = CONFIRM) -> list[int] | None:
    """Make and store the predicted curve, queue the runs that confirm it; return the k values queued
    (None when the largest-k run or its baseline did not finish, or the curve exists already)."""
    experiment = q.experiment(store, experiment_id)
    if experiment is None or not experiment["k_auto"] or experiment["predicted_curve"] is not None:
        return None
    k_max = int(experiment["k_auto"])
    runs = q.runs(store, experiment_id)
    probe = runs[(runs["kind"] == "speculative") & (runs["k"] == k_max) & (runs["status"] == "done")]
    if probe.empty:
        return None
    probe = probe.iloc[0]
    baseline = runs[runs["run_id"] == probe["baseline_run_id"]]
    profile = load_verify_profile(store, experiment_id)
    if baseline.empty or baseline.iloc[0]["status"] != "done" or not profile or not probe["rounds"]:
        return None
    costs = q.round_costs(store, int(probe["run_id"]))
    per_position = [0.0 if v is None or math.isnan(v) else float(v)
                    for v in q.acceptance_by_position(store, int(probe["run_id"]))["conditional"]]
    # Everything a round costs besides its draft steps and the bare verify forward (sampling, acceptance, the
    # host transfer, the prompt's prefill shared out over its rounds) is taken as a constant per round.
    overhead = (costs["wall_seconds"] - costs["draft_seconds"]) / costs["rounds"] - profile[k_max + 1]
    base = baseline.iloc[0]
    curve = predicted_curve(per_position, float(probe["draft_step_seconds"]), overhead, profile,
                            float(base["wall_seconds"]) / float(base["new_tokens"]))
    best = sorted(curve, key=lambda k: -curve[k])[:confirm]
    to_measure = sorted(k for k in best if k != k_max)
    if to_measure:
        add_k_runs(store, experiment_id, to_measure)
    set_predicted_curve(store, experiment_id, curve, to_measure)
    return to_measure
