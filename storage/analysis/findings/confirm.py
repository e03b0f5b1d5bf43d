"""The `confirm` rule: the newest vLLM confirm's measurements beside the lab, per served configuration and
concurrency.

It fires once a confirm has speculative measurements: an error where greedy outputs with speculation differ from the
server's own target-only ones; the server's speedup that gains or loses (a warning where the lab gained and the
server does not); a speedup withheld (withheld.py) or an acceptance collapsed against the lab's
(acceptance_collapse.py); and the first draft position where the server accepts outside the lab run's interval."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.acceptance_collapse import _collapse
from storage.analysis.findings.base import _Context, _finding, _pct, _x
from storage.analysis.findings.withheld import _withheld
from storage.records import production
from storage.records.confirms import beside_lab, latest_measured


def _confirm(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: the newest confirm with speculative measurements (storage/records/confirms.py), per configuration and
    concurrency: greedy outputs with speculation that differ from the server's own target-only outputs (an error:
    the server's speculation is not lossless there); the server's speedup interval wholly above 1 (gains) or
    below 1 (loses), beside the lab's at the same batch size; and the first draft position where the server's
    conditional acceptance lies outside the lab run's 95 % interval (same prompts, so the engines draft
    differently, not the traffic); or, beyond that, the server's acceptance COLLAPSED against the lab's
    (`_collapse`: what to check instead)."""
    confirm_id = latest_measured(ctx.store, ctx.experiment_id)
    if confirm_id is None:
        return []
    found = []
    rows = beside_lab(ctx.store, confirm_id)
    by_series = {item["series_id"]: item for item in production.comparison(ctx.store, ctx.experiment_id)}
    seen: set[tuple[str, int]] = set()
    for r in rows.itertuples(index=False):
        if (r.speculative_config, int(r.concurrency)) in seen:
            continue  # the same configuration served twice in one confirm (before v20): `_server_spread` says it
        seen.add((r.speculative_config, int(r.concurrency)))
        where = f"{r.label} (k={r.k}) at concurrency {r.concurrency}"
        data = {"confirm_id": int(confirm_id), "label": r.label, "k": int(r.k), "concurrency": int(r.concurrency)}
        if (
            r.outputs_match_server_baseline == r.outputs_match_server_baseline
            and r.outputs_match_server_baseline is not None
            and r.outputs_match_server_baseline < 1
        ):
            found.append(
                _finding(
                    "confirm",
                    "error",
                    f"In vLLM, {where} changes the outputs",
                    f"Greedy, only {_pct(r.outputs_match_server_baseline)} of the prompts decode as the server's own "
                    f"target-only outputs ({r.first_divergence or 'no divergence stored'}): the server's speculation "
                    f"is not lossless here.",
                    "confirm",
                    "Report it to the engine with the speculative config; serve without speculation until it is fixed.",
                    None,
                    {**data, "outputs_match_server_baseline": float(r.outputs_match_server_baseline)},
                )
            )
        lo, hi = r.speedup_ci_lo, r.speedup_ci_hi
        lab_gains = (
            r.lab_speedup_ci_lo == r.lab_speedup_ci_lo and r.lab_speedup_ci_lo is not None and r.lab_speedup_ci_lo > 1
        )
        if lo == lo and hi == hi and lo is not None and lo <= 1 <= hi and lab_gains:
            found.append(
                _finding(
                    "confirm",
                    "warning",
                    f"In vLLM, {where} does not gain what the lab measured",
                    f"The server's speedup is {_x(r.speedup)} ({lo:.2f}–{hi:.2f}, over passes), tied with the target "
                    f"alone; the lab measured {_x(r.lab_speedup)} "
                    f"({r.lab_speedup_ci_lo:.2f}–{r.lab_speedup_ci_hi:.2f}) at batch size {r.concurrency}.",
                    "confirm",
                    "Confirm again with more passes, or serve the target alone at this concurrency.",
                    None,
                    {
                        **data,
                        "speedup": float(r.speedup),
                        "lo": float(lo),
                        "hi": float(hi),
                        "gains": None,
                        "lab_speedup": float(r.lab_speedup),
                    },
                )
            )
        elif lo == lo and hi == hi and lo is not None and (lo > 1 or hi < 1):
            gains = lo > 1
            lab = (
                f"; the lab measured {_x(r.lab_speedup)} ({r.lab_speedup_ci_lo:.2f}–{r.lab_speedup_ci_hi:.2f}) at "
                f"batch size {r.concurrency}"
                if r.lab_speedup == r.lab_speedup
                and r.lab_speedup is not None
                and r.lab_speedup_ci_lo == r.lab_speedup_ci_lo
                else f"; the lab's schedule serves the target alone at batch size {r.concurrency}, so vLLM drafts "
                f"nothing there and only its overhead is left"
                if r.k == 0
                else f"; the lab did not measure k = {r.k} at batch size {r.concurrency}"
            )
            disagree = not gains and lab_gains
            found.append(
                _finding(
                    "confirm",
                    "warning" if disagree else "info",
                    f"In vLLM, {where} {'gains' if gains else 'loses'}",
                    f"The server's speedup is {_x(r.speedup)} ({lo:.2f}–{hi:.2f}, over passes){lab}"
                    + (": the lab's gain does not carry over to the server here." if disagree else "."),
                    "confirm",
                    "Serve it at this concurrency."
                    if gains
                    else "Serve the target alone at this concurrency, or a smaller k (a k grid at this batch size and "
                    "--configs schedule give vLLM a k per batch size).",
                    None,
                    {
                        **data,
                        "speedup": float(r.speedup),
                        "lo": float(lo),
                        "hi": float(hi),
                        "gains": gains,
                        "lab_speedup": None if r.lab_speedup != r.lab_speedup else r.lab_speedup,
                    },
                )
            )
        withheld = _withheld(r, where, data)
        found += withheld
        if withheld and withheld[0]["severity"] == "error":
            continue  # the server's sampling changed the outputs: its acceptance says the same, nothing to check
        found += _collapse(ctx, r, where, data)
        item = by_series.get(r.series_id)
        if item and item.get("position") and item["position"]["position"] <= r.positions:
            p = item["position"]
            found.append(
                _finding(
                    "confirm",
                    "warning",
                    f"In vLLM, {where} accepts differently at position {p['position']}",
                    f"The server accepts {p['production']:.3f} at position {p['position']}, the lab {p['lab']:.3f} "
                    f"({p['lo']:.3f}–{p['hi']:.3f}, run {item['run_id']}): on the same prompts, the two engines draft "
                    f"differently (draft sampling, the prompt's rendering or numerics; this confirm does not tell "
                    f"which).",
                    "confirm",
                    "Compare the draft's sampling (vLLM drafts greedily by default) and the prompts' rendering "
                    "with the lab's; serve by the server's figures.",
                    None,
                    {**data, "series_id": int(r.series_id), "position": p},
                )
            )
    return found
