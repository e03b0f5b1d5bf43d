"""Compare: experiments side by side (overlaid sweep curves) and runs side by side (metrics and breakdowns)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.config.variables import variable
from engine.text.prompt_sets import set_name
from pages.panels.server_predicted_panel import predictions
from pages.widgets import charts
from pages.widgets.common import (
    cached,
    chart_with_csv,
    csv_download,
    draw,
    empty_state,
    experiment_label,
    run_label,
    select_ids,
    show,
    swept_values,
    version,
)
from pages.widgets.common import table as show_table
from pages.widgets.prefill import md_text
from storage.analysis import catalog
from storage.analysis.verdict import verdict_dict
from storage.records import queries as q
from storage.records.columns import COLUMNS

EXPERIMENT_COLUMNS = [
    "experiment_id",
    "name",
    "badges",
    "status",
    "sweep_variable",
    "best_label",
    "best",
    "n_tied",
    "timing_warnings",
    "alpha",
    "repeats",
    "target",
    "draft",
    "prompts",
    "tags",
]
RUN_METRICS = [
    "kind",
    "k",
    "sweep_value",
    "status",
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
    "rounds",
    "proposed",
    "accepted",
    "rejected",
    "c",
    "verify_cost",
    "draft_step_seconds",
    "target_step_seconds",
    "peak_memory_mb",
    "outputs_match_baseline",
    "speedup_note",
    "timing_warning",
]
INTERVAL = {"lo": "speedup_ci_lo", "hi": "speedup_ci_hi"}  # the speedup chart's error bars
SERVER_ROWS = ("predicted in the server (95 %)", "server cost profile")  # the runs table's rows below the metrics


def server_cells(doc: dict | None, k) -> dict:
    """A run's predicted server speedup for the runs table (storage/serving/run_predictions.py): at the smallest
    concurrency profiled and the run's own k (the deepest k predicted where the profile stops short of it), with its
    95 % interval, and the profile's label; where no profile fits, no figure and why not."""
    if not doc or not doc.get("profile"):
        reason = (doc or {}).get("reason") or "not predicted"
        return {
            "server_speedup": None,
            "server_lo": None,
            "server_hi": None,
            "server_concurrency": None,
            "server_k": None,
            "server_profile": f"none: {reason}",
        }
    c = min(doc["concurrency"], key=int)
    by_k = doc["concurrency"][c]
    at = str(int(k)) if pd.notna(k) and str(int(k)) in by_k else max(by_k, key=int)
    cell = by_k[at]
    return {
        "server_speedup": cell["speedup"],
        "server_lo": cell["speedup_ci"][0],
        "server_hi": cell["speedup_ci"][1],
        "server_concurrency": int(c),
        "server_k": int(at),
        "server_profile": doc["profile"]["label"],
    }


def server_text(cells: dict) -> str:
    """`1.42× (1.30–1.55) at k=3, concurrency 1`, or `—` where no profile fits."""
    if cells["server_speedup"] is None or pd.isna(cells["server_speedup"]):
        return "—"
    speedup = charts.speedup_text(cells["server_speedup"], cells["server_lo"], cells["server_hi"])
    return f"{speedup} at k={int(cells['server_k'])}, concurrency {int(cells['server_concurrency'])}"


def _show(value) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def badges(experiment_id: int, verdict: dict, links: pd.DataFrame) -> str:
    """The table's badges: `≈ tied with 2, 4` (the verdict's ties), `✔ validates #3` (a validation experiment),
    `✔ validated by #7` (a tuning experiment a validation experiment links to)."""
    out = []
    if verdict.get("tied_with"):
        out.append("≈ tied with " + ", ".join(_show(v) for v in verdict["tied_with"]))
    validates = links.loc[links["experiment_id"] == experiment_id, "validates"]
    if len(validates):
        out.append(f"✔ validates #{int(validates.iloc[0])}")
    by = links.loc[links["validates"] == experiment_id, "experiment_id"]
    if len(by):
        out.append("✔ validated by " + ", ".join(f"#{int(i)}" for i in by))
    return " · ".join(out)


def swept_variables(listing: pd.DataFrame) -> dict[int, str | None]:
    """{experiment id: the variable it sweeps} (None: k, as experiments stored before sweeps had a variable)."""
    return {
        int(i): v if isinstance(v, str) and v else None
        for i, v in zip(listing["experiment_id"], listing["sweep_variable"])
    }


def _experiments(listing: pd.DataFrame, chosen: list[int]) -> dict[int, pd.DataFrame]:
    label = experiment_label(listing)
    names = dict(zip(listing["experiment_id"], listing["name"]))

    def short_label(experiment_id: int) -> str:  # a line's end label: `#3 · name`, without the status
        return f"#{experiment_id} · {names.get(experiment_id) or 'unnamed'}"

    table = listing[listing["experiment_id"].isin(chosen)]
    links = cached("validation_links")
    stamps = {experiment_id: version(experiment_id) for experiment_id in chosen}
    verdicts = {
        int(i): cached(verdict_dict, int(i), experiment_id=int(i), stamp=stamps[int(i)]) for i in table["experiment_id"]
    }
    table = table.assign(
        best=[
            charts.speedup_text(s, lo, hi)
            for s, lo, hi in zip(table["best_speedup"], table["best_ci_lo"], table["best_ci_hi"])
        ],
        badges=[badges(int(i), verdicts[int(i)], links) for i in table["experiment_id"]],
        prompts=[set_name(p) for p in table["prompts"]],
    )  # never an upload's server path
    table = table[[c for c in EXPERIMENT_COLUMNS if c in table]]
    show_table(
        table,
        EXPERIMENT_COLUMNS,
        "compare_experiments_table",
        best=st.column_config.TextColumn(
            "best speedup (95 % interval)", help="measured, with its 95 % interval (paired bootstrap over prompts)"
        ),
        badges=st.column_config.TextColumn(
            "ties · validation",
            help="≈ values statistically tied with the best (overlapping 95 % "
            "intervals); ✔ a validation experiment and the one it validates",
        ),
    )
    csv_download(table, "compare_experiments.csv")
    curves, runs_by_experiment = [], {}
    rows = listing.set_index("experiment_id")
    sweeps = swept_variables(listing)
    for experiment_id in chosen:
        runs = runs_by_experiment[experiment_id] = cached(
            "runs", experiment_id, experiment_id=experiment_id, stamp=stamps[experiment_id]
        )
        curve = cached("sweep_curve", experiment_id, experiment_id=experiment_id, stamp=stamps[experiment_id])
        at = ""
        if experiment_id in rows.index and q.grid_sizes(rows.loc[experiment_id].to_dict()) is not None:
            # a batch × k grid: one line per batch size, never one line through every batch size
            sizes = curve["run_id"].map(dict(zip(runs["run_id"], runs["batch_size"])))
            at = " · batch " + sizes.astype(int).astype(str)
        swept = variable(sweeps.get(experiment_id))
        named = dict(zip(runs["run_id"].astype(int), swept_values(runs, swept.name))) if swept.categorical else {}
        curves.append(
            curve.assign(
                experiment=label(experiment_id) + at,
                experiment_id=experiment_id,
                experiment_name=short_label(experiment_id) + at,
                line_label=f"#{experiment_id}" + at,  # the legend below names it in full
                sweep_variable=swept.name,
                sweep_label=curve["run_id"].map(named),
            )
        )
    curve = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame()
    if curve.empty or curve["speedup"].isna().all():
        st.info("None of these experiments has a finished speculative run yet.")
        return runs_by_experiment
    curve["state"] = charts.run_states(curve)
    for name in dict.fromkeys(curve["sweep_variable"]):  # each variable on its own axis, in the order chosen
        _sweep_charts(curve[curve["sweep_variable"] == name], variable(name))
    return runs_by_experiment


def _sweep_charts(curve: pd.DataFrame, swept) -> None:
    """The experiments sweeping one variable: speedup, alpha and tokens per round against its values, on an axis
    of its own (a draft sweep's 0 and 1 are indices, never k = 0 and 1); a draft or drafter sweep by name, one
    category per name."""
    x_title = swept.said(form=True)  # k, temperature, top-k, draft, drafter: the variable's own words
    st.subheader(f"Speedup, alpha and tokens per round vs {x_title}")
    if curve["speedup"].isna().all():
        st.info(f"None of the experiments sweeping {x_title} has a finished speculative run yet.")
        return
    x = "sweep_label" if swept.categorical else "sweep_value"  # a name (runs.sweep_label), else the number
    frame = curve[
        [
            "experiment",
            "experiment_name",
            "line_label",
            "experiment_id",
            "run_id",
            x,
            "speedup",
            *INTERVAL.values(),
            "state",
            "alpha",
            "tokens_per_round",
        ]
    ]
    if swept.categorical:
        panels = charts.category_panels(frame, x, "experiment", x_title, interval=INTERVAL)
    else:
        panels = charts.sweep_panels(frame, x, "experiment", x_title, end_label="line_label", interval=INTERVAL)
    for column, panel in zip(st.columns(len(panels)), panels):  # each fills its column: nothing runs off the page
        with column:
            draw(panel, width="stretch")
    draw(charts.series_legend(frame, "experiment"), width="stretch")  # the legend the panels share
    csv_download(frame, f"compare_sweep_{swept.name}.csv")
    st.caption(
        "Speedup: error bars are 95 % intervals (paired bootstrap over prompts); hollow points are runs that "
        "have not finished, crosses impossible speedups (timing warnings). "
        + (
            "Each name is a category: the experiments' points stand side by side within it."
            if swept.categorical
            else "Each line ends with its experiment's number (and batch size), named in full in the legend."
        )
    )
    if swept.categorical:
        return  # points side by side never lie on one another
    for y, what in (("speedup", "speedup"), ("alpha", "alpha"), ("tokens_per_round", "tokens per round")):
        note = charts.coinciding_note(charts.coinciding(frame, x, y, "experiment"), what, x_title)
        if note:
            st.caption(md_text(note))


def _runs(runs_by_experiment: dict[int, pd.DataFrame], sweeps: dict[int, str | None]) -> None:
    everything = pd.concat(runs_by_experiment.values(), ignore_index=True) if runs_by_experiment else pd.DataFrame()
    if everything.empty:
        return
    speculative = everything[everything["kind"] == "speculative"]
    labels = {}
    for experiment_id, runs in runs_by_experiment.items():
        label = run_label(runs, variable(sweeps.get(experiment_id)).name)  # a draft sweep's by its draft, not k
        labels.update({int(r): f"#{experiment_id} · {label(int(r))}" for r in runs["run_id"]})
    chosen = select_ids("Runs", "runs", [int(r) for r in speculative["run_id"]], labels.get)
    if not chosen:
        st.caption("Pick two or more runs to compare their metrics and rejection breakdowns.")
        return
    metrics = [c for c in RUN_METRICS if c in everything]
    table = everything.set_index("run_id").loc[chosen, metrics]
    table.index = [labels[r] for r in chosen]
    # One row per metric, named by its header and written in its one format (storage/records/columns.py), as every
    # table.
    side_by_side = pd.DataFrame(
        {run: [show(m, v) for m, v in row.items()] for run, row in table.iterrows()},
        index=[COLUMNS[m].header if m in COLUMNS else m for m in metrics],
    )
    experiment_of = {int(r): e for e, runs in runs_by_experiment.items() for r in runs["run_id"]}
    docs = {e: predictions(e, version(e)) for e in dict.fromkeys(experiment_of[r] for r in chosen)}
    ks = dict(zip(everything["run_id"].astype(int), everything["k"]))
    server = pd.DataFrame([server_cells(docs[experiment_of[r]].get(r), ks[r]) for r in chosen], index=table.index)
    server = server.astype({"server_k": "Int64", "server_concurrency": "Int64"})
    after = metrics.index("speedup_ci_hi") + 1 if "speedup_ci_hi" in metrics else len(metrics)  # the lab's interval
    side_by_side = pd.concat(
        [
            side_by_side.iloc[:after],
            pd.DataFrame(
                {run: [server_text(row), row["server_profile"]] for run, row in server.iterrows()},
                index=list(SERVER_ROWS),
            ),
            side_by_side.iloc[after:],
        ]
    )
    st.dataframe(side_by_side, width="stretch", key="compare_runs_table")
    csv_download(pd.concat([table, server], axis=1).reset_index(names="run"), "compare_runs.csv")
    st.caption(
        "Predicted in the server: from each run's own acceptance and the newest server cost profile that fits it "
        "(`draftlab profile`), at the smallest concurrency profiled; the detail page's Predictions section has "
        "every k and concurrency."
    )
    positions, types = [], []
    for run_id in chosen:
        positions.append(
            cached("acceptance_by_position", run_id, experiment_id=experiment_of[run_id]).assign(
                run=labels[run_id], run_id=run_id
            )
        )
        types.append(
            cached("acceptance_by_type", run_id, experiment_id=experiment_of[run_id]).assign(
                run=labels[run_id], run_id=run_id
            )
        )
    left, right = st.columns(2)
    with left:
        st.subheader("Conditional acceptance by draft position")
        frame = pd.concat(positions, ignore_index=True)
        chart_with_csv(
            charts.overlaid_curves(
                frame, "position", "conditional", "run", "draft position", "accepted / reached", (0, 1), count="reached"
            ),
            frame,
            "compare_by_position.csv",
        )
        note = charts.coinciding_note(
            charts.coinciding(frame, "position", "conditional", "run"), "acceptance", "draft position"
        )
        if note:
            st.caption(md_text(note))
    with right:
        st.subheader("Acceptance by token type")
        frame = pd.concat(types, ignore_index=True)
        chart_with_csv(
            charts.grouped_bars(frame, "token_type", "rate", "run", "accepted / verified", count="verified"),
            frame,
            "compare_by_type.csv",
        )
        st.caption(charts.SMALL_SAMPLE_NOTE)


def render() -> None:
    st.title("Compare")
    listing = cached(catalog.experiments)
    if listing.empty:
        empty_state("No experiments to compare yet.")
        return
    ids = [int(i) for i in listing["experiment_id"]]
    chosen = select_ids("Experiments", "experiments", ids, experiment_label(listing), default=ids[:2])
    if not chosen:
        st.info("Pick one or more experiments.")
        return
    st.header("Experiments")
    runs_by_experiment = _experiments(listing, chosen)
    st.header("Runs")
    _runs(runs_by_experiment, swept_variables(listing))
