"""The `sampling_mismatch` rule: every arm of a comparison must decode alike, so a speculative run whose decoding
settings (engine/config/run_config.py's BASELINE_PARAMETERS: its sampling, max_new_tokens, ...) differ from its own
baseline's is an error.

It fires for any such run, one finding naming them all (storage/records/run_rows.py's sampling_mismatches: the SQL
join of each run with its baseline); the next step is to queue the experiment again and report a bug."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.base import MISMATCH_KEYS, _cap, _Context, _finding, _join
from storage.records import queries as q


def _sampling_mismatch(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: any speculative run whose temperature/top_k/top_p/seed/max_new_tokens differ from its own baseline's
    (storage/records/run_rows.py's sampling_mismatches: SQL join of each run with its baseline). Every arm of a
    comparison must decode alike, so this is an error."""
    rows = q.sampling_mismatches(ctx.store, ctx.experiment_id)
    if not rows:
        return []
    parts, data = [], []
    for r in rows:
        differ = {key: (r[key], r[f"b_{key}"]) for key in MISMATCH_KEYS if r[key] != r[f"b_{key}"]}
        what = ", ".join(f"{key} = {run:g} against {base:g}" for key, (run, base) in differ.items())
        value = ctx.swept.run_value(r)
        value = f" ({ctx.variable} = {ctx.show(value)})" if value is not None else ""
        parts.append(f"run {r['run_id']}{value} decoded with {what} in its baseline (run {r['baseline_run_id']})")
        data.append(
            {
                "run_id": int(r["run_id"]),
                "baseline_run_id": int(r["baseline_run_id"]),
                "differ": {key: [float(a), float(b)] for key, (a, b) in differ.items()},
            }
        )
    title = "Sampling settings differ between arms"
    detail = (
        f"{_cap(_join(parts))}: its speedup compares two different decodings, and this should never "
        f"happen (every arm of an experiment shares one sampling configuration)."
    )
    return [
        _finding(
            "sampling_mismatch",
            "error",
            title,
            detail,
            "runs",
            "Do not use these speedups; queue the experiment again and report this as a bug.",
            ctx.prefill(title),
            {"runs": data},
        )
    ]
