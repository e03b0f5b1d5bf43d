"""In the server (predicted) (experiment detail): a lab run's speedup as the serving engine would give it, from the
run's own acceptance and the newest server cost profile that fits it (storage/serving/run_predictions.py, the run
JSON's `server_predicted`): per concurrency and k, the predicted speedup with its 95 % interval beside what the lab
measured at that k and batch size, the profile it comes from ("predicted for vLLM … on …, profile N"), the k to
serve at each concurrency, and a chart of the predictions against k, one line per concurrency. Where no profile
fits, one line says why and which command measures one."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from pages.widgets import charts
from pages.widgets.charts import speedup_text
from pages.widgets.common import cached, chart_with_csv, select_id, store, table
from pages.widgets.prefill import md_text
from storage.records.profile_version import profiles_version
from storage.serving.run_predictions import experiment_predictions

TITLE = "In the server (predicted)"
FRAME_COLUMNS = [
    "concurrency",
    "k",
    "predicted_speedup",
    "predicted_lo",
    "predicted_hi",
    "serve",
    "tokens_per_step",
    "step_seconds_ratio",
    "interpolated",
    "lab_run_id",
    "lab_speedup",
    "lab_lo",
    "lab_hi",
]


def predictions(experiment_id: int, stamp: tuple) -> dict[int, dict]:
    """{run id: server_predicted} of the experiment's speculative runs, cached until its runs or the stored
    profiles change."""
    profiles = profiles_version(store())
    return cached(experiment_predictions, experiment_id, experiment_id=experiment_id, stamp=(*stamp, *profiles))


def default_run(docs: dict[int, dict], verdict: dict) -> int | None:
    """The run shown first: of the runs a profile fits, the one predicted at the most ks (its deepest drafts give
    the whole curve), the verdict's choice among those first, else the first; None when no profile fits any."""
    fitted = {rid: doc for rid, doc in docs.items() if doc.get("profile")}
    if not fitted:
        return None
    depth = {rid: max(len(by_k) for by_k in doc["concurrency"].values()) for rid, doc in fitted.items()}
    deepest = [rid for rid in fitted if depth[rid] == max(depth.values())]
    for preferred in (verdict.get("chosen_run_id"), verdict.get("best_run_id")):
        if preferred in deepest:
            return int(preferred)
    return deepest[0]


def _lab_runs(runs: pd.DataFrame, run_id: int, sweep_variable: str) -> pd.DataFrame:
    """The lab's runs that measured what the prediction covers: in a k sweep the finished speculative runs of the
    predicted run's draft and drafter (every k and batch size), otherwise the run itself (the other runs of a
    temperature or draft sweep measured another configuration)."""
    speculative = runs[(runs["kind"] == "speculative") & (runs["status"] == "done")]
    this = runs[runs["run_id"] == run_id]
    if sweep_variable != "k" or this.empty:
        return speculative[speculative["run_id"] == run_id]
    same = pd.Series(True, index=speculative.index)
    for column in ("draft", "drafter"):
        if column in speculative:
            mine = this[column].iloc[0]
            same &= speculative[column].isna() if pd.isna(mine) else speculative[column] == mine
    return speculative[same]


def prediction_frame(doc: dict, runs: pd.DataFrame, run_id: int, sweep_variable: str = "k") -> pd.DataFrame:
    """One row per concurrency and k of the run's prediction (FRAME_COLUMNS): the predicted speedup with its
    interval, whether that k is the one to serve there (the prediction's schedule), the tokens per step and the
    step cost over the target's it comes from, whether that cost was interpolated between profiled ks; beside it
    the lab's run at that k and at a batch size equal to the concurrency (`_lab_runs`), NaN where the lab never
    measured one."""
    lab = _lab_runs(runs, run_id, sweep_variable)
    batch = lab["batch_size"].fillna(1).astype(int) if "batch_size" in lab else pd.Series(1, index=lab.index)
    rows = []
    for c, by_k in sorted(doc["concurrency"].items(), key=lambda item: int(item[0])):
        for k, cell in sorted(by_k.items(), key=lambda item: int(item[0])):
            measured = lab[(lab["k"].astype(int) == int(k)) & (batch == int(c))]
            if len(measured) > 1:  # the predicted run itself first
                measured = measured.sort_values("run_id", key=lambda ids: ids != run_id)
            m = measured.iloc[0] if len(measured) else None
            rows.append(
                {
                    "concurrency": int(c),
                    "k": int(k),
                    "predicted_speedup": cell["speedup"],
                    "predicted_lo": cell["speedup_ci"][0],
                    "predicted_hi": cell["speedup_ci"][1],
                    "serve": int(doc["schedule"].get(c, 0)) == int(k),
                    "tokens_per_step": cell["tokens_per_step"],
                    "step_seconds_ratio": cell["step_seconds_ratio"],
                    "interpolated": bool(cell["interpolated"]),
                    "lab_run_id": int(m["run_id"]) if m is not None else None,
                    "lab_speedup": m["speedup"] if m is not None else None,
                    "lab_lo": m["speedup_ci_lo"] if m is not None else None,
                    "lab_hi": m["speedup_ci_hi"] if m is not None else None,
                }
            )
    frame = pd.DataFrame(rows, columns=FRAME_COLUMNS)
    frame["lab_run_id"] = frame["lab_run_id"].astype("Int64")
    for column in ("predicted_speedup", "predicted_lo", "predicted_hi", "lab_speedup", "lab_lo", "lab_hi"):
        frame[column] = frame[column].astype(float)
    return frame


def schedule_text(doc: dict) -> str:
    """The k to serve at each concurrency with its predicted speedup: `concurrency 1: k=2 at 1.42× (1.30–1.55) ·
    concurrency 4: off (k = 0; its best, k=1, 0.97× (0.90–1.04))`."""
    said = []
    for c, k in sorted(doc["schedule"].items(), key=lambda item: int(item[0])):
        by_k = doc["concurrency"][c]
        if k:
            cell = by_k[str(k)]
            said.append(f"concurrency {c}: k={k} at {speedup_text(cell['speedup'], *cell['speedup_ci'])}")
        else:
            best = max(by_k, key=lambda key: by_k[key]["speedup"])
            figure = speedup_text(by_k[best]["speedup"], *by_k[best]["speedup_ci"])
            said.append(f"concurrency {c}: off (k = 0; its best, k={best}, {figure})")
    return " · ".join(said)


def _reason_markdown(reason: str) -> str:
    """A reason as markdown: its words literal (md_text), its `commands` as code."""
    parts = reason.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: all of it literal
        return md_text(reason)
    return "".join(f"`{part}`" if i % 2 else _literal(part) for i, part in enumerate(parts))


def _literal(words: str) -> str:
    """md_text, keeping a space at either end (it joins the code spans around it)."""
    return (" " if words[:1].isspace() else "") + md_text(words) + (" " if words[-1:].isspace() else "")


def no_prediction(experiment_id: int, run_id: int, reason: str) -> str:
    """The one line shown where no profile fits: why (the run JSON's reason), and the command that measures a
    profile where one would answer (a reason about the profiles that does not name it already); none where the run
    itself cannot be served or predicted (not finished, not lossless, no draft tokens): a profile would not help."""
    line = f"No server prediction for run {run_id}: {_reason_markdown(reason)}"
    if "profile" in reason and "draftlab profile" not in reason:
        line += f"; `draftlab profile {experiment_id} --run {run_id}` measures a new one"
    return line


def render_server_predicted(
    experiment_id: int, runs: pd.DataFrame, verdict: dict, stamp: tuple, sweep_variable: str, run_label
) -> None:
    """The panel. `run_label`: format_func for run ids (pages/widgets/common.run_label)."""
    st.subheader(TITLE, anchor="in-the-server")
    docs = predictions(experiment_id, stamp)
    if not docs:
        st.caption("No speculative run to predict yet.")
        return
    run_id = default_run(docs, verdict)
    if run_id is None:  # no profile fits any run: the reason of the verdict's run (else the first)
        shown = next(
            (int(r) for r in (verdict.get("chosen_run_id"), verdict.get("best_run_id")) if r in docs), next(iter(docs))
        )
        st.info(no_prediction(experiment_id, shown, docs[shown]["reason"]), icon=":material/dns:")
        return
    run_id = select_id(
        "Run predicted (its acceptance, the profile's step costs)",
        "server_run",
        list(docs),
        run_label,
        default=run_id,
    )
    if run_id is None:
        return
    doc = docs[run_id]
    if not doc.get("profile"):
        st.info(no_prediction(experiment_id, run_id, doc["reason"]), icon=":material/dns:")
        return
    profile = doc["profile"]
    st.markdown(f"**{md_text(profile['label'])}**")
    st.markdown(f"**k to serve:** {md_text(schedule_text(doc))}")
    st.caption(
        md_text(
            f"From run {run_id}'s acceptance by draft position over {doc['prompts']} prompts and the profile's "
            f"step cost at each k over the target alone's (t_k / t_0): speedup = tokens per step × t_0 / t_k; a k is "
            f"served where its interval lies above 1×. Intervals: {doc['confidence']:.0%}, bootstrap over the "
            f"prompts and the profile's passes. The profile holds for this target and drafter at any k up to "
            f"{profile['largest_k']}, on its engine and hardware; a prediction is not a measurement: a confirm is."
        )
    )
    frame = prediction_frame(doc, runs, run_id, sweep_variable)
    chart_with_csv(charts.server_predicted_curve(frame), frame, f"run{run_id}_server_predicted.csv")
    shown = frame.assign(
        predicted=[speedup_text(s, lo, hi) for s, lo, hi in zip(*(frame[c] for c in FRAME_COLUMNS[2:5]))],
        lab=[speedup_text(s, lo, hi) for s, lo, hi in zip(frame["lab_speedup"], frame["lab_lo"], frame["lab_hi"])],
    )
    table(
        shown,
        [
            "concurrency",
            "k",
            "predicted",
            "serve",
            "lab",
            "lab_run_id",
            "tokens_per_step",
            "step_seconds_ratio",
            "interpolated",
        ],
        "server_predicted_table",
        concurrency=st.column_config.NumberColumn("concurrency", help="requests in flight in the server"),
        k=st.column_config.NumberColumn("k", help="draft tokens per step"),
        predicted=st.column_config.TextColumn(
            "predicted in the server (95 %)", help="the server's speedup over the target alone, predicted"
        ),
        serve=st.column_config.CheckboxColumn("serve", help="the k to serve at this concurrency (0: none is)"),
        lab=st.column_config.TextColumn(
            "lab measured (95 %)", help="the lab's run at this k and a batch size equal to the concurrency"
        ),
        lab_run_id=st.column_config.NumberColumn("lab run", format="%d"),
        tokens_per_step=st.column_config.NumberColumn(
            "tokens per step", format="%.2f", help="expected from the run's acceptance by position"
        ),
        step_seconds_ratio=st.column_config.NumberColumn(
            "t_k / t_0", format="%.2f", help="the profile's step cost at k over the target alone's"
        ),
        interpolated=st.column_config.CheckboxColumn("interpolated", help="t_k between two profiled ks"),
    )
