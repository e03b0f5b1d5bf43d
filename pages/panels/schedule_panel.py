"""A grid experiment's k schedule on the detail page (`--batch-size 1,4,16 --k 1,2,3,4`): what to serve at each
batch size (storage/analysis/schedule.py: the one verdict rule per batch size, k = 0 where no k is measurably faster),
as a chart (speedup vs k, one line per batch size), a table (the served k with its interval, its ties, throughput
and latency) and vLLM's num_speculative_tokens_per_batch_size. Reads storage's schedule and runs, draws with
pages/widgets/charts/ (speedup.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import streamlit as st

from engine.config.variables import variable
from pages.panels.advice import browser_advice
from pages.widgets import charts
from pages.widgets.common import chart_with_csv, csv_download, table
from pages.widgets.prefill import md_text
from storage.records import columns
from storage.records import queries as q

# The table: what each batch size serves and what that costs a user (the chosen run's figures; where speculation
# is off, the target alone's, which is then what is served).
TABLE_COLUMNS = [
    "batch_size",
    "serve",
    "speedup_interval",
    "tied_with",
    "verdict",
    "baseline_tokens_per_second",
    "tokens_per_second",
    "ttft_seconds_p50",
    "itl_seconds_p95",
    "request_latency_seconds_p95",
]


def batch_name(size) -> str:
    return f"batch {int(size)}"


def x_of(runs: pd.DataFrame, sweep_variable: str) -> pd.Series:
    """Each run's swept value as the chart places it: k for a k grid, the name for a draft or drafter grid, else
    the number."""
    if sweep_variable == "k":
        return runs["k"].astype(float)
    if variable(sweep_variable).categorical:
        return runs["sweep_label"].astype(str)
    return runs["sweep_value"].astype(float)


def curve_frame(runs: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """The chart's points: every speculative run at its batch size (x = its swept value, named after the
    variable), with its measured speedup, 95 % interval and state; batch sizes never mixed (`batch`)."""
    spec = runs[runs["kind"] == "speculative"]
    frame = pd.DataFrame(
        {
            "batch_size": spec["batch_size"].astype(int),
            "batch": spec["batch_size"].map(batch_name),
            sweep_variable: x_of(spec, sweep_variable),
            "run_id": spec["run_id"].astype(int),
            "speedup": spec["speedup"].astype(float),
            "speedup_ci_lo": spec["speedup_ci_lo"].astype(float),
            "speedup_ci_hi": spec["speedup_ci_hi"].astype(float),
            "state": charts.run_states(spec),
        }
    )
    return frame.sort_values(["batch_size", sweep_variable, "run_id"]).reset_index(drop=True)


def served_frame(schedule: dict, runs: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """What each batch size serves, as the chart marks it: the chosen run's value and speedup, or, where
    the target alone is served (a k grid), k = 0 at 1× with a label in words. Batch sizes with
    nothing finished are left out."""
    swept = variable(sweep_variable)
    chosen = runs.set_index("run_id")
    rows = []
    for step in schedule["steps"]:
        size = int(step["batch_size"])
        if step["off"] and sweep_variable == "k":
            why = "speculation loses" if step["loses"] else "no k measurably faster"
            rows.append(
                {
                    "batch_size": size,
                    "batch": batch_name(size),
                    sweep_variable: 0.0,
                    "speedup": 1.0,
                    "mark": charts.SCHEDULE_OFF,
                    "label": f"{batch_name(size)}: off (k = 0)",
                    "why": f"{why} at {batch_name(size)}: best {_interval(step)}",
                }
            )
        elif not step["off"] and step["run_id"] is not None and step["run_id"] in chosen.index:
            run = chosen.loc[step["run_id"]]
            x = x_of(chosen.loc[[step["run_id"]]], sweep_variable).iloc[0]
            rows.append(
                {
                    "batch_size": size,
                    "batch": batch_name(size),
                    sweep_variable: x,
                    "speedup": float(step["speedup"]),
                    "mark": charts.SCHEDULE_SERVE,
                    "label": f"{batch_name(size)}: serve {swept.name} = {swept.show(swept.run_value(run))}",
                    "why": f"{'faster' if step['gains'] else 'not measurably faster'}: {_interval(step)}",
                }
            )
    frame = pd.DataFrame(rows, columns=["batch_size", "batch", sweep_variable, "speedup", "mark", "label", "why"])
    off = frame["mark"] == charts.SCHEDULE_OFF
    frame["label_y"] = frame["speedup"].astype(float)
    # Every off batch size's cross sits at (0, 1×): one caption names them all (stacked captions overlapped).
    frame["caption"] = frame["label"]
    if int(off.sum()) > 1:
        names = ", ".join(frame.loc[off, "batch"])
        frame.loc[off, "caption"] = ""
        frame.loc[frame.index[off][0], "caption"] = f"off (k = 0): {names}"
    return frame


def predicted_frame(experiment: dict) -> pd.DataFrame:
    """`--k auto` at several batch sizes: each batch size's predicted curve (k, predicted_speedup); empty
    otherwise."""
    rows = [
        {"batch_size": size, "batch": batch_name(size), "k": float(k), "predicted_speedup": speedup}
        for size, (curve, _) in sorted(q.predicted_curves(experiment).items())
        for k, speedup in sorted(curve.items())
    ]
    return pd.DataFrame(rows, columns=["batch_size", "batch", "k", "predicted_speedup"])


def schedule_table(schedule: dict, runs: pd.DataFrame, sweep_variable: str) -> pd.DataFrame:
    """One row per batch size: what to serve (the value, `off (k = 0)` where the target alone is served, `—`
    before anything finished), its speedup with the 95 % interval (the best's where off), the values tied with the
    best, the verdict in a word, the baseline's tokens/s at that batch size, and the served configuration's
    tokens/s, TTFT p50, ITL p95 and latency p95 (the target alone's where off)."""
    swept = variable(sweep_variable)
    by_id = runs.set_index("run_id")
    baselines = runs[runs["kind"] == "baseline"]
    rows = []
    for step in schedule["steps"]:
        size = int(step["batch_size"])
        run = by_id.loc[step["run_id"]] if step["run_id"] is not None and step["run_id"] in by_id.index else None
        at_size = baselines[baselines["batch_size"] == size]
        if run is not None and pd.notna(run["baseline_run_id"]) and int(run["baseline_run_id"]) in by_id.index:
            base = by_id.loc[int(run["baseline_run_id"])]
        else:
            base = at_size.set_index("run_id").iloc[0] if len(at_size) else None
        if step["off"]:
            serve = "off (k = 0)" if sweep_variable == "k" else "off"
            verdict = (
                "speculation loses: switch it off"
                if step["loses"]
                else "not measurably faster: the target alone is tied and cheaper"
            )
        elif run is not None:
            serve = swept.show(swept.run_value(run))
            verdict = "faster" + (" (interval too wide)" if step["too_wide"] else "")
        else:
            serve, verdict = columns.MISSING, "nothing finished yet"
        served = base if step["off"] else run  # what is served: the target alone where speculation is off
        figure = lambda name, row=served: float(row[name]) if row is not None and pd.notna(row.get(name)) else np.nan  # noqa: E731
        ci = step["speedup_ci"] or [None, None]
        rows.append(
            {
                "batch_size": size,
                "serve": serve,
                "k": step["k"],
                "speedup": step["speedup"],
                "speedup_ci_lo": ci[0],
                "speedup_ci_hi": ci[1],
                "speedup_interval": charts.speedup_text(step["speedup"], *ci),
                "tied_with": tie_text(step, swept, None if step["off"] else step["value"]),
                "verdict": verdict,
                "baseline_tokens_per_second": float(base["tokens_per_second"])
                if base is not None and pd.notna(base["tokens_per_second"])
                else np.nan,
                "tokens_per_second": figure("tokens_per_second"),
                "ttft_seconds_p50": figure("ttft_seconds_p50"),
                "itl_seconds_p95": figure("itl_seconds_p95"),
                "request_latency_seconds_p95": figure("request_latency_seconds_p95"),
                "text": step["text"],
            }
        )
    frame = pd.DataFrame(
        rows,
        columns=[
            "batch_size",
            "serve",
            "k",
            "speedup",
            "speedup_ci_lo",
            "speedup_ci_hi",
            "speedup_interval",
            "tied_with",
            "verdict",
            "baseline_tokens_per_second",
            "tokens_per_second",
            "ttft_seconds_p50",
            "itl_seconds_p95",
            "request_latency_seconds_p95",
            "text",
        ],
    )
    return frame.assign(k=frame["k"].astype("Int64"))


def tie_text(step: dict, swept, served) -> str:
    """The values statistically tied at this batch size (the best and those whose interval overlaps it), but the
    one served: `4`; `2 (best)` when the cheaper tied value is served instead of the best; `—` with no tie."""
    group = ([step["best"]] if step["best"] is not None else []) + list(step["tied_with"])
    if len(group) < 2:
        return columns.MISSING
    return ", ".join(swept.show(v) + (" (best)" if v == step["best"] else "") for v in group if v != served)


def _interval(step: dict) -> str:
    return charts.speedup_text(step["speedup"], *(step["speedup_ci"] or [None, None]))


def headline(schedule: dict) -> None:
    """The schedule's sentence where a single sweep shows its verdict, titled by the sentence's own name ("k
    schedule"), in the verdict's blue box; in a yellow ⚠ box only when a batch size's best interval is too wide to
    choose by, and then its title says which."""
    title, _, rest = browser_advice(str(schedule["text"])).partition(": ")
    if not rest:
        title, rest = "Schedule", str(schedule["text"])
    wide = [batch_name(s["batch_size"]) for s in schedule["steps"] if s["too_wide"]]
    if wide:
        st.warning(
            f"**{md_text(title)}, too wide to choose by at {', '.join(wide)}:** {md_text(rest)}.",
            icon=":material/warning:",
        )
    else:
        st.info(f"**{md_text(title)}:** {md_text(rest)}.", icon=":material/gavel:")


def render_schedule(schedule: dict, runs: pd.DataFrame, sweep_variable: str, experiment: dict) -> None:
    """The k schedule: chart, table and each batch size's verdict (vLLM's setting: render_vllm_schedule)."""
    swept = variable(sweep_variable)
    st.header(
        "k schedule" if sweep_variable == "k" else f"Best {swept.name} per batch size", anchor="k-schedule"
    )  # where the schedule findings link (pages/panels/findings_panel.py)
    experiment_id = int(experiment["experiment_id"])
    points = curve_frame(runs, sweep_variable)
    served = served_frame(schedule, runs, sweep_variable)
    predicted = predicted_frame(experiment) if sweep_variable == "k" else None
    if points["speedup"].notna().any():
        title = "k (draft tokens per round; 0 = speculation off)" if sweep_variable == "k" else swept.name
        chart = charts.schedule_curve(
            points, served, sweep_variable, title, nominal=swept.categorical, predicted=predicted
        )
        st.subheader(f"Speedup vs {swept.name} at each batch size")
        chart_with_csv(chart, points, f"experiment{experiment_id}_schedule_curve.csv")
        if predicted is not None and len(predicted):
            csv_download(predicted, f"experiment{experiment_id}_k_auto_curves.csv", "Download the predicted curves")
            st.caption(
                "Dashed: k auto's predicted curve at each batch size (from its k_max run there and that batch "
                "size's verify profile); the measured confirmations are the points."
            )
        st.caption(
            "One line per batch size, each against its own target-only baseline at that batch size; points "
            "with 95 % intervals (paired bootstrap, batches as the resampling unit when rows share a "
            "forward), hollow while unfinished. Diamonds: what each batch size serves; a cross at k = 0, 1×: "
            "serve the target alone there (speculation measurably loses, or no k is measurably faster: "
            "the target alone is then tied with the best and cheaper). Dashed: 1×, the target alone."
        )
    else:
        st.info(
            "No run of the grid has a speedup yet; the schedule appears as batch sizes finish.",
            icon=":material/hourglass:",
        )
    shown = schedule_table(schedule, runs, sweep_variable)
    table(
        shown,
        TABLE_COLUMNS,
        "schedule_table",
        serve=st.column_config.TextColumn(
            f"{swept.name} to serve",
            help="the cheapest configuration tied with "
            "this batch size's best that is measurably faster than the target "
            "alone; off: none is (speculation loses, or no gain is measurable)",
        ),
        speedup_interval=st.column_config.TextColumn(
            "speedup (95 %)", help="the served run's measured speedup with its 95 % interval; where off, the best run's"
        ),
        tied_with=st.column_config.TextColumn(
            "tied",
            help="the other values statistically tied at this batch "
            "size: the best and those whose 95 % interval overlaps the best's",
        ),
        verdict=st.column_config.TextColumn("verdict"),
        baseline_tokens_per_second=st.column_config.NumberColumn(
            "baseline tokens/s", format="%.1f", help="the target alone at this batch size, over the batch"
        ),
        tokens_per_second=st.column_config.NumberColumn(
            "served tokens/s", format="%.1f", help="the served configuration (the target alone where off)"
        ),
    )
    csv_download(shown, f"experiment{experiment_id}_schedule.csv")
    st.caption(
        "TTFT p50, ITL p95 and latency p95 are the served configuration's (the target alone where "
        "speculation is off), over requests (docs/metrics.md, Serving metrics)."
    )
    for step in schedule["steps"]:
        st.markdown(f"- {md_text(browser_advice(step['text']))}")


def render_vllm_schedule(schedule: dict) -> None:
    """The schedule as vLLM's setting (the Serving section; the schedule itself is the Verdict's)."""
    ranges = schedule.get("num_speculative_tokens_per_batch_size")
    if ranges:
        st.subheader("k schedule in vLLM")
        st.markdown(
            "vLLM: `num_speculative_tokens_per_batch_size` (entries [start_bs, end_bs, k], k = 0: no "
            "drafts; the last entry's k holds above its end)"
        )
        st.code(json.dumps(ranges), language="json")
