"""The `server` rule: where a server cost profile fits, the server's answer (the k per concurrency deploy serves,
predicted from the run's acceptance and the server's step costs) beside the lab's verdict.

It fires when the caller passes a fitted answer (storage/serving/run_predictions.server_verdict): a warning where
the two disagree (the lab serves the target alone and the server gains, or the server's k at its smallest concurrency
is not the lab's choice), info where they agree or where no k is predicted surely faster in the server."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.base import _cap, _Context, _finding


def _server_answer(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: where a server cost profile fits the experiment's runs, the server's answer (what deploy serves: the run
    and its k per concurrency predicted from its acceptance and the server's step costs), beside the lab's verdict,
    whose speedups time DraftLab's own loop. A warning where the two disagree (the lab serves the target alone and
    the server gains, or the server's k at its smallest concurrency is not the lab's choice), info where they agree;
    info too where a profile fits but no k is predicted surely faster in the server."""
    server = ctx.server
    if not server or not server.get("fitted"):
        return []
    eid = ctx.experiment_id
    chosen = server.get("chosen")
    if chosen is None:
        return [
            _finding(
                "server",
                "info",
                "In vLLM, no configuration is predicted surely faster",
                f"From the stored server cost profiles: {server['reason']}. The lab's verdict stands: "
                f"{ctx.verdict.text}.",
                "server",
                f"Profile more passes (`draftlab profile {eid} --repeats 10`) for narrower intervals, or confirm a "
                f"configuration in the server (`draftlab confirm {eid}`).",
                None,
                {"chosen": None, "reason": server["reason"]},
            )
        ]
    label, run_id = chosen["profile"]["label"], int(chosen["run_id"])
    # the k it serves at the smallest concurrency that speculates (server_answer chose a run that gains somewhere)
    concurrency, server_k = next(
        (int(c), int(k)) for c, k in sorted(chosen["schedule"].items(), key=lambda x: int(x[0])) if int(k)
    )
    lab_chosen = ctx.verdict.chosen
    value = lab_chosen.value if lab_chosen is not None else None
    if ctx.variable == "k":  # a k sweep: the same k, whichever run of it
        agree = isinstance(value, (int, float)) and int(value) == server_k
    else:  # another variable: the same run
        agree = lab_chosen is not None and lab_chosen.run_id == run_id
    lab_says = (
        f"the lab's own loop chose {ctx.swept.name} {ctx.swept.show(lab_chosen.value)} (run {lab_chosen.run_id})"
        if lab_chosen is not None
        else "the lab's own loop serves the target alone"
    )
    return [
        _finding(
            "server",
            "info" if agree else "warning",
            f"In vLLM, serve k={server_k} at concurrency {concurrency} (predicted)"
            + ("" if agree else ", not the lab's choice"),
            f"{_cap(label)}, from run {run_id}'s acceptance and the server's step costs: {server['said']}; "
            f"{lab_says} ({ctx.verdict.text}). The lab times DraftLab's transformers loop, the prediction the "
            f"server's own steps: deploy and confirm serve the server's answer.",
            "server",
            f"Confirm it in the server: `draftlab confirm {eid}` (chosen, one k) or `--configs schedule` (its k per "
            f"concurrency, where it changes).",
            None,
            {
                "chosen_run_id": run_id,
                "profile_id": chosen["profile"]["profile_id"],
                "schedule": chosen["schedule"],
                "lab_run_id": lab_chosen.run_id if lab_chosen is not None else None,
                "agree": agree,
            },
        )
    ]
