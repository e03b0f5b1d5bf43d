"""Experiments: every experiment with status, progress, best value and speedup; live while something runs.

While something is queued or running the table refreshes every REFRESH_SECONDS. While idle the page still polls,
every IDLE_POLL_SECONDS, with one listing query, and redraws itself when work appears (queued from the CLI or
another browser) or ends, so a dashboard left open notices new work.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.config.variables import variable
from engine.text.prompt_sets import set_name
from engine.wording import noun, plural
from pages.widgets.common import (
    csv_download,
    empty_state,
    experiment_label,
    nav_page,
    select_id,
    short_name,
    show,
    store,
    table,
)
from storage.analysis import catalog
from storage.jobs import run_state
from storage.records import queries as q
from storage.records.columns import MISSING

ACTIVE = ("queued", "running")
RESUMABLE = ("failed", "cancelled", "interrupted")
REFRESH_SECONDS = 2.0  # the table, while something is queued or running
IDLE_POLL_SECONDS = 5.0  # the cheap check for new work, while nothing is
ANY = "any"
COLUMNS = [
    "experiment_id",
    "timing_warnings",
    "name",
    "status",
    "progress",
    "best_label",
    "best_speedup",
    "interval",
    "n_tied",
    "alpha",
    "target",
    "draft",
    "prompts",
    "sweep_variable",
    "sweep_values",
    "batch_sizes",
    "repeats",
    "tags",
    "created",
    "notes",
]  # headers, help and formats: storage/records/columns.py


def _is_active(frame: pd.DataFrame) -> bool:
    return bool(len(frame)) and frame["status"].isin(ACTIVE).any()


def page_state(listing: pd.DataFrame) -> tuple:
    """What the page drawn outside the refreshing table depends on: each experiment with its status (the selector's
    `(running)`, its Cancel or Resume button) and whether any is active (the timer). Any status that moves redraws
    the page: one experiment finishing while another still runs changes no timer, but its label and button."""
    statuses = tuple(sorted((int(i), str(s)) for i, s in zip(listing["experiment_id"], listing["status"])))
    return statuses, bool(_is_active(listing))


def needs_full_rerun(seen: tuple, listing: pd.DataFrame) -> bool:
    """True when `listing` (fresh) no longer matches the state the page was drawn for."""
    return page_state(listing) != seen


def _watch(seen: tuple) -> None:
    """The idle poll on an empty database: draws nothing, redraws the page once experiments exist."""
    if needs_full_rerun(seen, catalog.experiments(store())):
        st.rerun()


def _filters(everything: pd.DataFrame) -> dict:
    tags = sorted({t.strip() for s in everything["tags"].fillna("") for t in str(s).split(",") if t.strip()})
    models = sorted(set(everything["target"].dropna()) | set(everything["draft"].dropna()))
    statuses = sorted(set(everything["status"].dropna()))
    c1, c2, c3 = st.columns(3)
    tag = c1.selectbox("Tag", [ANY, *tags], key="filter_tag")
    model = c2.selectbox("Model (target or draft)", [ANY, *models], key="filter_model")
    status = c3.selectbox("Status", [ANY, *statuses], key="filter_status")
    return {k: (None if v == ANY else v) for k, v in (("tag", tag), ("model", model), ("status", status))}


def swept_text(frame: pd.DataFrame) -> list[list[str]]:
    """Each experiment's swept values as text, as its variable shows them (4, 0.7, demo-draft): one column holds a
    k sweep's numbers beside a draft sweep's names, which Arrow cannot hold as one type (ArrowInvalid, every poll)."""
    return [
        [variable(name).show(v) for v in values] for name, values in zip(frame["sweep_variable"], frame["sweep_values"])
    ]


def _waiting() -> None:
    """One line per worker waiting for a device another worker is timing on (one timed job per device)."""
    leases = q.device_leases(store())
    for r in leases[leases["waiting_worker"].notna()].itertuples():
        holder = (
            f"held by worker {r.worker_id}"
            + (f", timing experiment #{r.experiment_id}" if pd.notna(r.experiment_id) else "")
            if pd.notna(r.worker_id)
            else "free now: it starts at its next poll"
        )
        st.info(f"Worker {r.waiting_worker} is waiting for device {r.device} ({holder}).", icon=":material/hourglass:")


def _workers() -> None:
    """Worker health: who is alive, on which device, timing what; the queue's depth; stale workers flagged."""
    health = q.worker_health(store())
    frame = health["workers"]
    stale = int((frame["status"] == "stale").sum())
    # Running and queued both: the runs of an experiment are timed together, so while one is going the queue
    # can be empty and "0 runs queued" alone read as if nothing were happening.
    running = health["running_runs"]
    label = (
        f"Workers: {len(frame) - stale} alive"
        + (f", ⚠ {stale} stale" if stale else "")
        + (f" · {plural(running, 'run')} running" if running else "")
        + f" · {plural(health['queued_runs'], 'run')} queued in {plural(health['queued_experiments'], 'experiment')}"
        + (
            f" · {plural(health['queued_training_jobs'], 'training job')} queued"
            if health["queued_training_jobs"]
            else ""
        )
    )
    with st.expander(label, expanded=bool(stale) or (health["queued_runs"] > 0 and len(frame) == stale)):
        if frame.empty:
            st.caption("No worker is registered: start one with `draftlab worker` (or `--devices all`).")
            return
        if stale:
            st.warning(
                f"{plural(stale, 'worker')} stopped heartbeating or {noun(stale, 'its', 'their')} process "
                f"is gone; the next sweep marks their "
                f"runs interrupted (`draftlab resume` continues them).",
                icon=":material/heart_broken:",
            )
        st.dataframe(
            frame.assign(progress=frame["progress"] * 100),
            hide_index=True,
            width="stretch",
            key="workers_table",
            placeholder=MISSING,
            column_config={
                "progress": st.column_config.ProgressColumn("progress", min_value=0, max_value=100, format="%.0f%%"),
                "heartbeat_age_s": st.column_config.NumberColumn("last beat", format="%.0f s ago"),
            },
        )


def _table(filters: dict, seen: tuple) -> None:
    if needs_full_rerun(seen, catalog.experiments(store())):
        st.rerun()  # new experiments, or work started or finished: redraw the page once, with the right timer
    _waiting()
    frame = catalog.experiments(store(), **filters)
    if frame.empty:
        st.info("No experiment matches these filters.")
        _workers()
        return
    shown = frame.assign(
        prompts=[set_name(p) for p in frame["prompts"]],  # an upload by its file name, never the server's path
        sweep_values=swept_text(frame),
        best_label=[short_name(v) for v in frame["best_label"]],  # a draft's path by its last part: the CSV has it
        progress=frame["progress"].fillna(0) * 100,
        interval=[
            f"{show('speedup_ci_lo', lo)}–{show('speedup_ci_hi', hi)}" if pd.notna(lo) and pd.notna(hi) else None
            for lo, hi in zip(frame["best_ci_lo"], frame["best_ci_hi"])
        ],
    )
    table(shown, COLUMNS, "experiments_table", pinned=("experiment_id", "timing_warnings", "name"))  # scrolls wide
    csv_download(frame, "experiments.csv")
    if seen[1]:
        st.caption(f"Refreshing every {REFRESH_SECONDS:g} s while experiments are queued or running.")
    _workers()  # below the experiments table (the page's first dataframe)


def render() -> None:
    st.title("Experiments")
    everything = catalog.experiments(store())
    seen = page_state(everything)
    if everything.empty:
        empty_state("No experiments yet. Launch one to see its runs here.")
        st.fragment(run_every=IDLE_POLL_SECONDS)(_watch)(seen)
        return
    filters = _filters(everything)
    # Every REFRESH_SECONDS while something is queued or running; a slower poll while idle (see the docstring).
    st.fragment(run_every=REFRESH_SECONDS if seen[1] else IDLE_POLL_SECONDS)(_table)(filters, seen)

    st.subheader("Selected experiment")
    ids = [int(i) for i in everything["experiment_id"]]
    experiment_id = select_id("Experiment", "experiment", ids, experiment_label(everything))
    if experiment_id is None:
        return
    row = everything.set_index("experiment_id").loc[experiment_id]
    c1, c2, c3, c4 = st.columns(4)
    c1.page_link(
        nav_page("experiment"),
        label="Open detail",
        icon=":material/monitoring:",
        query_params={"experiment": str(experiment_id)},
    )
    c2.page_link(
        nav_page("rounds"),
        label="Explore rounds",
        icon=":material/token:",
        query_params={"experiment": str(experiment_id)},
    )
    c3.page_link(
        nav_page("compare"),
        label="Compare",
        icon=":material/compare_arrows:",
        query_params={"experiments": str(experiment_id)},
    )
    if row["status"] in ACTIVE:
        if c4.button("Cancel experiment", key="cancel", icon=":material/cancel:"):
            run_state.cancel_experiment(store(), experiment_id)
            st.toast(f"Experiment #{experiment_id} cancelled")
            st.rerun()
    elif row["status"] in RESUMABLE:
        if c4.button(
            "Resume experiment",
            key="resume",
            icon=":material/replay:",
            help="requeue its unfinished runs; a worker continues from the first unfinished prompt",
        ):
            run_state.resume_experiment(store(), experiment_id)
            st.toast(f"Experiment #{experiment_id} requeued")
            st.rerun()
    else:
        c4.caption(f"status: {row['status']}")
