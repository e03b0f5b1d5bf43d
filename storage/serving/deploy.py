"""Carry a measured configuration to production: which run to deploy, and its settings for the serving engines users
deploy on, with what was measured and why it was chosen.

`deploy_document(store, eid, run_id)` picks the run — the server's answer first (storage/serving/run_predictions.py's
server_choice, where a server cost profile fits), else the verdict's choice (storage/analysis/verdict.py's one rule:
the cheapest configuration tied with the best that is measurably faster than the target alone, unless one is named; a
grid's: the schedule's entry for the batch size asked, default the smallest) — and wraps its engine settings
(storage/serving/engine_settings.py) with what was measured and the caveats (ties, an interval too wide to choose
by). A test's max_new_tokens is a measurement budget, not a serving setting: it is carried only when asked
(`with_max_new_tokens`, `--with-max-new-tokens`, the panel's checkbox). Pure: no torch, no streamlit; the same
document feeds `draftlab export --format deploy` and the dashboard's "Use these settings" panel
(pages/panels/deploy_panel.py). The engine settings' names are re-exported here.
"""

from __future__ import annotations

from engine.errors import DraftLabError
from storage.serving.engine_settings import (
    DRAFTER_NAMES,
    ENGINES,
    DeployError,
    NoChosenRun,
    configuration,
    deploy_settings,
    deployable_runs,
    named_run,
    parse_drafter,
    refusal,
    run_vllm_settings,
    server_ranges,
)

__all__ = [
    "DRAFTER_NAMES",
    "ENGINES",
    "DeployError",
    "NoChosenRun",
    "caveats",
    "configuration",
    "deploy_document",
    "deploy_settings",
    "deployable_runs",
    "named_run",
    "parse_drafter",
    "refusal",
    "run_vllm_settings",
    "server_ranges",
]


def _chosen_run(store, experiment_id: int, run_id: int | None, v, batch_size: int | None = None, grid=None):
    """(the runs row to deploy, why): the named run ("given"), else the verdict's chosen one
    (storage/analysis/verdict.py's `serve`: "best", or "cheaper tied" when a cheaper configuration tied with the best is
    measurably faster than the target alone). A DeployError when the verdict serves the target alone, or the run fails
    `refusal`."""
    from storage.records import queries as q

    if run_id is not None:
        return named_run(store, experiment_id, run_id), "given"
    runs = q.runs(store, experiment_id)
    where = f" at batch {batch_size}" if batch_size is not None else ""
    if v.target_alone:
        paying = [st.batch_size for st in (grid.steps if grid else ()) if st.k]
        elsewhere = (
            f"the schedule speculates at batch {', '.join(map(str, paying))}: pass --batch-size {paying[0]}"
            if paying
            else ""
        )
        raise NoChosenRun(
            f"experiment {experiment_id}: no configuration is measurably faster than the target "
            f"alone{where} ({v.text}): serve the target alone, there is nothing to deploy",
            elsewhere,
        )
    row = v.run(runs, "chosen")
    if row is None:
        raise NoChosenRun(
            f"experiment {experiment_id} has no best run yet{where} ({v.text})", "name one with --run RUN_ID"
        )
    if why := refusal(row):  # the verdict chooses none of these (queries.CHOOSABLE): the same check, on every path
        raise DeployError(f"experiment {experiment_id}: the verdict's choice{where} cannot be deployed: {why}")
    return row, "cheaper tied" if v.cheaper is not None else "best"


def caveats(v, run_id: int, measured: tuple | None = None) -> list[str]:
    """What the verdict (storage/analysis/verdict.py) says about the deployed run, in sentences: the cheaper tied
    choice, the other ties, an interval too wide to choose by, a named run that is not the verdict's choice, and (from
    `measured`: the deployed run's speedup and interval) a run not measured faster than the target alone."""
    from engine.config.variables import variable

    if v.best is None:
        return [f"No verdict to rest on yet ({v.text})."]
    name, show = v.variable, v.show
    out = []
    if v.chosen is not None and run_id != v.chosen.run_id:
        out.append(
            f"Run {run_id} was named; the verdict would deploy {name} = {show(v.chosen.value)} (run {v.chosen.run_id})."
        )
    if v.cheaper is not None:
        out.append(
            f"{name} = {show(v.cheaper.value)} ({v.cheaper.speedup:.2f}×, {v.cheaper.ci[0]:.2f}–"
            f"{v.cheaper.ci[1]:.2f}) is statistically tied with the best, {name} = {show(v.best.value)} "
            f"({v.best.speedup:.2f}×, {v.best.ci[0]:.2f}–{v.best.ci[1]:.2f}): these settings take the cheaper "
            f"one ({variable(name).cheaper_because})."
        )
    others = [c for c in v.tied if v.cheaper is None or c.run_id != v.cheaper.run_id]
    if others:
        out.append(
            f"{'Also tied' if v.cheaper is not None else 'Tied'} with the best: {name} = "
            f"{', '.join(show(c.value) for c in others)} (overlapping 95 % intervals): the measurement cannot "
            f"tell them apart; more prompts or --repeats would."
        )
    if v.too_wide:
        out.append(
            f"The best's interval ({v.best.ci[0]:.2f}–{v.best.ci[1]:.2f}) is too wide to choose by: rerun with "
            f"more --repeats or more prompts before relying on this choice."
        )
    speedup, lo, hi = measured or (None, None, None)
    if speedup is not None and hi is not None and hi < 1:
        out.append(
            f"These settings measured slower than the target alone ({speedup:.2f}×, {lo:.2f}–{hi:.2f}): "
            f"serving without speculation is faster on this hardware."
        )
    elif speedup is not None and lo is not None and lo <= 1:
        out.append(
            f"These settings were not measured faster than the target alone ({speedup:.2f}×, "
            f"{lo:.2f}–{hi:.2f} includes 1×): speculation may not pay here."
        )
    return out


def _grid_schedule(experiment_id: int, experiment: dict, run_id: int | None, grid) -> dict | None:
    """A k grid's schedule to deploy (storage/analysis/schedule.py), None when not a grid, not over k, or a run is
    named. A DeployError when every batch size measured is served without speculation: there is nothing to deploy."""
    if run_id is not None or grid is None or (experiment.get("sweep_variable") or "k") != "k":
        return None
    known = [step for step in grid.steps if step.k is not None]
    if known and all(step.k == 0 for step in known):
        raise DeployError(
            f"experiment {experiment_id}: speculation is not measurably faster at any batch size "
            f"measured ({', '.join(str(step.batch_size) for step in known)}): serve the target alone, "
            f"there is nothing to deploy ({grid.text})"
        )
    return grid.as_dict()


def deploy_document(
    store,
    experiment_id: int,
    run_id: int | None = None,
    with_max_new_tokens: bool = False,
    batch_size: int | None = None,
    predict: bool = True,
) -> dict:
    """The deploy settings of an experiment's run — the verdict's choice (storage/analysis/verdict.py's one rule) unless
    `run_id` names one — with the configuration they came from, what that run measured, the verdict and its
    `caveats` (the cheaper tied choice, ties, an interval too wide to choose by). A grid's one-k settings are the
    schedule's entry for `batch_size` (default: the smallest), named in `batch_size`; vLLM's carry the whole
    schedule. The test's max_new_tokens only `with_max_new_tokens`. KeyError: no such experiment; DeployError: no
    run to choose, the target alone to serve, a baseline, or a batch size the grid did not measure.

    The server first: without `run_id` (and with `predict`), where a server cost profile fits a deployable run
    (storage/serving/run_predictions.server_choice: the run whose predicted server speedup is surely above 1 and
    highest),
    that run is chosen ("chosen": "server"), vLLM's k per concurrency is its prediction's schedule, `answer` says
    {"from": "server", "label": "predicted for vLLM … on …, profile N"} and `server_predicted` holds the
    prediction; otherwise {"from": "lab", "reason": why the server gave no answer} and the lab's verdict, as before."""
    from storage.analysis.schedule import schedule
    from storage.analysis.verdict import verdict
    from storage.records import queries as q
    from storage.serving.plain import plain
    from storage.serving.run_predictions import server_choice

    experiment = q.experiment(store, experiment_id)
    if experiment is None:
        raise KeyError(experiment_id)
    sizes = q.grid_sizes(experiment)
    if batch_size is not None and (sizes is None or run_id is not None):
        raise DeployError(
            f"--batch-size picks a grid's schedule entry; experiment {experiment_id} "
            + (
                "names a run with --run: drop one of them"
                if sizes
                else "measured one batch size: leave --batch-size out"
            )
        )
    grid = schedule(store, experiment_id) if sizes and run_id is None else None
    if grid is not None:
        try:
            step = grid.at(batch_size)
        except DraftLabError as exc:
            raise DeployError(str(exc)) from None
        v, batch_size = step.verdict, step.batch_size
    else:
        v = verdict(store, experiment_id)
    server, reason = server_choice(store, experiment_id) if predict and run_id is None else (None, None)
    if server is not None:  # the server's answer: its run, vLLM's k per concurrency from its prediction
        vllm_grid = None
        row, _ = _chosen_run(store, experiment_id, int(server["run_id"]), v)
        chosen_by = "server"
        answer = {"from": "server", "label": server["profile"]["label"], "profile_id": server["profile"]["profile_id"]}
    else:
        vllm_grid = _grid_schedule(experiment_id, experiment, run_id, grid)
        row, chosen_by = _chosen_run(store, experiment_id, run_id, v, batch_size, grid)
        answer = {"from": "lab", "reason": reason or "a run named: its own settings"}
    rid = int(row["run_id"])
    stored = {key: value for key, value in q.run_row(store, rid).items() if key != "id"}
    run = plain({**stored, **row.to_dict()})
    cfg = configuration(run, experiment, with_max_new_tokens)
    ci = [run.get("speedup_ci_lo"), run.get("speedup_ci_hi")]
    return plain(
        {
            "experiment_id": int(experiment_id),
            "run_id": rid,
            "chosen": chosen_by,
            **({"batch_size": batch_size} if grid is not None else {}),
            "verdict": v.as_dict(),
            "caveats": (
                [
                    f"Chosen from the server's side ({answer['label']}): run {rid}'s acceptance with the server's "
                    f"step costs; the lab's own verdict, timed in DraftLab's loop, says: {v.text}"
                ]
                if server is not None
                else caveats(v, rid, (run.get("speedup"), run.get("speedup_ci_lo"), run.get("speedup_ci_hi")))
            )
            + (
                [
                    f"A grid: {grid.text}; these settings are the schedule's entry for batch {batch_size}"
                    + (", vLLM's carry the whole schedule." if vllm_grid else ".")
                ]
                if grid is not None
                else []
            ),
            **({"schedule": vllm_grid} if vllm_grid else {}),
            "configuration": {key: value for key, value in cfg.items() if not key.startswith("_")},
            "measured": {
                "status": run.get("status"),
                "speedup": run.get("speedup"),
                "speedup_ci": ci if all(x is not None for x in ci) else None,
                "alpha": run.get("alpha"),
                "tokens_per_round": run.get("tokens_per_round"),
                "c": run.get("c"),
                "timing_warning": run.get("timing_warning"),
                "max_new_tokens": cfg["_measured_max_new_tokens"],
            },
            "answer": answer,
            **({"server_predicted": server} if server is not None else {}),
            "engines": deploy_settings(run, experiment, with_max_new_tokens, vllm_grid, batch_size, server),
        }
    )
