"""The `tie` rule: configurations the measurement cannot tell apart from the best (the verdict's 95 % intervals
overlapping the best one's).

It fires when the verdict has a best and ties others with it; the next step takes the verdict's cheaper tied choice
where there is one (what deploy carries), else measures the tied values again with more prompts or --repeats."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.base import _Context, _finding, _join, _x


def _tie(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: the verdict ties other configurations with the best (95 % intervals overlapping the best one's); the
    next step takes the verdict's cheaper tied choice when there is one (what deploy carries)."""
    v = ctx.verdict
    if v.best is None or not v.tied:
        return []
    shown = [v.best, *v.tied]
    parts = [f"{ctx.variable} = {ctx.show(c.value)} at {_x(c.speedup)} ({c.ci[0]:.2f}–{c.ci[1]:.2f})" for c in shown]
    repeats = ctx.more_repeats()
    cheaper = v.cheaper
    title = f"{len(shown)} configurations are statistically tied"
    detail = (
        f"The 95 % intervals of {_join(parts)} overlap: the measurement cannot tell "
        f"{'them' if len(shown) > 2 else 'the two'} apart."
    )
    if cheaper is not None:
        next_ = (
            f"Take the cheaper {ctx.variable} = {ctx.show(cheaper.value)} ({ctx.swept.cheaper_because}; what "
            f'"Use these settings" deploys), or add prompts or --repeats ({repeats}) to separate them.'
        )
    else:
        next_ = f"Add prompts or --repeats ({repeats}) to separate them."
    tied_values: list[Any] = [c.value for c in shown]
    values = ",".join(ctx.show(value) for value in (tied_values if ctx.swept.categorical else sorted(tied_values)))
    prefill = ctx.prefill(
        title,
        sweep=ctx.variable,
        values=values,
        k_auto=None,
        repeats=repeats,
        k=None if ctx.variable == "k" else int(ctx.experiment["k"]),
    )
    return [
        _finding(
            "tie",
            "info",
            title,
            detail,
            "speedup",
            next_,
            prefill,
            {
                "best": v.best.value,
                "tied_with": [c.value for c in v.tied],
                "cheaper": cheaper.value if cheaper else None,
                "repeats": repeats,
            },
        )
    ]
