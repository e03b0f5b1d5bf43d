"""Validation: rerun an experiment's chosen configuration (the verdict's, storage/analysis/verdict.py: the best, or the
cheaper one tied with it, what deploy carries) and its baseline on prompts the tuning never saw (the article's last
step), as a new experiment linked to the first, and say in words whether the gain holds.

It does not hold when
  - α drops beyond sampling error: a one-sided test at 5 % (z > Z_ONE_SIDED) of the tuning α against the held-out α,
    each with a prompt-level standard error (prompts are the sampled units: engine/metrics/stats.py's
    clustered_ratio_se, the one production comparisons use too), or
  - the held-out speedup's 95 % interval lies wholly below the tuning run's.
A rise of α is reported as a rise (the test looks for a drop only). Sets are named by their names
(engine/text/prompt_sets.py's set_name: `code:validation`, an uploaded file's own name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import pandas as pd

from engine.config.run_config import RUN_PARAMETERS, RunConfig
from engine.metrics.stats import clustered_ratio_se
from engine.text.prompt_sets import BUILTIN_SETS, set_name
from storage.analysis.verdict import verdict
from storage.db.store import Store
from storage.records import queries as q

CONFIDENCE = 0.95  # of the one-sided test for a drop of α
Z_ONE_SIDED = NormalDist().inv_cdf(CONFIDENCE)  # 1.645


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
        raise ValidationError(
            f"the experiment already ran on {spec!r}, not a tune split; pass held-out prompts "
            f"with --prompts (a built-in NAME:validation or a .jsonl/.csv/.txt file)"
        )
    raise ValidationError(
        f"the experiment ran on the file {set_name(spec)!r}, which has no built-in held-out split; "
        f"pass the held-out prompts with --prompts FILE"
    )


def _chosen_run(store: Store, experiment_id: int) -> pd.Series:
    """The run the verdict chose to deploy (never a run it refuses, such as a timing-warned one); when the verdict
    serves the target alone (nothing measurably faster), its best run, so that validation checks on held-out prompts
    that speculation does not pay there either."""
    v = verdict(store, experiment_id)
    runs = q.runs(store, experiment_id)
    row = v.run(runs, "chosen")
    if row is None and v.best is not None:
        row = v.run(runs, "best")
    if row is None:
        raise ValidationError(
            f"experiment {experiment_id} has no finished best configuration to validate "
            f"({v.text}); let it finish or resume it first"
        )
    return row


def validation_plan(store: Store, experiment_id: int, prompts: str | None = None) -> dict[str, Any]:
    """Keyword arguments for experiments.enqueue_experiment that rerun the chosen configuration on held-out prompts."""
    exp = q.experiment(store, experiment_id)
    if exp is None:
        raise ValidationError(f"no experiment {experiment_id} in {store.safe_url}; `draftlab list` shows the ids")
    if exp.get("validates"):
        raise ValidationError(
            f"experiment {experiment_id} is itself a validation (of experiment {exp['validates']}); "
            f"validate the tuning experiment instead"
        )
    best = _chosen_run(store, experiment_id)
    held_out = prompts or held_out_prompts(exp["prompts"])
    if held_out.strip() == exp["prompts"].strip():
        raise ValidationError(
            f"--prompts {set_name(held_out)!r} is the set the experiment was tuned on; pass held-out prompts"
        )
    # The chosen run's own configuration (engine/config/run_config.py: every parameter, the run's value else the
    # experiment's), rerun alone at the batch size it was measured at (a grid's: its smallest, whose verdict this
    # is), drafting as it did, on the held-out prompts.
    config = replace(RunConfig.of_run(best.to_dict(), exp), prompts=held_out)
    k, drafter, draft = config.value("k"), config.value("drafter"), config.value("draft")
    return {
        **config.enqueue(),
        "name": f"validate #{experiment_id}: k={k} {drafter} {draft} on {set_name(held_out)}",
        "validates": experiment_id,
        "tags": exp.get("tag_list") or [],
    }


# --- α with a prompt-level standard error ----------------------------------------------------------------------


@dataclass(frozen=True)
class AlphaEstimate:
    """A run's α = Σ accepted / Σ verified over its prompts, and the standard error of that ratio with the prompt
    as the sampled unit (tokens of one prompt are not independent draws: they share its text and its drafts)."""

    alpha: float
    se: float | None  # None under two prompts
    prompts: int
    verified: int


def alpha_estimate(store: Store, run_id: int) -> AlphaEstimate | None:
    """The run's α and its prompt-level standard error (engine/metrics/stats.py's clustered_ratio_se over the run's
    per-prompt rollups); None without verified draft tokens."""
    rows = q.prompt_verified(store, run_id)
    estimate = clustered_ratio_se([accepted for accepted, _ in rows], [verified for _, verified in rows])
    if estimate is None:
        return None
    alpha, se, prompts = estimate
    return AlphaEstimate(alpha, se, prompts, int(sum(verified for _, verified in rows)))


def alpha_drop_z(tune: AlphaEstimate, held_out: AlphaEstimate) -> float | None:
    """(α tune − α held out) / √(se_tune² + se_held_out²): positive for a drop; None without both standard errors.
    An infinite z: both standard errors are 0 and α differs."""
    if tune.se is None or held_out.se is None:
        return None
    se = math.hypot(tune.se, held_out.se)
    diff = tune.alpha - held_out.alpha
    return diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))


def _tuning_run(store: Store, tuned_id: int, validation: pd.Series) -> pd.Series:
    """The tuning experiment's run the validation reran: the verdict's chosen one, or (a verdict that has moved
    since) the finished run with the validation's configuration."""
    runs = q.runs(store, tuned_id)
    v = verdict(store, tuned_id)
    chosen = v.run(runs, "chosen")
    if chosen is None:  # the target alone is served: validation reran the best run (_chosen_run)
        chosen = v.run(runs, "best")
    if chosen is not None and _same_configuration(chosen, validation):
        return chosen
    spec = runs[(runs["kind"] == "speculative") & (runs["status"] == "done")]
    same = [row for _, row in spec.iterrows() if _same_configuration(row, validation)]
    if same:
        return same[0]
    if chosen is None:
        raise ValidationError(f"experiment {tuned_id} has no finished run to compare the validation with")
    return chosen


def _same_configuration(a: pd.Series, b: pd.Series) -> bool:
    """Whether two runs decoded alike: every parameter a run stores (engine/config/run_config.py's RUN_PARAMETERS)."""

    def norm(value: Any) -> Any:
        return None if value is None or (not isinstance(value, str) and pd.isna(value)) else value

    return all(norm(a.get(key)) == norm(b.get(key)) for key in RUN_PARAMETERS)


def validation_result(store: Store, validation_id: int) -> dict[str, Any]:
    """{experiment_id, validates, configuration, tune, validation (runs rows), tune_set, validation_set (names),
    alpha {tune, tune_se, validation, validation_se, z, critical, test}, holds (True/False/None), reason}."""
    exp = q.experiment(store, validation_id)
    if exp is None or not exp.get("validates"):
        raise ValidationError(f"experiment {validation_id} is not a validation experiment")
    tuned_id = int(exp["validates"])
    tuned = q.experiment(store, tuned_id) or {}
    runs = q.runs(store, validation_id)
    validation = runs[runs["kind"] == "speculative"].iloc[0]
    tune = _tuning_run(store, tuned_id, validation)
    tune_set, held_set = set_name(tuned.get("prompts")), set_name(exp.get("prompts"))
    result = {
        "experiment_id": validation_id,
        "validates": tuned_id,
        "configuration": {
            "k": int(validation["k"]),
            "draft": exp["draft"],
            "drafter": exp.get("drafter"),
            **exp["sampling"],
        },
        "tune": tune,
        "validation": validation,
        "tune_set": tune_set,
        "validation_set": held_set,
        "alpha": None,
        "holds": None,
        "reason": "",
    }
    if validation["status"] != "done" or pd.isna(validation["speedup"]) or pd.isna(validation["speedup_ci_lo"]):
        result["reason"] = f"the validation run is {validation['status']}; no verdict yet"
        return result
    a_tune, a_held = alpha_estimate(store, int(tune["run_id"])), alpha_estimate(store, int(validation["run_id"]))
    z = alpha_drop_z(a_tune, a_held) if a_tune and a_held else None
    if a_tune and a_held:
        result["alpha"] = {
            "tune": a_tune.alpha,
            "tune_se": a_tune.se,
            "validation": a_held.alpha,
            "validation_se": a_held.se,
            "z": z,
            "critical": Z_ONE_SIDED,
            "test": f"one-sided drop at {100 * (1 - CONFIDENCE):.0f} %, prompt-level standard errors",
        }
    alpha, dropped = _alpha_words(a_tune, a_held, z, tune_set, held_set)
    speed = (
        f"speedup {validation['speedup']:.2f}× ({validation['speedup_ci_lo']:.2f}–"
        f"{validation['speedup_ci_hi']:.2f}) on {held_set} against {tune['speedup']:.2f}× "
        f"({tune['speedup_ci_lo']:.2f}–{tune['speedup_ci_hi']:.2f}) on {tune_set}"
    )
    if dropped:
        result.update(holds=False, reason=f"does not hold: {alpha}; {speed}")
    elif validation["speedup_ci_hi"] < tune["speedup_ci_lo"]:
        result.update(
            holds=False, reason=f"does not hold: the {speed}, its interval wholly below the tuning run's; {alpha}"
        )
    else:
        result.update(holds=True, reason=f"holds: {alpha}; {speed}")
    return result


def _alpha_words(
    tune: AlphaEstimate | None, held: AlphaEstimate | None, z: float | None, tune_set: str, held_set: str
) -> tuple[str, bool]:
    """(what the α comparison found, in words; whether α dropped beyond sampling error)."""
    if tune is None or held is None:
        return "α not measured (no verified draft tokens)", False
    change = held.alpha - tune.alpha
    moved = f"from {tune.alpha:.3f} on {tune_set} to {held.alpha:.3f} on {held_set} ({change:+.3f})"
    test = f"one-sided test at {100 * (1 - CONFIDENCE):.0f} %, prompt-level standard errors"
    if change > 0:
        return f"α rose {moved}", False
    if change == 0:
        return f"α {tune.alpha:.3f} on both {tune_set} and {held_set}", False
    if z is None:
        return f"α fell {moved}; too few prompts (under 2 in a run) to tell a drop from sampling error", False
    if z > Z_ONE_SIDED:
        return f"α fell {moved}, a drop beyond sampling error (z = {z:.1f} > {Z_ONE_SIDED:.2f}, {test})", True
    return f"α fell {moved}, within sampling error (z = {z:.1f} ≤ {Z_ONE_SIDED:.2f}, {test})", False
