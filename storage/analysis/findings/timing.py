"""The `timing_warning` rule: a run whose measured speedup exceeds its tokens per round drifted in timing (no round
can be that fast: each costs a target forward), so it is never picked as the best.

It fires (a warning) for any speculative run with a stored timing_warning, with a rerun at more --repeats as the
next step."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.base import _cap, _Context, _finding, _join, _x


def _timing_warnings(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: any run with a timing_warning (its measured speedup exceeds its tokens per round)."""
    spec = ctx.every_run[ctx.every_run["kind"] == "speculative"]
    warned = spec[spec["timing_warning"].notna()]
    if warned.empty:
        return []
    parts = [
        f"the run at {ctx.label(r)} measured {_x(r.speedup)} with {r.tokens_per_round:.2f} tokens per round"
        for r in warned.itertuples()
    ]
    repeats = ctx.more_repeats()
    title = f"Timing drifted in {len(warned)} run{'s' if len(warned) > 1 else ''}"
    detail = (
        f"{_cap(_join(parts))}, faster than any round can be (each costs a target forward), so "
        f"{'these runs are' if len(warned) > 1 else 'this run is'} never picked as the best."
    )
    return [
        _finding(
            "timing_warning",
            "warning",
            title,
            detail,
            "speedup",
            f"Timing drifted: rerun with more --repeats ({repeats}) or on a quieter machine.",
            ctx.prefill(title, repeats=repeats),
            {"run_ids": [int(r) for r in warned["run_id"]], "repeats": repeats},
        )
    ]
