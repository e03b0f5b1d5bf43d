"""The `prediction` and `formula` rules: in a k sweep, does a prediction pick the measured best k.

Both fire only for a k sweep with two or more finished k. `prediction`: the cost-aware prediction's best k against
the verdict's (agreement where the same k or one tied with it; k auto can then stand in for a sweep). `formula`: the
article's formula from α and c alone, said only where its best k differs from the measured one or it is off by
FORMULA_OFF or more, with the measured verify cost as the reason."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from storage.analysis import formula
from storage.analysis.findings.base import FORMULA_OFF, _Context, _finding, _ks, _x


def _k_runs(ctx: _Context) -> pd.DataFrame:
    """Finished, usable runs of a k sweep (at least two, else nothing to choose between)."""
    if ctx.variable != "k" or ctx.verdict.best is None:
        return ctx.done.iloc[:0]
    done = ctx.done[ctx.done["k"].notna()]
    return done if done["k"].nunique() >= 2 else done.iloc[:0]


def _prediction(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (k sweeps with two or more finished k): the k with the highest predicted_speedup_refined against the
    measured best k (the verdict's); the same k, or one tied with it, is agreement."""
    done = _k_runs(ctx)
    done = done[done["predicted_speedup_refined"].notna()]
    if done["k"].nunique() < 2:
        return []
    measured = ctx.verdict.run(done)
    top_k = formula.cost_aware_top(done)  # storage/analysis/formula.py: the one cost-aware best k (the Theory page's)
    if ctx.verdict.best is None or measured is None or top_k is None:  # the best has no cost-aware prediction
        return []
    best = int(ctx.verdict.best.value)  # type: ignore[arg-type]  # a k sweep: the value is a k
    k_ref = top_k[0]
    top = done[done["k"] == k_ref].sort_values("predicted_speedup_refined", ascending=False).iloc[0]
    data = {
        "measured_best": best,
        "refined_best": k_ref,
        "measured_speedup": float(measured.speedup),
        "refined_at_best": float(measured.predicted_speedup_refined),
    }
    if k_ref == best or k_ref in [c.value for c in ctx.verdict.tied]:
        tie = "" if k_ref == best else f" (k = {k_ref}, tied with the measured best k = {best})"
        title = f"The cost-aware prediction agrees: k = {best}"
        detail = (
            f"The cost-aware prediction picks the measured best{tie}: it puts k = {best} at "
            f"{_x(measured.predicted_speedup_refined)} where {_x(measured.speedup)} was measured."
        )
        k_max = int(done["k"].max())
        next_ = (
            f"On this pair, k auto (measure k = {k_max}, predict every smaller k, confirm the 3 best) can stand "
            f"in for a full sweep."
        )
        prefill = ctx.prefill(title, sweep="auto", values=None, k=None, k_auto=max(k_max, 2))
    else:
        title = f"The cost-aware prediction picks k = {k_ref}, the measurement k = {best}"
        detail = (
            f"The cost-aware prediction puts k = {k_ref} at {_x(top.predicted_speedup_refined)} and k = {best} "
            f"at {_x(measured.predicted_speedup_refined)}, but k = {k_ref} measured {_x(top.speedup)} and "
            f"k = {best} {_x(measured.speedup)}."
        )
        repeats = ctx.more_repeats()
        next_ = (
            f"The gap is timing noise or per-round overhead: measure k = {_ks([k_ref, best], ', ')} again "
            f"with more --repeats ({repeats})."
        )
        prefill = ctx.prefill(title, sweep="k", values=_ks([k_ref, best]), k=None, k_auto=None, repeats=repeats)
    return [_finding("prediction", "info", title, detail, "predictions", next_, prefill, data)]


def _formula(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (k sweeps with two or more finished k): the article's formula (storage/analysis/formula.py: α and c pooled
    over the finished constant-k runs, a grid's at its judged batch size only) picks its best k and predicts the
    measured best k's speedup from the same curve. Said when its best k differs from the measured one or it is off by
    FORMULA_OFF or more; the mean verify_cost says why (the formula assumes a verify pass costs 1 target step)."""
    done = _k_runs(ctx)
    if done.empty:
        return []
    # a grid: the judged (smallest) batch size's runs only, as the verdict judges (α and c differ per batch size)
    at = min(ctx.grid.steps, key=lambda s: s.batch_size).batch_size if ctx.grid is not None and ctx.grid.steps else None
    pooled = formula.pooled_inputs(ctx.store, ctx.experiment_id, at)
    if pooled is None:
        return []
    measured = ctx.verdict.run(done)
    if ctx.verdict.best is None or measured is None:
        return []
    best = int(ctx.verdict.best.value)  # type: ignore[arg-type]  # a k sweep: the value is a k
    alpha, c = pooled.alpha, pooled.c
    k_f, s_f = pooled.best_k()
    at_best = pooled.speedup(best)
    error = float(at_best / measured.speedup - 1)
    if k_f == best and abs(error) < FORMULA_OFF:
        return []
    verify = float(done["verify_cost"].mean()) if done["verify_cost"].notna().any() else math.nan
    if verify > 1.05:
        why = f"a verify pass costs {verify:.2f} target steps here, not the formula's 1"
    elif not math.isnan(verify):
        why = f"the verify pass costs {verify:.2f} target steps, so the gap is overhead outside draft and verify steps"
    else:
        why = "the verify cost was not measured"
    title = (
        f"Predicted from α and c alone, (1 − α^(k+1)) / ((1 − α)(1 + k/c)) picks k = {k_f}, the measurement k = {best}"
        if k_f != best
        else f"Predicted from α and c alone, (1 − α^(k+1)) / ((1 − α)(1 + k/c)) is off by {100 * error:+.0f} % at "
        f"k = {best}"
    )
    detail = (
        f"With {pooled.describe()}, the formula's best k is {k_f} at {_x(s_f)} and it puts k = {best} "
        f"at {_x(at_best)} against {_x(measured.speedup)} measured ({100 * error:+.0f} %): {why}."
    )
    k_max = max(int(done["k"].max()), k_f, 2)
    return [
        _finding(
            "formula",
            "info",
            title,
            detail,
            "speedup",
            "Choose k by the cost-aware prediction (k auto), not the formula.",
            ctx.prefill(title, sweep="auto", values=None, k=None, k_auto=k_max),
            {
                "formula_best": k_f,
                "formula_speedup": float(s_f),
                "measured_best": best,
                "error": error,
                "alpha": alpha,
                "c": c,
                "verify_cost": None if math.isnan(verify) else verify,
            },
        )
    ]
