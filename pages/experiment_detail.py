"""Experiment detail: the speedup curve against the formula, and why drafts were rejected."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from engine import theory
from pages import charts
from pages.common import (chart_with_csv, csv_download, empty_state, experiment_label, nav_page, number, run_label,
                          select_id, store)
from storage import queries as q

ACTIVE = ("queued", "running")
REFRESH_SECONDS = 2.0
RUN_COLUMNS = ["run_id", "kind", "k", "sweep_value", "status", "progress", "new_tokens", "wall_seconds",
               "tokens_per_second", "speedup", "predicted_speedup", "alpha", "draft_acceptance_rate",
               "tokens_per_round", "expected_alpha", "kl", "outputs_match_baseline", "error"]
COST_COLUMNS = ["run_id", "kind", "k", "sweep_value", "c", "peak_memory_mb", "target_step_seconds",
                "draft_step_seconds", "tokens_per_second", "wall_seconds"]


def pooled_prediction_inputs(runs: pd.DataFrame) -> tuple[float, float] | None:
    """(α, c) over the finished speculative runs: α = Σaccepted / Σ(accepted + rejected), c their mean."""
    done = runs[(runs["kind"] == "speculative") & runs["accepted"].notna() & runs["c"].notna()]
    verified = done["accepted"].sum() + done["rejected"].sum()
    if done.empty or verified == 0:
        return None
    return float(done["accepted"].sum() / verified), float(done["c"].mean())


def by_swept_value(curve: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """The sweep curve with its swept value in a column named after the variable (`k`, `temperature`, ...)."""
    if sweep_variable == "k":
        return curve.drop(columns=["sweep_value"]).assign(k=lambda f: f["k"].astype(int))
    return curve.rename(columns={"sweep_value": sweep_variable})


def speedup_frame(curve: pd.DataFrame, sweep_variable: str, prediction: tuple[float, float] | None) -> pd.DataFrame:
    """Measured speedup per swept value and the formula's prediction; the frame the speedup chart draws."""
    measured = by_swept_value(curve, sweep_variable).rename(columns={"predicted_speedup": "predicted_speedup_run"})
    measured = measured[[c for c in (sweep_variable, "run_id", "speedup", "predicted_speedup_run") if c in measured]]
    if sweep_variable != "k":
        return measured.assign(predicted_speedup=measured["predicted_speedup_run"])
    if prediction is None:
        return measured.assign(predicted_speedup=np.nan)
    alpha, c = prediction
    k_max = int(max(8, measured["k"].max() if len(measured) else 0, theory.best_k(alpha, c)[0] + 1))
    formula = pd.DataFrame({"k": range(1, k_max + 1)})
    formula["predicted_speedup"] = [theory.predicted_speedup(alpha, k, c) for k in formula["k"]]
    return formula.merge(measured, on="k", how="outer").sort_values("k").reset_index(drop=True)


def tokens_frame(curve: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """Measured tokens_per_round per run next to the formula's (1 − α^(k+1)) / (1 − α) at that run's α and k."""
    frame = by_swept_value(curve, sweep_variable)[
        list(dict.fromkeys([sweep_variable, "k", "run_id", "alpha", "tokens_per_round"]))].copy()
    frame["expected_tokens_per_round"] = [
        theory.expected_tokens_per_round(a, int(k)) if pd.notna(a) and pd.notna(k) else np.nan
        for a, k in zip(frame["alpha"], frame["k"])]
    return frame


def _short(prompts) -> str:
    """A built-in set as is; an uploaded or local file by its name (the full path is in the CSV/exports)."""
    text = str(prompts)
    return Path(text).name if "/" in text or "\\" in text else text


def _header(experiment: dict, row: pd.Series, runs: pd.DataFrame) -> None:
    sampling = experiment.get("sampling") or {}
    st.caption(" · ".join(filter(None, [
        f"**{experiment.get('draft')}** drafting for **{experiment.get('target')}**",
        f"prompts `{_short(experiment.get('prompts'))}`",
        ", ".join(f"{k}={v}" for k, v in sampling.items()) if isinstance(sampling, dict) else str(sampling),
        f"device {experiment.get('device', 'auto')}/{experiment.get('dtype', 'auto')}",
        f"tags: {row.get('tags')}" if row.get("tags") else "",
    ])))
    if experiment.get("notes"):
        st.markdown(f"> {experiment['notes']}")
    baseline = runs[runs["kind"] == "baseline"]
    sweep_variable = row.get("sweep_variable") or "k"
    cols = st.columns(5)
    progress = row["progress"] if pd.notna(row["progress"]) else 0.0
    cols[0].metric("Status", str(row["status"]) if row["status"] not in ACTIVE else f"{row['status']} {progress:.0%}")
    cols[1].metric(f"Best {sweep_variable}", number(row["best_value"], "{:g}"))
    cols[2].metric("Best speedup", number(row["best_speedup"], "{:.2f}×"))
    cols[3].metric("alpha (best run)", number(row["alpha"]))
    cols[4].metric("Baseline tokens/s", number(baseline["tokens_per_second"].iloc[0] if len(baseline) else None,
                                               "{:.1f}"))


def _sweep(curve: pd.DataFrame, runs: pd.DataFrame, sweep_variable: str, best_value) -> None:
    prediction = pooled_prediction_inputs(runs) if sweep_variable == "k" else None
    left, right = st.columns(2)
    with left:
        st.subheader(f"Speedup vs {sweep_variable}")
        frame = speedup_frame(curve, sweep_variable, prediction)
        best = float(best_value) if best_value is not None and pd.notna(best_value) else None
        chart_with_csv(charts.speedup_curve(frame, sweep_variable, best), frame, "speedup_curve.csv")
        if prediction:
            alpha, c = prediction
            k_best, s_best = theory.best_k(alpha, c)
            st.caption(f"Dashed: (1 − α^(k+1)) / ((1 − α)(1 + k/c)) with α = {alpha:.3f} (pooled over the runs) and "
                       f"c = {c:.2f} (mean); the formula's best k is {k_best} at {s_best:.2f}×.")
    with right:
        st.subheader(f"Acceptance vs {sweep_variable}")
        rates = by_swept_value(curve, sweep_variable)[
            list(dict.fromkeys([sweep_variable, "run_id", "alpha", "draft_acceptance_rate"]))]
        chart_with_csv(charts.rates_curve(rates, sweep_variable), rates, "acceptance_curve.csv")
    left, right = st.columns(2)
    with left:
        st.subheader(f"Tokens per round vs {sweep_variable}")
        tokens = tokens_frame(curve, sweep_variable)
        chart_with_csv(charts.tokens_per_round_curve(tokens.drop(columns=["k"]) if sweep_variable != "k" else tokens,
                                                     sweep_variable), tokens, "tokens_per_round.csv")
    with right:
        st.subheader("Cost: c and memory")
        columns = [c for c in COST_COLUMNS if c in runs and not (c == "sweep_value" and sweep_variable == "k")]
        cost = runs[columns]
        st.dataframe(cost, hide_index=True, width="stretch", key="cost_table", column_config={
            "c": st.column_config.NumberColumn(format="%.2f"),
            "peak_memory_mb": st.column_config.NumberColumn("peak memory (MB)", format="%.0f"),
            "target_step_seconds": st.column_config.NumberColumn(format="%.5f"),
            "draft_step_seconds": st.column_config.NumberColumn(format="%.5f")})
        csv_download(cost, "cost_and_memory.csv")
        st.caption("c = target step / draft step (single-token forwards); peak memory as the worker measured it.")


def _breakdowns(runs: pd.DataFrame, sweep_variable: str, best_value) -> None:
    speculative = runs[runs["kind"] == "speculative"]
    if speculative.empty:
        return
    st.header("Why drafts are rejected")
    ids = [int(i) for i in speculative["run_id"]]
    best_runs = speculative[speculative["sweep_value"] == best_value]["run_id"] if best_value is not None else []
    default = int(best_runs.iloc[0]) if len(best_runs) else None
    run_id = select_id("Run (the best one unless chosen)", "run", ids, run_label(runs, sweep_variable), default=default)
    breakdowns = (
        ("Conditional acceptance by draft position", q.acceptance_by_position, charts.acceptance_by_position,
         "acceptance_by_position", "No rounds recorded yet."),
        ("Acceptance by token type", q.acceptance_by_type, charts.acceptance_by_type,
         "acceptance_by_type", "No verified tokens yet."),
    )
    for column, (title, query, chart, name, empty) in zip(st.columns(2), breakdowns):
        with column:
            st.subheader(title)
            frame = query(store(), run_id)
            if frame.empty:
                st.caption(empty)
            else:
                chart_with_csv(chart(frame), frame, f"run{run_id}_{name}.csv")
    left, right = st.columns([2, 3])
    with left:
        st.subheader("Top rejected tokens")
        rejected = q.top_rejected_tokens(store(), run_id, limit=20)
        shown = rejected.assign(token=rejected["text"].map(lambda t: repr(t)[1:-1] if isinstance(t, str) else t))
        st.dataframe(shown[["token", *[c for c in rejected if c not in ("token", "text")]]], hide_index=True,
                     width="stretch", key="rejected_table",
                     column_config={"rejection_rate": st.column_config.NumberColumn(format="%.3f")})
        csv_download(rejected, f"run{run_id}_top_rejected_tokens.csv")
    with right:
        st.subheader("Per prompt")
        per_prompt = q.per_prompt(store(), run_id)
        st.dataframe(per_prompt, hide_index=True, width="stretch", key="per_prompt_table",
                     column_config={"prompt": st.column_config.TextColumn(width="medium"),
                                    "alpha": st.column_config.NumberColumn(format="%.3f"),
                                    "tokens_per_round": st.column_config.NumberColumn(format="%.2f"),
                                    "tokens_per_second": st.column_config.NumberColumn(format="%.1f")})
        csv_download(per_prompt, f"run{run_id}_per_prompt.csv")
        st.page_link(nav_page("rounds"), label="Explore this run's rounds", icon=":material/token:",
                     query_params={"experiment": st.query_params.get("experiment", ""), "run": str(run_id)})


def _body(experiment_id: int) -> None:
    experiment = q.experiment(store(), experiment_id) or {}
    listing = q.experiments(store())
    row = listing.set_index("experiment_id").loc[experiment_id]
    runs = q.runs(store(), experiment_id)
    sweep_variable = row.get("sweep_variable") or "k"
    _header(experiment, row, runs)
    failed = runs[runs["status"] == "failed"]
    for failure in failed.itertuples():
        st.error(f"run {failure.run_id} ({failure.kind}) failed: {failure.error}", icon=":material/error:")
    with st.expander("Runs", expanded=row["status"] in ACTIVE):
        table = runs[[c for c in RUN_COLUMNS if c in runs]].assign(progress=lambda f: f["progress"].fillna(0) * 100)
        st.dataframe(table, hide_index=True, width="stretch", key="runs_table", column_config={
            "progress": st.column_config.ProgressColumn(min_value=0, max_value=100, format="%.0f%%")})
        csv_download(runs, f"experiment{experiment_id}_runs.csv")
    curve = q.sweep_curve(store(), experiment_id)
    if curve["speedup"].notna().any() if "speedup" in curve else False:
        _sweep(curve, runs, sweep_variable, row["best_value"])
    else:
        st.info("No speculative run has finished yet; the curves appear as runs complete.", icon=":material/hourglass:")
    best = row["best_value"] if pd.notna(row["best_value"]) else None
    _breakdowns(runs, sweep_variable, best)


def render() -> None:
    st.title("Experiment detail")
    listing = q.experiments(store())
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
    if was_active:
        status = q.experiments(store()).set_index("experiment_id").loc[experiment_id, "status"]
        if status not in ACTIVE:
            st.rerun()  # finished: one full redraw, and the timer goes away
    _body(experiment_id)

