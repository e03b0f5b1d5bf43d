"""The `low_c` rule: a draft too slow to pay, where even the formula's optimistic best (it leaves out the verify
pass's cost) predicts under LOW_SPEEDUP.

It fires when, over the finished speculative runs with at least MIN_VERIFIED verified drafts and a measured c, the
highest speedup theory.best_k predicts is under LOW_SPEEDUP; it gives the c a draft would need to reach WORTH_IT
and suggests a drafter without a draft model."""

from __future__ import annotations

import math
from typing import Any

from engine.metrics import theory
from storage.analysis.findings.base import (
    LOW_SPEEDUP,
    MIN_VERIFIED,
    MODEL_FREE_DRAFTERS,
    WORTH_IT,
    _Context,
    _finding,
    _join,
    _x,
)


def _c_needed(alpha: float, goal: float = WORTH_IT) -> float | None:
    """The smallest c (to 2 digits) with which the formula's best k reaches `goal` at this α; None if no c can
    (the formula's limit as c grows is 1 / (1 - α))."""
    if alpha >= 1 or 1 / (1 - alpha) <= goal:
        return None
    lo, hi = 1.0, 1e6
    if theory.best_k(alpha, hi, k_max=64)[1] < goal:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if theory.best_k(alpha, mid, k_max=64)[1] < goal else (lo, mid)
    return math.ceil(hi * 100) / 100  # rounded up: the c returned does reach the goal


def _low_c(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: over the finished speculative runs with at least MIN_VERIFIED verified drafts and a measured c, the
    highest speedup the formula predicts at its best k (theory.best_k with the run's α and c) is under LOW_SPEEDUP.
    The formula is the optimistic bound (it ignores the verify pass's cost), so the draft cannot pay."""
    spec = ctx.spec[
        (ctx.spec["status"] == "done")
        & ctx.spec["c"].notna()
        & ctx.spec["alpha"].notna()
        & (ctx.spec["accepted"] + ctx.spec["rejected"] >= MIN_VERIFIED)
    ]
    if spec.empty:
        return []
    rows = [(theory.best_k(float(r.alpha), float(r.c)), r) for r in spec.itertuples() if r.c > 0]
    if not rows:
        return []
    (k_f, s_f), r = max(rows, key=lambda kv: kv[0][1])
    if s_f >= LOW_SPEEDUP:
        return []
    need = _c_needed(float(r.alpha))
    title = f"The draft is too slow to pay (c = {r.c:.2f})"
    detail = (
        f"With α = {r.alpha:.3f} and c = {r.c:.2f} ({ctx.label(r)}, the most promising run), even the formula's "
        f"best k ({k_f}) predicts only {_x(s_f)}, and the formula leaves out the verify pass's cost"
        + (
            f"; at this α the draft {ctx.experiment['draft']} would need c ≥ {need:.1f} to reach {_x(WORTH_IT)}."
            if need
            else f"; at this α no draft speed reaches {_x(WORTH_IT)}."
        )
    )
    prefill = ctx.prefill(title, sweep="k", values="2,4,8", k=None, k_auto=None, drafter=MODEL_FREE_DRAFTERS[0])
    return [
        _finding(
            "low_c",
            "info",
            title,
            detail,
            "cost",
            f"Try a faster (smaller) draft, or a drafter without a draft model "
            f"({_join(list(MODEL_FREE_DRAFTERS))}: no draft step to pay for).",
            prefill,
            {
                "run_id": int(r.run_id),
                "alpha": float(r.alpha),
                "c": float(r.c),
                "best_k": k_f,
                "predicted": float(s_f),
                "c_needed": need,
            },
        )
    ]
