"""Every lab run of an experiment predicted in the server at once: the run JSON's, the export's and the dashboard's
`server_predicted` (issue 37, "Prediction for every lab run").

Each speculative run gets exactly what storage/serving/profiles.run_prediction gives it (the newest profile that
fits, the prediction from the run's own acceptance, or {"profile": None, "reason": one line}), computed for the
whole experiment with what runs share read once:

- the fit (the target and the drafter's fingerprint a profile must hold for) comes from the run's deploy settings
  (profiles.run_fit: a deploy document per run, most of the time a prediction takes); runs whose configuration
  (storage/serving/deploy.configuration) differs only in k have the same settings but k, and a fingerprint never
  holds k, so the fit is read once per distinct configuration (a k sweep: once);
- the fitting profiles once per (target, fingerprint), each profile's step costs once per fingerprint.

The bootstrap over the run's prompts is the run's own: seeded as run_prediction's (seed 0), so both give the same
intervals.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.errors import DraftLabError
from storage.db.store import Store
from storage.records import queries as q
from storage.records.server_costs import fitting_profiles, profile_costs, short_fingerprint
from storage.serving.plain import plain

NOT_DRAFTER = ("run_id", "k")  # what a run's configuration holds that no fingerprint does


def experiment_predictions(store: Store, experiment_id: int, *, seed: int = 0) -> dict[int, dict[str, Any]]:
    """{run id: its `server_predicted` document} for every speculative run of the experiment, in queries.runs()
    order: run_prediction(store, experiment_id, run_id, seed=seed) for each, the shared reads done once."""
    from storage.analysis.server_predicted import server_predicted

    runs = q.runs(store, experiment_id)
    experiment = q.experiment(store, experiment_id) or {}
    fits: dict[str, tuple[int, tuple[str, str] | str]] = {}
    heads: dict[tuple[str, str], list[dict[str, Any]]] = {}
    costs: dict[tuple[int, str], dict[int, dict[int, list[float]]]] = {}
    out: dict[int, dict[str, Any]] = {}
    for _, row in runs[runs["kind"] == "speculative"].iterrows():
        run_id = int(row["run_id"])
        fit = _fit(store, experiment_id, row, experiment, fits)
        if isinstance(fit, str):
            out[run_id] = {"profile": None, "reason": fit}
            continue
        target, fingerprint = fit
        if (target, fingerprint) not in heads:
            heads[target, fingerprint] = fitting_profiles(store, target, fingerprint)
        reason = (
            f"no server cost profile fits run {run_id} (target {target}, drafter {short_fingerprint(fingerprint)}); "
            f"`draftlab profile {experiment_id} --run {run_id}` measures one"
        )
        found = None
        for head in heads[target, fingerprint]:
            key = (int(head["profile_id"]), fingerprint)
            if key not in costs:
                costs[key] = profile_costs(store, *key)
            if not costs[key]:
                reason = f"profile {head['profile_id']} measured no concurrency with the target alone and a k beside it"
                continue
            try:
                found = {"profile": head, **server_predicted(store, run_id, costs[key], seed=seed)}
                break
            except DraftLabError as exc:
                reason = str(exc)
        out[run_id] = found if found is not None else {"profile": None, "reason": reason}
    return out


def _fit(store: Store, experiment_id: int, row, experiment: dict, fits: dict) -> tuple[str, str] | str:
    """profiles.run_fit for this run, read once per distinct configuration but k (`fits`: {configuration: (the run
    it was read for, its fit)}); a run deploy refuses (a baseline, not finished, not lossless, no settings) says why
    as run_fit does, naming this run."""
    from storage.serving.engine_settings import DeployError, configuration, refusal
    from storage.serving.profiles import run_fit

    run_id = int(row["run_id"])
    why = refusal(row)
    if why is not None:
        return why
    stored = {key: value for key, value in q.run_row(store, run_id).items() if key != "id"}
    try:
        cfg = configuration(plain({**stored, **row.to_dict()}), experiment)
    except DeployError as exc:
        return str(exc)
    key = json.dumps({k: v for k, v in cfg.items() if k not in NOT_DRAFTER}, sort_keys=True, default=str)
    if key not in fits:
        fits[key] = (run_id, run_fit(store, experiment_id, run_id))
    read_for, fit = fits[key]
    if isinstance(fit, str) and read_for != run_id:  # why vLLM cannot serve the drafter, said of this run
        return re.sub(rf"\brun {read_for}\b", f"run {run_id}", fit)
    return fit


def server_answer(predictions: dict[int, dict[str, Any]], runs: list[int]) -> tuple[dict[str, Any] | None, str]:
    """(the prediction of the run to serve, why) from the server's side, among `runs` (the deployable ones) and
    their `predictions` (experiment_predictions'): the run whose best predicted speedup's interval lies above 1 at
    the smallest concurrency profiled, highest lower bound first (then the larger point estimate). None, with one
    line, when no profile fits any of them or no prediction gains (then the lab's verdict answers, and says why)."""
    best: tuple[float, float] | None = None
    chosen: dict[str, Any] | None = None
    reasons: list[str] = []
    for run_id in runs:
        predicted = predictions.get(run_id)
        if predicted is None:
            continue
        if predicted.get("profile") is None:
            reasons.append(predicted["reason"])
            continue
        smallest = min(predicted["concurrency"], key=int)
        score = max((cell["speedup_ci"][0], cell["speedup"]) for cell in predicted["concurrency"][smallest].values())
        if score[0] > 1 and (best is None or score > best):
            best, chosen = score, predicted
        else:
            reasons.append(
                f"run {run_id}: no k's predicted server speedup lies surely above 1 at concurrency {smallest} "
                f"({predicted['profile']['label']})"
            )
    if chosen is not None:
        return chosen, ""
    return None, "; ".join(dict.fromkeys(reasons))[:600] or "no deployable run"


def server_choice(store: Store, experiment_id: int) -> tuple[dict[str, Any] | None, str]:
    """server_answer over the experiment's deployable runs (storage/serving/engine_settings.deployable_runs):
    what storage/serving/deploy.py serves first."""
    from storage.serving.engine_settings import deployable_runs

    runs = deployable_runs(store, experiment_id)
    return server_answer(experiment_predictions(store, experiment_id) if runs else {}, runs)


def server_verdict(store: Store, experiment_id: int) -> dict[str, Any]:
    """The server's answer as storage/analysis/findings/server_answer.py's `server` rule reads it: {"fitted":
    whether a profile fits any deployable run, "chosen": server_answer's prediction or None, "reason", "said": its k
    per concurrency in words (engine_settings.schedule_text) or None}."""
    from storage.serving.engine_settings import deployable_runs, schedule_text

    runs = deployable_runs(store, experiment_id)
    predictions = experiment_predictions(store, experiment_id) if runs else {}
    chosen, reason = server_answer(predictions, runs)
    return {
        "fitted": any(predictions.get(r, {}).get("profile") for r in runs),
        "chosen": chosen,
        "reason": reason,
        "said": schedule_text(chosen) if chosen is not None else None,
    }
