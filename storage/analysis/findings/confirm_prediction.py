"""The confirm-against-its-prediction rule (kind `confirm`): a served cell measured outside the interval predicted
for it before it was measured.

It fires (a warning) per cell of the newest confirm whose measured speedup lies outside its prediction (a server
cost profile other than this confirm and the lab run's acceptance, storage/records/confirm_checks.py), naming which
side moved (storage/analysis/prediction_check.py): the acceptance, the step cost, both, or neither."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.base import _Context, _finding, _x
from storage.analysis.prediction_check import moved_words, prediction_check
from storage.records.confirm_checks import predicted_cells
from storage.records.confirms import latest_measured


def _confirm_prediction(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: a cell of the newest confirm whose measured speedup falls outside the interval predicted for it before it
    was measured (storage/records/confirm_checks.py: a server cost profile other than this confirm and the lab run's
    acceptance), naming which side moved (storage/analysis/prediction_check.py): acceptance (the lab's tokens per
    step against the server's counters' over the same passes) or cost (the profile's step ratio t_k / t_0 against
    this confirm's own), both, or neither (the time outside the decode steps)."""
    confirm_id = latest_measured(ctx.store, ctx.experiment_id)
    if confirm_id is None:
        return []
    found = []
    for cell in predicted_cells(ctx.store, confirm_id):
        check = prediction_check(cell)
        if check is None or not check["outside"]:
            continue
        where = f"{cell['label']} (k={cell['k']}) at concurrency {cell['concurrency']}"
        lo, hi = cell["predicted_speedup_ci"]
        ci = cell["speedup_ci"]
        measured = _x(cell["speedup"]) + (f" ({ci[0]:.2f}–{ci[1]:.2f}, over passes)" if ci else " (one pass)")
        profile = cell["predicted_profile_id"]
        elsewhere = [
            f"{what} {theirs or 'unknown'} against this confirm's {ours or 'unknown'}"
            for what, theirs, ours in (
                ("hardware", cell["profile_hardware"], cell["hardware"]),
                ("vLLM", cell["profile_engine_version"], cell["engine_version"]),
            )
            if theirs != ours
        ]
        steps = (
            f"Profile again where this confirm ran (`draftlab profile {ctx.experiment_id}`): the server's step costs "
            f"are not profile {profile}'s"
            + (f" ({'; '.join(elsewhere)})" if elsewhere else " (the same machine and vLLM: its load changed)")
            + "."
        )
        drafts = (
            "The server accepts differently from the lab on the same prompts (see this confirm's acceptance "
            "findings): predictions take the lab's acceptance, so check that the server drafts what the lab measured."
        )
        next_ = " ".join({"acceptance": drafts, "cost": steps}[side] for side in check["moved"]) or (
            "Confirm again with more passes (--repeats) on a quieter machine: the time outside the decode steps "
            "(prefill, queueing) and the spread between server starts are not in the prediction."
        )
        found.append(
            _finding(
                "confirm",
                "warning",
                f"In vLLM, {where} measured outside its prediction",
                f"The server measured {measured}, {check['direction']} the {_x(cell['predicted_speedup'])} "
                f"({lo:.2f}–{hi:.2f}) predicted from profile {profile} and the lab's acceptance: {moved_words(check)}.",
                "confirm",
                next_,
                None,
                {
                    "confirm_id": int(confirm_id),
                    "label": cell["label"],
                    "k": cell["k"],
                    "concurrency": cell["concurrency"],
                    "speedup": cell["speedup"],
                    "predicted_speedup": cell["predicted_speedup"],
                    "predicted_speedup_ci": [lo, hi],
                    "predicted_profile_id": profile,
                    **check,
                },
            )
        )
    return found
