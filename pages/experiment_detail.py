"""Experiment detail: the headline (status, what the verdict serves, its speedup with the interval, the verdict in
words) above sections of which only the open one is built (pages/panels/sections.py, `?section=`): the Verdict (the
speedup curve against the predictions, the findings), why drafts are rejected, predictions and cost, serving,
Confirm in vLLM and the runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from engine.config.variables import variable
from engine.metrics import theory
from engine.text.prompt_sets import set_name
from engine.wording import plural
from pages.panels import sections
from pages.panels.advice import browser_advice
from pages.panels.block_panel import render_block
from pages.panels.confirm_panel import render_confirm
from pages.panels.deploy_panel import render_deploy_panel
from pages.panels.drafting_panel import render_k_distribution
from pages.panels.findings_panel import render_findings
from pages.panels.production_panel import render_production
from pages.panels.profile_panel import render_profile
from pages.panels.schedule_panel import batch_name, headline, render_schedule, render_vllm_schedule
from pages.panels.server_predicted_panel import predictions, render_server_predicted
from pages.panels.tree_panel import formula_note, render_tree
from pages.panels.validation_panel import render_validation
from pages.widgets import charts
from pages.widgets.common import (
    cached,
    chart_with_csv,
    csv_download,
    empty_state,
    experiment_label,
    nav_page,
    number,
    run_label,
    run_stamp,
    select_id,
    show,
    store,
    swept_values,
    table,
    version,
)
from pages.widgets.prefill import md_text
from storage.analysis import catalog, formula
from storage.analysis.findings import findings
from storage.analysis.schedule import schedule_dict
from storage.analysis.verdict import verdict_dict
from storage.records import columns
from storage.records import queries as q
from storage.records.columns import shown_in
from storage.records.profile_version import profiles_version
from storage.serving.engine_settings import deployable_runs, schedule_text
from storage.serving.run_predictions import server_answer, server_verdict

ACTIVE = ("queued", "running")
REFRESH_SECONDS = 2.0
# The Runs table: headers, help and formats from storage/records/columns.py. Wall seconds are in the cost table, a
# timing warning and an error in the boxes above the table (the ⚠ check column marks the run): the CSV keeps every
# column.
RUN_COLUMNS = [
    "check",
    "run_id",
    "kind",
    "k",
    "sweep_value",
    "status",
    "progress",
    "new_tokens",
    "tokens_per_second",
    "speedup",
    "speedup_ci_lo",
    "speedup_ci_hi",
    "predicted_speedup_refined",
    "predicted_speedup",
    "alpha",
    "draft_acceptance_rate",
    "tokens_per_round",
    "expected_alpha",
    "kl",
    *shown_in("runs"),
    "outputs_match_baseline",
    "speedup_note",
]
COST_COLUMNS = [
    "run_id",
    "kind",
    "k",
    "sweep_value",
    "c",
    "verify_cost",
    "peak_memory_mb",
    "target_step_seconds",
    "draft_step_seconds",
    "tokens_per_second",
    "wall_seconds",
    *shown_in("cost"),
]
# Serving metrics (docs/metrics.md "Serving metrics"): runs decoded in batches report them, batch-1 loops do not.
SERVING_COLUMNS = [
    "run_id",
    "kind",
    "k",
    "sweep_value",
    "batch_size",
    "tokens_per_second",
    "ttft_seconds_p50",
    "ttft_seconds_p95",
    "itl_seconds_p50",
    "itl_seconds_p95",
    "request_latency_seconds_p50",
    "request_latency_seconds_p95",
]
IMPOSSIBLE = "⚠ impossible speedup"  # the Runs table's mark on a run with a timing_warning
MEASURED = ["run_id", "status", "speedup", "speedup_ci_lo", "speedup_ci_hi", "predicted_speedup_refined"]
ERRORS = {
    f"{name}_error": st.column_config.NumberColumn(f"{label} error", format="percent", help="predicted / measured − 1")
    for name, label in (("refined", "cost-aware"), ("formula", "formula at run's α, c"), ("prediction", "prediction"))
}


def by_swept_value(curve: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """The sweep curve with its swept value in a column named after the variable (`k`, `temperature`, ...)."""
    if sweep_variable == "k":
        return curve.drop(columns=["sweep_value"]).assign(k=lambda f: f["k"].astype(int))
    return curve.rename(columns={"sweep_value": sweep_variable})


def speedup_frame(
    curve: pd.DataFrame, sweep_variable: str, pooled: formula.Pooled | None, auto_curve: dict | None = None
) -> pd.DataFrame:
    """What the speedup chart draws: per swept value the measured speedup with its 95 % interval and whether its
    run finished (`state`), that run's cost-aware prediction, and the formula's (a k sweep: the experiment's formula
    curve, storage/analysis/formula.py, at every k; otherwise each run's own); `--k auto` adds the curve it predicted
    (predicted_auto)."""
    values = by_swept_value(curve, sweep_variable)
    measured = values[[sweep_variable, *MEASURED]].assign(state=charts.run_states(values))
    if sweep_variable != "k":
        return measured.assign(predicted_speedup=values["predicted_speedup"])
    auto = {int(k): float(v) for k, v in (auto_curve or {}).items()}
    if pooled is None and not auto:
        return measured.assign(predicted_speedup=np.nan)
    ks = [*measured["k"], *auto]
    if pooled is not None:
        predicted = formula.formula_curve(pooled, ks)
    else:
        predicted = pd.DataFrame({"k": range(1, max([formula.K_MAX_SHOWN, *ks]) + 1)}).assign(predicted_speedup=np.nan)
    if auto:
        predicted["predicted_auto"] = predicted["k"].map(auto)
    frame = predicted.merge(measured, on="k", how="outer").sort_values("k").reset_index(drop=True)
    return frame.assign(run_id=frame["run_id"].astype("Int64"))  # k values with no run: blank, not a float id


def prediction_table(curve: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """Each run's measured speedup next to its cost-aware prediction and the article's formula (at the run's own α,
    k and c), with each prediction's error: predicted / measured − 1."""
    grid = ["batch_size"] if "batch_size" in curve else []  # a grid: each row's batch size
    table = by_swept_value(curve, sweep_variable)[[*grid, sweep_variable, *MEASURED, "predicted_speedup"]]
    return table.assign(
        refined_error=table["predicted_speedup_refined"] / table["speedup"] - 1,
        formula_error=table["predicted_speedup"] / table["speedup"] - 1,
    ).replace([np.inf, -np.inf], np.nan)


def auto_k_table(experiment: dict, curve: pd.DataFrame) -> pd.DataFrame:
    """`--k auto`: each confirmed k, measured after the curve was predicted, against that prediction (its batch
    size's curve: at several batch sizes each has its own, and the table names the batch size)."""
    curves = q.predicted_curves(experiment)
    sizes = (
        curve["batch_size"].fillna(1).astype(int)
        if "batch_size" in curve  # a grid: each row's batch size
        else pd.Series(int(experiment.get("batch_size") or 1), index=curve.index, dtype=int)
    )
    ks = curve["k"].astype(int)
    keep = [bool(b in curves and k in curves[b][1]) for b, k in zip(sizes, ks)]
    confirmed = curve[keep]
    predicted = [curves[b][0].get(k) for b, k, kept in zip(sizes, ks, keep) if kept]
    table = confirmed[["k", *MEASURED[:-1]]].assign(predicted=pd.Series(predicted, index=confirmed.index, dtype=float))
    if len(curves) > 1:
        table.insert(0, "batch_size", sizes[keep].to_numpy())
    return table.assign(prediction_error=table["predicted"] / table["speedup"] - 1).reset_index(drop=True)


def tokens_frame(curve: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """Measured tokens_per_round per run next to the formula's (1 − α^(k+1)) / (1 − α) at that run's α and k."""
    frame = by_swept_value(curve, sweep_variable)[
        list(dict.fromkeys([sweep_variable, "k", "run_id", "alpha", "tokens_per_round"]))
    ].copy()
    trees = curve["draws_tree"] if "draws_tree" in curve else pd.Series(False, index=curve.index)
    frame["expected_tokens_per_round"] = [  # the chain formula's: none for a token tree (tree_topk > 1)
        theory.expected_tokens_per_round(a, int(k)) if pd.notna(a) and pd.notna(k) and not tree else np.nan
        for a, k, tree in zip(frame["alpha"], frame["k"], trees)
    ]
    return frame


def best_run(runs: pd.DataFrame, verdict: dict) -> pd.Series | None:
    """The run the verdict (storage/analysis/verdict.py) crowned, None before there is one."""
    run_id = verdict.get("best_run_id")
    rows = runs[runs["run_id"] == run_id] if run_id is not None else runs.iloc[:0]
    return rows.iloc[0] if len(rows) else None


def _value_text(run) -> str:
    """A run's swept value as shown to people: its label when it has one (`demo-draft`), else the number."""
    label = getattr(run, "sweep_label", None)
    return str(label) if label is not None and pd.notna(label) else f"{run.sweep_value:g}"


def _header(experiment: dict, row: pd.Series, runs: pd.DataFrame, verdict: dict, schedule: dict | None) -> None:
    sampling = experiment.get("sampling") or {}
    st.caption(
        " · ".join(
            filter(
                None,
                [
                    f"**{experiment.get('draft')}** drafting for **{experiment.get('target')}**",
                    f"prompts `{set_name(experiment.get('prompts'))}`",
                    ", ".join(f"{k}={v}" for k, v in sampling.items()) if isinstance(sampling, dict) else str(sampling),
                    f"device {experiment.get('device', 'auto')}/{experiment.get('dtype', 'auto')}",
                    f"{plural(experiment['repeats'], 'timed repeat')} per prompt (medians)"
                    if experiment.get("repeats")
                    else "",
                    f"k auto up to {experiment['k_auto']}" if experiment.get("k_auto") else "",
                    f"tags: {row.get('tags')}" if row.get("tags") else "",
                    f"launched by {md_text(experiment['launched_by'])}" if experiment.get("launched_by") else "",
                ],
            )
        )
    )
    if experiment.get("notes"):
        st.markdown(f"> {experiment['notes']}")
    baseline = runs[runs["kind"] == "baseline"]
    sweep_variable = row.get("sweep_variable") or "k"
    # A grid's one verdict is its smallest batch size's (storage/analysis/verdict.py): the metrics say so; the headline
    # is the schedule's, every batch size's verdict in one sentence.
    smallest = schedule["steps"][0]["batch_size"] if schedule and schedule["steps"] else None
    at = f" ({batch_name(smallest)})" if smallest is not None else ""
    if smallest is not None:
        baseline = baseline[baseline["batch_size"] == smallest]
    cols = st.columns([1, 1.2, 2.2, 1.2, 1.5])
    progress = row["progress"] if pd.notna(row["progress"]) else 0.0
    cols[0].metric(
        "Status",
        str(row["status"]),
        delta=f"{progress:.0%} done" if row["status"] in ACTIVE else None,
        delta_color="off",
        delta_arrow="off",
    )
    served = headline_figures(verdict, runs, sweep_variable)
    cols[1].metric(
        f"{sweep_variable} to serve{at}",
        served["value"],
        help="the verdict's choice (storage/analysis/verdict.py): the cheapest configuration tied with the best "
        "that is measurably faster than the target alone; none is: the target alone",
    )
    cols[2].metric(
        f"Speedup{at}",
        served["speedup"],
        delta=served["best"],
        delta_color="off",
        delta_arrow="off",
        help="of what is served, measured, with its 95 % interval (paired bootstrap over the prompts)",
    )
    cols[3].metric(
        f"α ({served['alpha_of']}{', ' + batch_name(smallest) if smallest is not None else ''})",
        show("alpha", served["alpha"]),
    )
    cols[4].metric(
        f"Baseline tokens/s{at}", number(baseline["tokens_per_second"].iloc[0] if len(baseline) else None, "{:.1f}")
    )
    if schedule is not None:
        headline(schedule)
        return
    say = st.warning if verdict["too_wide"] else st.info
    say(
        f"**Verdict:** {md_text(browser_advice(verdict['text']))}.",
        icon=":material/warning:" if verdict["too_wide"] else ":material/gavel:",
    )


def _server_answer(d: Detail) -> None:
    """The server's answer under the lab's verdict, where a server cost profile fits a run: the run and the k per
    concurrency that storage/serving/deploy.py serves (storage/serving/run_predictions.server_answer over the
    deployable runs), or why the server gives none. Nothing where no profile fits any run (the "In the server
    (predicted)" panel says why)."""
    if d.runs.empty or not (d.runs["kind"] == "speculative").any():
        return
    docs = predictions(d.experiment_id, d.stamp)
    if not any(doc.get("profile") for doc in docs.values()):
        return
    chosen, reason = server_answer(docs, cached(deployable_runs, d.experiment_id, stamp=d.stamp))
    if chosen is None:
        st.info(f"**In the server:** {md_text(reason)}: the lab's verdict stands.", icon=":material/dns:")
        return
    st.info(
        f"**In the server** ({md_text(chosen['profile']['label'])}): serve run {chosen['run_id']}, "
        f"{md_text(schedule_text(chosen))}. What `draftlab export {d.experiment_id} --format deploy` and "
        f'"Use these settings" serve.',
        icon=":material/dns:",
    )


def headline_figures(verdict: dict, runs: pd.DataFrame, sweep_variable: str) -> dict:
    """The headline's figures, all of them the verdict's (storage/analysis/verdict.py), never a contradiction of its
    sentence: `value`, what to serve (its chosen value; `0 (target alone)` for a k sweep where no configuration is
    measurably faster than the target alone); `speedup`, the served run's with its interval (1× for the target
    alone); `best`, the best measured one where it is not what is served (else None); `alpha` and `alpha_of`, the
    served run's α (the best run's where the target alone is served)."""
    swept = variable(sweep_variable)
    if verdict.get("best") is None:
        return {"value": "—", "speedup": "—", "best": None, "alpha": None, "alpha_of": "best run"}
    best = best_run(runs, verdict)
    best_text = (
        f"best measured: {swept.name} {swept.show(verdict['best'])} at "
        f"{charts.speedup_text(verdict['speedup'], *(verdict['speedup_ci'] or [None, None]))}"
    )
    chosen = runs[runs["run_id"] == verdict.get("chosen_run_id")]
    if verdict.get("chosen_run_id") is None or chosen.empty:  # the target alone is served
        return {
            "value": "0 (target alone)" if swept.name == "k" else "none (target alone)",
            "speedup": "1× (target alone)",
            "best": best_text,
            "alpha": best["alpha"] if best is not None else None,
            "alpha_of": "best run",
        }
    run = chosen.iloc[0]
    return {
        "value": swept.show(verdict["chosen"]),
        "speedup": charts.speedup_text(run["speedup"], run["speedup_ci_lo"], run["speedup_ci_hi"]),
        "best": None if verdict["chosen_run_id"] == verdict["best_run_id"] else best_text,
        "alpha": run["alpha"],
        "alpha_of": "served run",
    }


def _warnings(runs: pd.DataFrame, sweep_variable: str) -> None:
    for r in runs[runs["timing_warning"].notna()].itertuples():
        st.warning(
            f"Run {r.run_id} ({sweep_variable} = {_value_text(r)}) is never picked as the best: {r.timing_warning}.",
            icon=":material/warning:",
        )


def grid_frame(curve: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """A grid's per-run curves, one series per batch size (`batch`): the swept value, α, draft acceptance and
    tokens per round. curve: sweep_curve with each run's batch_size."""
    values = by_swept_value(curve, sweep_variable)
    shown = list(
        dict.fromkeys(["batch_size", sweep_variable, "run_id", "alpha", "draft_acceptance_rate", "tokens_per_round"])
    )
    frame = values[shown].assign(batch=values["batch_size"].map(batch_name))
    return frame.sort_values(["batch_size", sweep_variable]).reset_index(drop=True)


def _grid_curves(curve: pd.DataFrame, sweep_variable: str) -> None:
    """A grid's acceptance and tokens per round against the swept value, one line per batch size (runs at
    different batch sizes are never one line); the speedup is the k schedule's chart above."""
    frame = grid_frame(curve, sweep_variable)
    for column, (y, title, domain, name) in zip(
        st.columns(2),
        (
            ("alpha", "α", (0, 1), "acceptance_by_batch_size.csv"),
            ("tokens_per_round", "tokens per round", None, "tokens_per_round_by_batch_size.csv"),
        ),
    ):
        with column:
            st.subheader(f"{title} vs {sweep_variable} at each batch size")
            chart_with_csv(
                charts.overlaid_curves(frame, sweep_variable, y, "batch", sweep_variable, title, domain), frame, name
            )
            note = charts.coinciding_note(charts.coinciding(frame, sweep_variable, y, "batch"), title, sweep_variable)
            if note:  # greedy decoding at batch 1 and 2 gives the same α: say so, a legend entry has no line of its own
                st.caption(md_text(note))


def _speedup_chart(d: Detail) -> None:
    """The answer's chart: measured speedup against the swept value with its intervals and the predictions, the
    verdict's choice marked."""
    sweep_variable, experiment = d.sweep_variable, d.experiment
    pooled = cached(formula.pooled_inputs, d.experiment_id, stamp=d.stamp) if sweep_variable == "k" else None
    auto_curve = (experiment.get("predicted_curve") or {}).get("curve")
    st.subheader(f"Speedup vs {sweep_variable}")
    frame = speedup_frame(d.curve, sweep_variable, pooled, auto_curve)
    x, label = served_mark(d.runs, d.verdict, sweep_variable)
    chart_with_csv(charts.speedup_curve(frame, sweep_variable, x, label), frame, "speedup_curve.csv")
    st.caption(
        f"Points: measured, with 95 % intervals (paired bootstrap over prompts); hollow: the run has not "
        f"finished, a cross: an impossible speedup (timing warning); neither can be chosen. Dashed purple: "
        f"{charts.COST_AWARE}, from each run's own round times (E[L]: its tokens per round, t: a target step, "
        f"t_d: its draft step, verify: its verify forward){_cost_aware_best(d)}. Orange: what the verdict "
        f"serves."
    )
    if pooled:
        k_best, s_best = pooled.best_k()
        st.caption(f"Dashed grey: {charts.FORMULA}, with {pooled.describe()}; its best k is {k_best} at {s_best:.2f}×.")
    if note := formula_note(d.runs):
        st.caption(note)


def _cost_aware_best(d: Detail) -> str:
    """`; its best k is 2 at 1.71×`: the one cost-aware best k (storage/analysis/formula.py), the Theory page's too."""
    best = cached(formula.cost_aware_best, d.experiment_id, stamp=d.stamp) if d.sweep_variable == "k" else None
    return f"; its best k is {best[0]} at {best[1]:.2f}×" if best else ""


def served_mark(runs: pd.DataFrame, verdict: dict, sweep_variable: str) -> tuple[float | None, str | None]:
    """Where the speedup chart marks the verdict's choice, and its label: the served run's k (a k sweep) or
    sweep_value (a draft or drafter sweep's index; the label names it), k = 0 where a k sweep serves the target
    alone, nothing before there is a verdict (or a sweep of another variable that serves the target alone)."""
    swept = variable(sweep_variable)
    if verdict.get("best") is None:
        return None, None
    chosen = (
        runs[runs["run_id"] == verdict.get("chosen_run_id")]
        if verdict.get("chosen_run_id") is not None
        else runs.iloc[:0]
    )
    if chosen.empty:
        return (0.0, "serve k = 0: the target alone") if swept.name == "k" else (None, None)
    run = chosen.iloc[0]
    x = float(run["k"] if sweep_variable == "k" else run["sweep_value"])
    return x, f"serve {swept.name} = {swept.show(verdict['chosen'])}"


def _rates_charts(d: Detail) -> None:
    """Acceptance and tokens per round against the swept value, side by side."""
    sweep_variable, curve = d.sweep_variable, d.curve
    left, right = st.columns(2)
    with left:
        st.subheader(f"Acceptance vs {sweep_variable}")
        rates = by_swept_value(curve, sweep_variable)[
            list(dict.fromkeys([sweep_variable, "run_id", "alpha", "draft_acceptance_rate"]))
        ]
        chart_with_csv(charts.rates_curve(rates, sweep_variable), rates, "acceptance_curve.csv")
    with right:
        st.subheader(f"Tokens per round vs {sweep_variable}")
        tokens = tokens_frame(curve, sweep_variable)
        chart_with_csv(
            charts.tokens_per_round_curve(
                tokens.drop(columns=["k"]) if sweep_variable != "k" else tokens, sweep_variable
            ),
            tokens,
            "tokens_per_round.csv",
        )


def labelled(runs: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """The runs with each swept value as it reads (a draft or drafter sweep: its name, not the index sweep_value
    stores; engine/config/variables.py's run_value), for the tables."""
    swept = variable(sweep_variable)
    if not swept.categorical:
        return runs
    return runs.assign(sweep_value=swept_values(runs, sweep_variable))  # a head beside causal LMs: with its drafter


def _cost(runs: pd.DataFrame, sweep_variable: str, grid: bool) -> None:
    st.subheader("Cost: c, verify cost and memory")
    names = (["batch_size"] if grid else []) + COST_COLUMNS  # a grid: which batch size each run decoded at
    shown = [c for c in dict.fromkeys(names) if c in runs and not (c == "sweep_value" and sweep_variable == "k")]
    cost = labelled(runs, sweep_variable)[shown]
    table(cost, shown, "cost_table", headers={"sweep_value": sweep_variable})
    csv_download(cost, "cost_and_memory.csv")
    st.caption(
        "c = target step / draft step (single-token forwards); verify_cost = one verify forward over the "
        "round's tokens, in target steps (the formula assumes 1); peak memory as the worker measured it."
    )


def _serving(runs: pd.DataFrame, sweep_variable: str) -> None:
    if "ttft_seconds_p50" in runs and runs["ttft_seconds_p50"].notna().any():
        st.subheader("Serving: throughput and latency at the batch size")
        shown = [c for c in SERVING_COLUMNS if c in runs and not (c == "sweep_value" and sweep_variable == "k")]
        serving = labelled(runs, sweep_variable)[shown]
        table(serving, shown, "serving_table", headers={"sweep_value": sweep_variable})
        csv_download(serving, "serving.csv")
        st.caption(
            "tokens/s over the batch; TTFT, inter-token (ITL) and per-request latency at p50 and p95 over "
            "requests. A speculative round's tokens arrive together, so its ITL p50 can be 0 while p95 shows "
            "the stall between rounds a streaming user feels (docs/metrics.md, Serving metrics)."
        )


def _predictions(curve: pd.DataFrame, experiment: dict, sweep_variable: str) -> None:
    st.subheader("Predicted against measured")
    predictions = prediction_table(curve, sweep_variable)
    table(predictions, list(predictions.columns), "prediction_table", **ERRORS)
    csv_download(predictions, "predicted_vs_measured.csv")
    k_auto = experiment.get("k_auto")
    if not k_auto:
        return
    if not experiment.get("predicted_curve"):
        st.info(
            f"k auto: k = {k_auto} is measured first; from it and the verify-cost profile every k's speedup is "
            f"predicted, then the best predicted k values are measured to confirm.",
            icon=":material/hourglass:",
        )
        return
    confirmed = auto_k_table(experiment, curve)
    st.markdown(
        f"**k auto**: the teal curve was predicted from k = {k_auto} alone; "
        + (
            f"confirmed at k = {', '.join(str(k) for k in confirmed['k'])}:"
            if len(confirmed)
            else "its best k is the one already measured, so nothing else was timed."
        )
    )
    if len(confirmed):
        table(
            confirmed,
            list(confirmed.columns),
            "auto_k_table",
            predicted=st.column_config.NumberColumn(
                "predicted", format=columns.SPEEDUP, help="the k auto curve's prediction for this k"
            ),
            prediction_error=ERRORS["prediction_error"],
        )
        csv_download(confirmed, "k_auto_confirmation.csv")


def _breakdowns(runs: pd.DataFrame, sweep_variable: str, verdict: dict) -> None:
    speculative = runs[runs["kind"] == "speculative"]
    if speculative.empty:
        return
    ids = [int(i) for i in speculative["run_id"]]
    best = best_run(speculative, verdict)
    default = int(best["run_id"]) if best is not None else None
    run_id = select_id(
        "Run (the best one unless chosen)", "run", ids, run_label(runs, sweep_variable), default=default
    )  # a grid's labels name each run's batch size
    if run_id is None:
        return
    stamp = run_stamp(runs, run_id)  # a finished run's breakdowns are read once, not on every refresh
    breakdowns = (
        (
            "Conditional acceptance by draft position",
            "acceptance_by_position",
            charts.acceptance_by_position,
            "No rounds recorded yet.",
        ),
        ("Acceptance by token type", "acceptance_by_type", charts.acceptance_by_type, "No verified tokens yet."),
    )
    for column, (title, name, chart, empty) in zip(st.columns(2), breakdowns):
        with column:
            st.subheader(title)
            frame = cached(name, run_id, stamp=stamp)
            if frame.empty:
                st.caption(empty)
            else:
                chart_with_csv(chart(frame), frame, f"run{run_id}_{name}.csv")
                st.caption(charts.SMALL_SAMPLE_NOTE)
    render_tree(runs, run_id, stamp)  # a token tree's acceptance by depth and sibling rank
    render_block(runs, run_id, stamp)  # a block run: what it accepted that the standard rule rejected, per position
    # One above the other, each the page's width: side by side, both tables' last columns were cut off.
    with st.container():
        st.subheader("Top rejected tokens")
        rejected = cached("top_rejected_tokens", run_id, limit=20, stamp=stamp)
        shown = rejected.assign(token=rejected["text"].map(lambda t: repr(t)[1:-1] if isinstance(t, str) else t))
        table(shown, ["token", *[c for c in rejected if c not in ("token", "text")]], "rejected_table")
        csv_download(rejected, f"run{run_id}_top_rejected_tokens.csv")
    with st.container():
        st.subheader("Per prompt")
        per_prompt = cached("per_prompt", run_id, stamp=stamp)
        table(
            per_prompt,
            list(per_prompt.columns),
            "per_prompt_table",
            prompt=st.column_config.TextColumn("prompt", width="medium"),
        )
        csv_download(per_prompt, f"run{run_id}_per_prompt.csv")
        st.page_link(
            nav_page("rounds"),
            label="Explore this run's rounds",
            icon=":material/token:",
            query_params={"experiment": st.query_params.get("experiment", ""), "run": str(run_id)},
        )


@dataclass
class Detail:
    """What every section of one experiment's page reads (each query cached until its runs change)."""

    experiment_id: int
    stamp: tuple
    experiment: dict
    row: pd.Series
    runs: pd.DataFrame
    verdict: dict
    schedule: dict | None  # a grid's k schedule (storage/analysis/schedule.py), None otherwise

    @property
    def sweep_variable(self) -> str:
        return self.row.get("sweep_variable") or "k"

    @property
    def grid(self) -> bool:
        return self.schedule is not None

    @property
    def active(self) -> bool:
        return self.row["status"] in ACTIVE

    @functools.cached_property
    def curve(self) -> pd.DataFrame:
        curve = cached("sweep_curve", self.experiment_id, stamp=self.stamp)
        if self.grid:
            curve = curve.merge(self.runs[["run_id", "batch_size"]], on="run_id", how="left")
        return curve

    @property
    def measured(self) -> bool:
        """Some speculative run has a speedup to draw."""
        return bool("speedup" in self.curve and self.curve["speedup"].notna().any())


def _not_yet() -> None:
    st.info("No speculative run has finished yet; the curves appear as runs complete.", icon=":material/hourglass:")


def _verdict_section(d: Detail) -> None:
    """The answer: the speedup chart (a grid: its k schedule), a validation's result, the findings."""
    if d.schedule is not None:  # a grid
        render_schedule(d.schedule, d.runs, d.sweep_variable, {**d.experiment, "experiment_id": d.experiment_id})
    elif d.measured:
        _speedup_chart(d)
    else:
        _not_yet()
    render_validation(d.experiment, d.verdict)
    if not d.active:  # findings read every draft token: once the runs are done, cached per version
        server = cached(server_verdict, d.experiment_id, stamp=(*d.stamp, *profiles_version(store())))
        render_findings(
            store(), d.experiment_id, cached(findings, d.experiment_id, server, experiment_id=d.experiment_id)
        )


def _rejected_section(d: Detail) -> None:
    """Why drafts are rejected: acceptance and tokens per round against the swept value, then one run's breakdowns
    (by draft position, by token type, the top rejected tokens, per prompt) and how many tokens each round drafted."""
    if not d.measured:
        _not_yet()
    elif d.grid:
        _grid_curves(d.curve, d.sweep_variable)
    else:
        _rates_charts(d)
    _breakdowns(d.runs, d.sweep_variable, d.verdict)
    render_k_distribution(d.runs)


def _predictions_section(d: Detail) -> None:
    if d.measured:
        _predictions(d.curve, d.experiment, d.sweep_variable)
    else:
        _not_yet()
    if not d.active:  # a server prediction reads every run's draft tokens: once the runs are done
        render_server_predicted(
            d.experiment_id, d.runs, d.verdict, d.stamp, d.sweep_variable, run_label(d.runs, d.sweep_variable)
        )
    _cost(d.runs, d.sweep_variable, d.grid)


def _serving_section(d: Detail) -> None:
    """What to carry to a server: a grid's vLLM setting, the serving metrics, the engines' settings, production's
    counters against the lab."""
    if d.schedule is not None:  # a grid
        render_vllm_schedule(d.schedule)
    _serving(d.runs, d.sweep_variable)
    if d.verdict["best"] is not None:
        render_deploy_panel(store(), d.experiment_id, None, expanded=True)
    else:
        st.caption("The settings to carry to a server appear once a speculative run has finished.")
    render_production(d.experiment_id)


def _confirm_section(d: Detail) -> None:
    if d.active:
        st.caption("A confirm serves what the finished runs chose: it can be queued once this experiment is done.")
    else:
        render_confirm(d.experiment_id, d.experiment, q.grid_sizes(d.experiment))
        render_profile(d.experiment_id, d.experiment, q.grid_sizes(d.experiment), run_label(d.runs, d.sweep_variable))


def _runs_section(d: Detail) -> None:
    runs, sweep_variable = d.runs, d.sweep_variable
    st.subheader("Runs", anchor="runs")
    shown = labelled(runs, sweep_variable).assign(
        progress=runs["progress"].fillna(0) * 100, check=np.where(runs["timing_warning"].notna(), IMPOSSIBLE, "")
    )
    names = [c for c in RUN_COLUMNS if not (c == "sweep_value" and sweep_variable == "k")]
    if d.grid:  # which batch size each run decoded at, beside its kind
        names.insert(names.index("kind") + 1, "batch_size")
    table(
        shown,
        names,
        "runs_table",
        headers={"sweep_value": sweep_variable},
        pinned=("check", "run_id", "kind", "batch_size", "k", "sweep_value"),
    )  # which run, while it scrolls
    csv_download(runs, f"experiment{d.experiment_id}_runs.csv")


SECTION_BUILDERS = {
    sections.VERDICT: _verdict_section,
    sections.REJECTED: _rejected_section,
    sections.PREDICTIONS: _predictions_section,
    sections.SERVING: _serving_section,
    sections.CONFIRM: _confirm_section,
    sections.RUNS: _runs_section,
}


def _body(experiment_id: int, listing: pd.DataFrame | None = None) -> None:
    stamp = version(experiment_id)  # every query below is cached until this experiment's runs change
    experiment = cached("experiment", experiment_id, stamp=stamp) or {}
    listing = listing if listing is not None else cached(catalog.experiments)
    row = listing.set_index("experiment_id").loc[experiment_id]
    runs = cached("runs", experiment_id, stamp=stamp)
    verdict = cached(verdict_dict, experiment_id, stamp=stamp)
    grid = q.grid_sizes(experiment) is not None  # a batch × k grid: a schedule, batch sizes never mixed
    schedule = cached(schedule_dict, experiment_id, stamp=stamp) if grid else None
    d = Detail(experiment_id, stamp, experiment, row, runs, verdict, schedule)
    _header(experiment, row, runs, verdict, schedule)
    _server_answer(d)
    for failure in runs[runs["status"] == "failed"].itertuples():
        st.error(f"run {failure.run_id} ({failure.kind}) failed: {failure.error}", icon=":material/error:")
    _warnings(runs, d.sweep_variable)
    # Only the open section is built (and so queried and drawn): the answer first, the rest one click away.
    for name, tab in zip(sections.ORDER, sections.tabs()):
        if tab.open:
            with tab:
                SECTION_BUILDERS[name](d)


def render() -> None:
    st.title("Experiment detail")
    listing = cached(catalog.experiments)
    if listing.empty:
        empty_state("No experiments yet.")
        return
    ids = [int(i) for i in listing["experiment_id"]]
    experiment_id = select_id("Experiment", "experiment", ids, experiment_label(listing))
    status = listing.set_index("experiment_id").loc[experiment_id, "status"]
    active = status in ACTIVE
    if active:
        st.caption(f"Refreshing every {REFRESH_SECONDS:g} s while this experiment runs.")
    st.fragment(run_every=REFRESH_SECONDS if active else None)(_live)(experiment_id, active)


def _live(experiment_id: int, was_active: bool) -> None:
    listing = cached(catalog.experiments)  # cached per version: the 2 s refresh re-reads only what a commit changed
    if was_active:
        status = listing.set_index("experiment_id").loc[experiment_id, "status"]
        if status not in ACTIVE:
            st.rerun()  # finished: one full redraw, and the timer goes away
    _body(experiment_id, listing)
