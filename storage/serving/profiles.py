"""Server cost profiles: a serving engine's step cost per k and concurrency, measured once, and the lab runs it fits
(issue 37, "A server cost profile").

A profile is a stored confirm (storage/records/confirms.py): `draftlab profile` (configs = "profile") serves one
drafter at several k beside the target alone, and every `draftlab confirm` is one too, over the ks it served. Each
of its passes holds its decode figures (storage/db/schema.py's server_passes: the seconds and the engine steps after
each request's first token), so the step cost at k and concurrency c is

    t_k(c) = decode_seconds / decode_steps        (one value per pass; k = 0: the target-only server's)

What a profile holds for: the engine and its version, the hardware the servers ran on, the target served (the
confirm's row) and the drafter's fingerprint (each measurement's): its method and settings, a draft model or head by
its shape (model type, widths, layers, vocabulary: what its cost depends on), never its weights or its k. A run fits
a profile when its target and its drafter's fingerprint are the profile's: a distilled draft of the same shape fits
the profile of the draft it was distilled from, any prompt set, any k up to the largest profiled, any batch size.
engine/metrics/server_prediction.py predicts from the run's acceptance and the profile's step costs
(storage/analysis/server_predicted.py).
"""

from __future__ import annotations

from typing import Any

from engine.errors import DraftLabError
from storage.db.store import Store
from storage.records.server_costs import (
    drafter_fingerprint,
    fitting_profiles,
    profile_costs,
    profile_summary,
    short_fingerprint,
)


def run_fit(store: Store, experiment_id: int, run_id: int) -> tuple[str, str] | str:
    """(target, drafter fingerprint) a profile must hold for `run_id` (its deploy document's vLLM settings), or why
    no profile can fit it, one line (vLLM cannot serve its drafter, deploy refuses the run)."""
    from storage.records.queries import run_row
    from storage.serving.engine_settings import DeployError, run_vllm_settings
    from storage.serving.tree_settings import confirm_refusal

    try:
        target, vllm = run_vllm_settings(store, experiment_id, run_id)
    except DeployError as exc:
        return str(exc)
    if tree := confirm_refusal({"configuration": run_row(store, run_id), "run_id": run_id}, "predict"):
        return tree  # vLLM serves chains: a profile would predict the chain's cost for the tree's acceptance
    if not vllm.get("speculative_config"):
        return f"vLLM cannot serve run {run_id}'s drafter ({vllm['notes'][0]})"
    return target, drafter_fingerprint(vllm["speculative_config"])


def run_prediction(
    store: Store, experiment_id: int, run_id: int, profile_id: int | None = None, *, seed: int = 0
) -> dict[str, Any]:
    """The run's `server_predicted` document (storage/analysis/server_predicted.py) from the newest profile that fits
    it, or from `profile_id`, with the profile's head under "profile". Without a fitting profile:
    {"profile": None, "reason": one line} (the lab's figures stand, and say so). A `profile_id` that does not fit
    the run, or does not exist, raises DraftLabError (one line)."""
    from storage.analysis.server_predicted import server_predicted

    fit = run_fit(store, experiment_id, run_id)
    if isinstance(fit, str):
        if profile_id is not None:
            raise DraftLabError(f"profile {profile_id} cannot fit run {run_id}: {fit}")
        return {"profile": None, "reason": fit}
    target, fingerprint = fit
    heads = fitting_profiles(store, target, fingerprint)
    if profile_id is not None:
        chosen = [h for h in heads if h["profile_id"] == profile_id]
        if not chosen:
            raise DraftLabError(
                f"profile {profile_id} does not fit run {run_id}: it holds no step costs for target {target} with "
                f"this drafter ({short_fingerprint(fingerprint)}); `draftlab profile {experiment_id} --run {run_id}` "
                f"measures one"
            )
        heads = chosen
    reason = (
        f"no server cost profile fits run {run_id} (target {target}, drafter {short_fingerprint(fingerprint)}); "
        f"`draftlab profile {experiment_id} --run {run_id}` measures one"
    )
    for head in heads:
        costs = profile_costs(store, head["profile_id"], fingerprint)
        if not costs:
            reason = f"profile {head['profile_id']} measured no concurrency with the target alone and a k beside it"
            continue
        try:
            return {"profile": head, **server_predicted(store, run_id, costs, seed=seed)}
        except DraftLabError as exc:
            reason = str(exc)
    if profile_id is not None:
        raise DraftLabError(reason)
    return {"profile": None, "reason": reason}


def profile_table(store: Store, profile_id: int, fingerprint: str) -> list[dict[str, Any]]:
    """The profile's costs per concurrency and k (storage/records/server_costs.profile_summary's rows), each k ≥ 1
    with its step cost over the target's, t_k / t_0, and that ratio's bootstrap interval over the passes
    (`cost_ratio`, `cost_ratio_ci`; None for k = 0 and where the target alone was not measured)."""
    from engine.metrics.server_prediction import cost_ratios

    ratios = cost_ratios(profile_costs(store, profile_id, fingerprint))
    rows = profile_summary(store, profile_id, fingerprint)
    for row in rows:
        found = ratios.get(row["concurrency"], {}).get(row["k"])
        row["cost_ratio"] = found[0] if found else None
        row["cost_ratio_ci"] = [found[1], found[2]] if found else None
    return rows
