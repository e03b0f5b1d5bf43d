"""Validation: rerun an experiment's best configuration and its baseline on prompts the tuning never saw
(the article's last step), as a new experiment linked to the first, and say in words whether the gain holds.

It does not hold when α drops beyond sampling error (a one-sided two-proportion z-test over verified draft
tokens, z > 1.96) or when the validation speedup's 95 % interval lies wholly below the tune's.
"""
from __future__ import annotations

import math

import pandas as pd

from . import queries as q
from .store import Store

BUILTIN_SETS = ("code", "english", "chinese", "math", "mixed")
Z_CRITICAL = 1.96


class ValidationError(ValueError):
    """Cannot validate as asked: the message names the problem and the fix."""


def held_out_prompts(spec: str) -> str:
    """The validation split of a built-in tune set (`code`, `code:tune` -> `code:validation`), of each set of a
    union (`code+english` -> `code:validation+english:validation`)."""
    parts = spec.split("+")
    if len(parts) > 1 and all(part.strip().partition(":")[0] in BUILTIN_SETS for part in parts):
        return "+".join(held_out_prompts(part) for part in parts)
    name, _, split = spec.strip().partition(":")
    if name in BUILTIN_SETS:
        if split in ("", "tune"):
            return f"{name}:validation"
        raise ValidationError(f"the experiment already ran on {spec!r}, not a tune split; pass held-out prompts "
                              f"with --prompts (a built-in NAME:validation or a .jsonl/.csv/.txt file)")
    raise ValidationError(f"the experiment ran on the file {spec!r}, which has no built-in held-out split; pass "
                          f"the held-out prompts with --prompts FILE")


def _best_run(store: Store, experiment_id: int) -> pd.Series:
    verdict = q.verdict(store, experiment_id)
    if verdict["best"] is None:
        raise ValidationError(f"experiment {experiment_id} has no finished best configuration to validate "
                              f"({verdict['text']}); let it finish or resume it first")
    runs = q.runs(store, experiment_id)
    spec = runs[(runs["kind"] == "speculative") & (runs["status"] == "done") & runs["speedup"].notna()]
    return spec.loc[spec["speedup"].idxmax()] if not spec.empty else None


def validation_plan(store: Store, experiment_id: int, prompts: str | None = None) -> dict:
    """Keyword arguments for experiments.enqueue_experiment that rerun the best configuration on held-out prompts."""
    exp = q.experiment(store, experiment_id)
    if exp is None:
        raise ValidationError(f"no experiment {experiment_id} in {store.safe_url}; `draftlab list` shows the ids")
    if exp.get("validates"):
        raise ValidationError(f"experiment {experiment_id} is itself a validation (of experiment {exp['validates']}); "
                              f"validate the tuning experiment instead")
    best = _best_run(store, experiment_id)
    held_out = prompts or held_out_prompts(exp["prompts"])
    if held_out.strip() == exp["prompts"].strip():
        raise ValidationError(f"--prompts {held_out!r} is the set the experiment was tuned on; pass held-out prompts")
    k = int(best["k"])
    draft = best["draft"] if pd.notna(best.get("draft")) else exp["draft"]
    drafter = best["drafter"] if pd.notna(best.get("drafter")) else exp.get("drafter") or "model"
    return {
        "name": f"validate #{experiment_id}: k={k} {drafter} {draft} on {held_out}",
        "target": exp["target"], "draft": draft, "drafter": drafter, "prompts": held_out,
        # plain Python numbers: a numpy int64 would reach SQLite as a blob
        "sampling": {key: cast(best[key]) for key, cast in (("temperature", float), ("top_k", int), ("top_p", float),
                                                            ("seed", int), ("max_new_tokens", int))},
        "device": exp["device"], "dtype": exp["dtype"], "trust_remote_code": bool(exp["trust_remote_code"]),
        "sweep_variable": "k", "sweep_values": [k], "k": k, "repeats": int(exp.get("repeats") or 1),
        "validates": experiment_id, "tags": exp.get("tag_list") or [],
        "chat_template": exp.get("chat_template") or "auto",  # held-out conversations rendered as the tuned ones
    }


def _alpha_drop_z(tune: pd.Series, validation: pd.Series) -> float | None:
    n_t, n_v = tune["accepted"] + tune["rejected"], validation["accepted"] + validation["rejected"]
    if not n_t or not n_v:
        return None
    pooled = (tune["accepted"] + validation["accepted"]) / (n_t + n_v)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_t + 1 / n_v))
    return (tune["alpha"] - validation["alpha"]) / se if se > 0 else 0.0


def validation_result(store: Store, validation_id: int) -> dict:
    """{experiment_id, validates, configuration, tune, validation, holds (True/False/None), reason}."""
    exp = q.experiment(store, validation_id)
    if exp is None or not exp.get("validates"):
        raise ValidationError(f"experiment {validation_id} is not a validation experiment")
    tune = _best_run(store, int(exp["validates"]))
    runs = q.runs(store, validation_id)
    spec = runs[runs["kind"] == "speculative"]
    validation = spec.iloc[0]
    result = {"experiment_id": validation_id, "validates": int(exp["validates"]),
              "configuration": {"k": int(validation["k"]), "draft": exp["draft"], "drafter": exp.get("drafter"),
                                **exp["sampling"]},
              "tune": tune, "validation": validation, "holds": None, "reason": ""}
    if validation["status"] != "done" or pd.isna(validation["speedup"]) or pd.isna(validation["speedup_ci_lo"]):
        result["reason"] = f"the validation run is {validation['status']}; no verdict yet"
        return result
    z = _alpha_drop_z(tune, validation)
    alpha = f"α {tune['alpha']:.3f} on tune, {validation['alpha']:.3f} on held-out prompts"
    speed = (f"speedup {validation['speedup']:.2f}× ({validation['speedup_ci_lo']:.2f}–{validation['speedup_ci_hi']:.2f}) "
             f"against {tune['speedup']:.2f}× ({tune['speedup_ci_lo']:.2f}–{tune['speedup_ci_hi']:.2f}) on tune")
    if z is not None and z > Z_CRITICAL:
        result.update(holds=False, reason=f"does not hold: {alpha}, a drop beyond sampling error (z = {z:.1f}); {speed}")
    elif validation["speedup_ci_hi"] < tune["speedup_ci_lo"]:
        result.update(holds=False, reason=f"does not hold: the {speed}, its interval wholly below the tune's; {alpha}")
    else:
        result.update(holds=True, reason=f"holds: {alpha} (within sampling error); {speed}")
    return result
