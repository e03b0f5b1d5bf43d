"""The `validation` rule: does the gain of a tuned configuration hold on held-out prompts (the result of
storage/analysis/validation.py, the tuning run against the held-out one).

It fires once a validation experiment's run has finished: info where the gain holds (carry it to production), a
warning where it does not (α dropped beyond sampling error, or the speedup interval fell wholly below the tuning
run's), with a k sweep around the tuned k on the held-out prompts as the next step."""

from __future__ import annotations

from typing import Any

from storage.analysis import validation as val
from storage.analysis.findings.base import _cap, _Context, _finding, _ks


def _validation(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (a validation experiment whose run finished): storage/analysis/validation.py's result, the tuning run
    against the held-out one. Holds: info; does not hold (α dropped beyond sampling error, one-sided, or the speedup
    interval fell wholly below the tuning run's): a warning, and the next step tunes again on the held-out set."""
    if not ctx.experiment.get("validates"):
        return []
    result = val.validation_result(ctx.store, ctx.experiment_id)
    if result["holds"] is None:
        return []
    tuned, held = int(result["validates"]), result["validation_set"]
    k = int(result["configuration"]["k"])
    data = {
        "holds": bool(result["holds"]),
        "validates": tuned,
        "tune_set": result["tune_set"],
        "validation_set": held,
        "tune_run_id": int(result["tune"]["run_id"]),
        "validation_run_id": int(result["validation"]["run_id"]),
        "alpha": result["alpha"],
    }
    if result["holds"]:
        title = f"The gain of experiment #{tuned} holds on {held}"
        repeats = ctx.more_repeats()
        next_ = (
            f'Carry k = {k} to production ("Use these settings", in the Serving section), or confirm on more '
            f"prompts or --repeats ({repeats})."
        )
        prefill = ctx.prefill(title, repeats=repeats)
        return [_finding("validation", "info", title, _cap(result["reason"]) + ".", "speedup", next_, prefill, data)]
    title = f"The gain of experiment #{tuned} does not hold on {held}"
    around = sorted({max(1, k // 2), k, k + 1, 2 * k})
    next_ = (
        f"The tuned configuration does not carry over: sweep k again ({_ks(around, ', ')}) on prompts like "
        f"{held}, or tune on a set closer to what you serve."
    )
    prefill = ctx.prefill(title, sweep="k", values=_ks(around), k=None, k_auto=None)
    return [_finding("validation", "warning", title, _cap(result["reason"]) + ".", "speedup", next_, prefill, data)]
