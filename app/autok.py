"""`--k auto` ("predict, then confirm"): after the run at the largest k, predict the whole speedup-vs-k curve
from that run alone (its per-prompt, per-position acceptance, its own batch-round costs, the speedup it measured
against its interleaved baseline) and the shape of the target's verify-cost profile, then queue a new timed pass
(fresh baseline) for the best predicted k values only. engine/metrics/theory.py's modelled_seconds / anchored_curve hold
the model; docs/metrics.md states it."""

from __future__ import annotations

import math

import pandas as pd

from engine.metrics.theory import anchored_curve, modelled_seconds
from storage import Store
from storage.jobs.experiments import add_k_runs, load_verify_profiles, set_predicted_curve
from storage.records import queries as q

CONFIRM = 3  # how many of the best predicted k values are measured
# A prompt's acceptance at a position is its own accepted / reached drafts pulled toward the run's pooled rate by
# this many pseudo-drafts: a prompt reaches its deep positions only a few times.
SHRINK = 4.0


def batch_size_of(run) -> int:
    """A run's batch size (rows stored before batch sizes existed: 1)."""
    size = run.get("batch_size")
    return int(size) if size is not None and not pd.isna(size) else 1


def row_acceptance(store: Store, run_id: int, k_max: int) -> dict[int, tuple[list[float], int]]:
    """Each prompt's (per-position acceptance 1..k_max, new tokens) in a run."""
    pooled = [
        0.0 if v is None or math.isnan(v) else float(v) for v in q.acceptance_by_position(store, run_id)["conditional"]
    ]
    pooled += [0.0] * (k_max - len(pooled))
    by_prompt = q.acceptance_by_prompt_position(store, run_id)
    rows = {}
    for index, tokens in q.prompt_tokens(store, run_id).items():
        own = by_prompt[by_prompt["prompt_index"] == index].set_index("position") if len(by_prompt) else pd.DataFrame()
        acceptance = []
        for position in range(1, k_max + 1):
            reached = float(own.at[position, "reached"]) if position in own.index else 0.0
            accepted = float(own.at[position, "accepted"]) if position in own.index else 0.0
            acceptance.append((accepted + SHRINK * pooled[position - 1]) / (reached + SHRINK))
        rows[index] = (acceptance, tokens)
    return rows


def cost_model(store: Store, probe) -> dict | None:
    """The k_max run's inputs to engine.metrics.theory.modelled_seconds (None when it has no rounds): its prompts
    grouped into its batches, and its per-batch-round draft, verify (past the first round) and other seconds, and what
    its first rounds' verify (the prefill) cost beyond a steady round's."""
    run_id, batch = int(probe["run_id"]), batch_size_of(probe)
    costs = q.batch_round_costs(store, run_id)
    rounds, batches = costs["rounds"], costs["batches"]
    if rounds <= 0 or batches <= 0:
        return None
    rows = row_acceptance(store, run_id, int(probe["k"]))
    grouped: dict[int, list] = {}
    for index in sorted(rows):
        grouped.setdefault(index // batch, []).append(rows[index])
    steady = rounds - batches
    verify = (
        (costs["verify_seconds"] - costs["first_verify_seconds"]) / steady
        if steady > 0
        else costs["verify_seconds"] / rounds
    )
    return {
        "batches": list(grouped.values()),
        "draft_per_round": costs["draft_seconds"] / rounds,
        "verify_per_round": verify,
        "first_round_extra": costs["first_verify_seconds"] - batches * verify,
        "other_per_round": (costs["wall_seconds"] - costs["draft_seconds"] - costs["verify_seconds"]) / rounds,
    }


def predict_curve(store: Store, probe, profile: dict[int, float]) -> dict[int, float] | None:
    """The predicted speedup of every k = 1..k_max from the run at k_max (`probe`, a row of
    storage.records.queries.runs, finished with its speedup) and the verify-cost profile at its batch size; None without
    what it needs."""
    model = cost_model(store, probe)
    speedup = probe.get("speedup")
    if model is None or speedup is None or pd.isna(speedup) or not profile:
        return None
    k_max = int(probe["k"])
    return anchored_curve(modelled_seconds(k_max=k_max, verify_shape=profile, **model), k_max, float(speedup))


def plan_confirmation(store: Store, experiment_id: int, confirm: int = CONFIRM) -> list[int] | None:
    """Make and store the predicted curve at each batch size of the experiment (one, or a grid's), and queue, per
    batch size, the runs that confirm it (a fresh baseline at that batch size and its best predicted k values);
    return the k values queued (at every batch size; None until every batch size's run at the largest k has
    finished with its baseline, or when the curves exist already). A batch size whose run at the largest k
    failed gets no curve."""
    experiment = q.experiment(store, experiment_id)
    if experiment is None or not experiment["k_auto"] or experiment["predicted_curve"] is not None:
        return None
    k_max = int(experiment["k_auto"])
    runs = q.runs(store, experiment_id)
    probes = runs[(runs["kind"] == "speculative") & (runs["k"] == k_max)]
    waiting = runs[runs["run_id"].isin(probes["baseline_run_id"]) | runs["run_id"].isin(probes["run_id"])]
    if probes.empty or waiting["status"].isin(["queued", "running"]).any():
        return None
    profiles = load_verify_profiles(store, experiment_id)
    curves: dict[int, tuple[dict, list[int]]] = {}
    for _, probe in probes.sort_values("batch_size").iterrows():
        size = batch_size_of(probe)
        baseline = runs[runs["run_id"] == probe["baseline_run_id"]]
        if probe["status"] != "done" or baseline.empty or baseline.iloc[0]["status"] != "done":
            continue
        if not probe["rounds"] or not profiles.get(size):
            continue
        curve = predict_curve(store, probe, profiles[size])
        if not curve:
            continue
        predicted: dict[int, float] = curve
        best = sorted(predicted, key=lambda k: -predicted[k])[:confirm]
        curves[size] = (curve, sorted(k for k in best if k != k_max))
    if not curves:
        return None
    queued = []
    for size, (_curve, to_measure) in curves.items():
        if to_measure:
            add_k_runs(store, experiment_id, to_measure, batch_size=size)
            queued += to_measure
    first = curves[min(curves)]
    batched = q.grid_sizes(experiment) is not None or any(size > 1 for size in curves)
    set_predicted_curve(store, experiment_id, first[0], first[1], curves if batched else None)
    return queued
