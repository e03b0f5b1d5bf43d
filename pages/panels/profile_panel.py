"""Server cost profile (experiment detail): queue `draftlab profile` for a worker (a confirm row with configs =
"profile", storage/serving/confirm_jobs.py), follow it live, then read what it measured: the server's step cost per
concurrency and k (t_k / t_0 with its 95 % interval over passes, the server's own tokens per step) and what the
profile holds for (engine and version, hardware, target, drafter). The dashboard starts no server itself: a worker
does, with its own vLLM command, exactly as `draftlab profile` does."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from engine.wording import plural
from pages.widgets import charts
from pages.widgets.common import cached, chart_with_csv, csv_download, store, table
from pages.widgets.prefill import md_text
from storage.db.errors import QueueError
from storage.records.server_costs import profile_drafters, short_fingerprint
from storage.serving import confirm_jobs
from storage.serving.profiles import profile_table

REFRESH_SECONDS = 2.0  # a queued or running profile's progress
IDLE_POLL_SECONDS = 5.0  # the check for a profile queued or ended elsewhere (a shell, another browser)
CONCURRENCY_CHOICES = (1, 2, 4, 8, 16, 32, 64)
QUEUED = "profile_queued"  # session key: (experiment id, the profile id queued or why it was not)
COST_COLUMNS = ["concurrency", "k", "step_ms", "cost_ratio", "interval", "tokens_per_step", "passes"]
CANNOT = (
    "What a profile cannot stand in for: it measures the server's cost per step, not acceptance. A run's "
    "predicted server speedup takes its acceptance from the lab run and only its step costs from here (the "
    "tokens per step below are this profile's own drafter on these prompts). It holds for this engine version, "
    "hardware, target and drafter shape alone, and a prediction from it is not a measurement: a confirm is "
    "still the proof."
)


def render_profile(experiment_id: int, experiment: dict, sizes: list[int] | None, run_label) -> None:
    """The panel: the form, the live progress of a queued or running profile and the newest ended profile's costs.
    Its state follows the database without a reload, as the confirm panel's does: a fragment polls the experiment's
    profiles (every REFRESH_SECONDS while one is queued or running, drawing its progress; every IDLE_POLL_SECONDS
    otherwise, drawing nothing) and redraws the page once when a profile's status moved, so its results are drawn
    when it ends. `run_label`: format_func for run ids (pages/widgets/common.run_label)."""
    st.subheader("Server cost profile", anchor="server-cost-profile")
    st.caption(
        "Serve one lab run's drafter in vLLM at each k beside the target alone (the confirm's servers and "
        "interleaved passes) and store the server's step cost at each k and concurrency: the cost half of a "
        "server prediction, measured once per engine, hardware, target and drafting method and reused by every "
        "run it fits. A worker starts the servers with its own vLLM (`$DRAFTLAB_VLLM`, else `.vllm-venv`); "
        "`draftlab profile` does the same from a shell."
    )
    st.caption(CANNOT)
    jobs = confirm_jobs.confirm_jobs(store(), experiment_id)
    profiles = jobs[jobs["configs"] == confirm_jobs.PROFILE]
    _form(experiment_id, experiment, sizes, jobs, run_label)
    seen = profile_state(profiles)
    if profile_active(profiles):
        st.fragment(run_every=REFRESH_SECONDS)(_live)(experiment_id, seen)
    else:
        st.fragment(run_every=IDLE_POLL_SECONDS)(_watch)(experiment_id, seen)
    _ended(experiment_id, profiles)


def profile_state(profiles: pd.DataFrame) -> tuple:
    """What the panel is drawn for: each profile with its status (not its progress, which the live part draws)."""
    return tuple((int(i), str(s)) for i, s in zip(profiles["confirm_id"], profiles["status"]))


def profile_active(profiles: pd.DataFrame) -> bool:
    return bool(profiles["status"].isin(confirm_jobs.ACTIVE).any()) if not profiles.empty else False


def _fresh(experiment_id: int, seen: tuple) -> pd.DataFrame:
    """The experiment's profiles now; redraws the whole page (st.rerun) when a status moved since it was drawn."""
    jobs = confirm_jobs.confirm_jobs(store(), experiment_id)
    profiles = jobs[jobs["configs"] == confirm_jobs.PROFILE]
    if profile_state(profiles) != seen:
        st.rerun()
    return profiles


def _watch(experiment_id: int, seen: tuple) -> None:
    """Nothing queued or running: draws nothing, redraws the page once a profile appears (e.g. from a shell)."""
    _fresh(experiment_id, seen)


def _live(experiment_id: int, seen: tuple) -> None:
    """The queued and running profiles' progress, redrawn every REFRESH_SECONDS from the database."""
    profiles = _fresh(experiment_id, seen)
    for job in profiles[profiles["status"].isin(confirm_jobs.ACTIVE)].itertuples(index=False):
        _progress(job)


def _known(value) -> bool:
    return value is not None and value == value


def _progress(job) -> None:
    total = int(job.requests_total) if _known(job.requests_total) and job.requests_total else 0
    done = int(job.requests_done) if _known(job.requests_done) and job.requests_done else 0
    state = (
        "queued, waiting for a worker (`draftlab worker`, or the one `draftlab ui` starts, runs it)"
        if job.status == "queued"
        else f"{job.status}: {job.phase or 'starting'}"
    )
    run = f"run {int(job.profile_run_id)}" if _known(job.profile_run_id) else "the default run"
    what = (
        f"Profile {int(job.confirm_id)} ({run} at k {job.profile_ks or '1,2,3,4'}, concurrency {job.concurrency}, "
        f"{plural(int(job.repeats), 'pass', 'passes')} per server) — {state}"
    )
    if total:
        st.progress(min(done / total, 1.0), text=md_text(f"{what} · {done} of {total} requests"))
    else:
        st.info(md_text(what), icon=":material/hourglass:")


def profile_offer(store, experiment_id: int) -> list[int] | str:
    """The runs a profile may serve, the default first (confirm_jobs.profile_runs), or why none (its one line): a
    value either way, so the answer is cached until the experiment's runs change."""
    try:
        return confirm_jobs.profile_runs(store, experiment_id)
    except QueueError as exc:
        return str(exc)


def _form(experiment_id: int, experiment: dict, sizes: list[int] | None, jobs: pd.DataFrame, run_label) -> None:
    """The form: the runs a profile may serve (storage/serving/confirm_jobs.py's profile_runs, the check pressing the
    button runs), the ks, the concurrency and the passes; its button disabled with the reason beside it when nothing
    can be queued now (no run vLLM can serve, or a confirm or profile of the experiment is unfinished)."""
    offer = cached(profile_offer, experiment_id, experiment_id=experiment_id)
    runs, refused = (offer, None) if isinstance(offer, list) else ([], offer)
    busy = jobs[jobs["status"].isin(confirm_jobs.ACTIVE)]
    why_not = (
        f"{'profile' if busy['configs'].iloc[0] == confirm_jobs.PROFILE else 'confirm'} "
        f"{int(busy['confirm_id'].iloc[0])} is {busy['status'].iloc[0]}: one confirm or profile of an experiment at "
        f"a time (both start servers on the same machine)"
        if not busy.empty
        else refused
    )
    default = sorted({*(sizes or [int(experiment.get("batch_size") or 1)])})
    with st.form(key=f"profile_form_{experiment_id}", border=False):
        c1, c2, c3, c4 = st.columns([1.6, 1, 2, 0.8])
        c1.selectbox(
            "Run whose drafter to serve",
            runs,
            key="profile_run",
            format_func=run_label,
            help="its drafting method and draft shape are what the profile measures; any run of the same shape "
            "and target fits it, whatever its k or prompts",
        )
        c2.text_input(
            "k values",
            value=",".join(map(str, confirm_jobs.DEFAULT_PROFILE_KS)),
            key="profile_ks",
            help=f"the ks to serve, comma-separated, each from 1 to {confirm_jobs.MAX_K}; k = 0 (the target alone) "
            "is always measured",
        )
        c3.multiselect(
            "Concurrency (requests in flight)",
            sorted({*CONCURRENCY_CHOICES, *default}),
            default=default,
            key="profile_concurrency",
            help="each k's step cost is measured at each",
        )
        c4.number_input(
            "Passes",
            min_value=1,
            max_value=confirm_jobs.MAX_REPEATS,
            value=confirm_jobs.DEFAULT_PROFILE_REPEATS,
            step=1,
            key="profile_repeats",
            help="per server and concurrency; more passes, a narrower interval",
        )
        button, reason = st.columns([1, 4], vertical_alignment="center")
        button.form_submit_button(
            "Queue profile",
            icon=":material/speed:",
            type="secondary",
            disabled=why_not is not None,
            on_click=_queue,
            args=(experiment_id,),
        )
        if why_not:
            reason.caption(md_text(f"Nothing to queue now: {why_not}"))
    result = st.session_state.pop(QUEUED, None)
    if result and result[0] == experiment_id:
        if isinstance(result[1], int):
            st.toast(f"Profile {result[1]} queued: a worker runs it")
        else:
            st.error(md_text(result[1]), icon=":material/error:")


def _queue(experiment_id: int) -> None:
    """The button's callback, before the page is drawn again: queue the profile as the form says (refused in one line
    by storage/serving/confirm_jobs.py's checks), so the panel drawn next already shows it."""
    state = st.session_state
    outcome: int | str  # the queued profile's id, or why it was refused
    run = state.get("profile_run")
    try:
        outcome = confirm_jobs.enqueue_confirm(
            store(),
            experiment_id,
            configs=confirm_jobs.PROFILE,
            run_id=int(run) if run is not None else None,
            ks=str(state.get("profile_ks") or ""),
            concurrency=[int(c) for c in state.get("profile_concurrency") or []],
            repeats=int(state.get("profile_repeats") or confirm_jobs.DEFAULT_PROFILE_REPEATS),
            launched_by=_launcher(),
        )
    except QueueError as exc:
        outcome = str(exc)
    state[QUEUED] = (experiment_id, outcome)


def _ended(experiment_id: int, profiles: pd.DataFrame) -> None:
    """The newest ended profile's error, and the measured profiles' costs (a choice of them when several)."""
    if profiles.empty:
        st.caption("No profile of this experiment yet.")
        return
    ended = profiles[~profiles["status"].isin(confirm_jobs.ACTIVE)]
    if not ended.empty:
        last = ended.iloc[0]
        if last["status"] != "done" and last["error"]:
            st.error(
                md_text(f"Profile {int(last['confirm_id'])} {last['status']}: {last['error']}"), icon=":material/error:"
            )
    measured = ended[ended["measurements"] > 0].set_index("confirm_id")
    if measured.empty:
        return
    ids = [int(i) for i in measured.index]
    profile_id = (
        ids[0]
        if len(ids) == 1
        else st.selectbox(
            "Profile",
            ids,
            key=f"profile_shown_{experiment_id}",
            format_func=lambda i: (
                f"profile {i} · concurrency {measured.loc[i, 'concurrency']} · {measured.loc[i, 'status']}"
            ),
        )
    )
    _results(profile_id)


def cost_frame(rows: list[dict]) -> pd.DataFrame:
    """profile_table's rows as the table and its CSV: per concurrency and k, the step in ms, t_k / t_0 with its
    interval (lo, hi, and as text), the server's tokens per step and the passes."""
    frame = pd.DataFrame(
        [
            {
                "concurrency": r["concurrency"],
                "k": r["k"],
                "step_ms": r["step_seconds"] * 1000,
                "cost_ratio": r["cost_ratio"],
                "lo": r["cost_ratio_ci"][0] if r["cost_ratio_ci"] else None,
                "hi": r["cost_ratio_ci"][1] if r["cost_ratio_ci"] else None,
                "interval": f"{r['cost_ratio_ci'][0]:.2f}–{r['cost_ratio_ci'][1]:.2f}" if r["cost_ratio_ci"] else None,
                "tokens_per_step": r["tokens_per_step"],
                "passes": r["passes"],
            }
            for r in rows
        ],
        columns=["concurrency", "k", "step_ms", "cost_ratio", "lo", "hi", "interval", "tokens_per_step", "passes"],
    )
    return frame.astype({"cost_ratio": float, "lo": float, "hi": float})


def ratio_frame(costs: pd.DataFrame) -> pd.DataFrame:
    """What the chart draws: each k ≥ 1 with a t_k / t_0 (the target alone measured at its concurrency)."""
    return costs.loc[(costs["k"] > 0) & costs["cost_ratio"].notna(), ["concurrency", "k", "cost_ratio", "lo", "hi"]]


def _holds_for(job: dict, fingerprint: str) -> str:
    version = job.get("engine_version") or "(version unknown)"
    engine = str(job.get("engine") or "vllm").replace("vllm", "vLLM")
    return md_text(
        f"Holds for: {engine} {version} · hardware {job.get('hardware') or 'unknown'} · target "
        f"{job.get('target') or 'unknown'} · drafter {short_fingerprint(fingerprint)}"
    )


def _results(profile_id: int) -> None:
    job = confirm_jobs.get_confirm(store(), profile_id) or {}
    wall = f", {job['wall_seconds']:.0f} s in all" if _known(job.get("wall_seconds")) else ""
    run = f" of run {int(job['profile_run_id'])}'s drafter" if _known(job.get("profile_run_id")) else ""
    st.markdown(
        md_text(
            f"Profile {profile_id}{run} ({plural(int(job.get('repeats') or 0), 'pass', 'passes')} per server and "
            f"concurrency{wall})"
        )
    )
    drafters = profile_drafters(store(), profile_id)
    if not drafters:
        st.caption("This profile stored no speculative step cost.")
    for n, fingerprint in enumerate(drafters):
        st.markdown(_holds_for(job, fingerprint))
        with st.expander(
            "The drafter's fingerprint (what a run must match to use this profile)", key=f"profile_drafter_{n}"
        ):
            st.code(json.dumps(json.loads(fingerprint), indent=1), language="json", wrap_lines=True)
        costs = cost_frame(profile_table(store(), profile_id, fingerprint))
        left, right = st.columns(2)
        with left:
            st.markdown("#### Step cost per concurrency and k")
            table(
                costs,
                COST_COLUMNS,
                f"profile_costs_{profile_id}_{n}",
                concurrency=st.column_config.NumberColumn("concurrency", format="%d"),
                k=st.column_config.NumberColumn("k", format="%d", help="0: the target alone"),
                step_ms=st.column_config.NumberColumn(
                    "step (ms)", format="%.2f", help="decode seconds over engine steps, summed over its passes"
                ),
                cost_ratio=st.column_config.NumberColumn("t_k / t_0", format="%.2f"),
                interval=st.column_config.TextColumn("t_k / t_0, 95 %", help="bootstrap interval over the passes"),
                tokens_per_step=st.column_config.NumberColumn(
                    "server tokens / step",
                    format="%.2f",
                    help="this profile's own drafter on these prompts: the server's acceptance, not a run's",
                ),
                passes=st.column_config.NumberColumn("passes", format="%d"),
            )
            csv_download(costs, f"profile{profile_id}_{n}_costs.csv", key=f"profile_csv_{profile_id}_{n}")
        with right:
            st.markdown("#### t_k / t_0 vs k")
            ratios = ratio_frame(costs)
            if ratios.empty:
                st.caption("No t_k / t_0: no concurrency measured both the target alone and a k with engine steps.")
            else:
                chart_with_csv(charts.cost_ratio_curve(ratios), ratios, f"profile{profile_id}_{n}_cost_ratio.csv")
            st.caption(
                "A speculative step's cost over a step of the target alone at the same concurrency (dashed: 1), "
                "95 % interval over paired passes. A run's predicted server speedup is its tokens per step (from "
                "the lab's acceptance) over this ratio."
            )


def _launcher() -> str:
    from pages.widgets.access import launcher

    return launcher()
