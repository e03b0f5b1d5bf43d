"""Confirm in vLLM (experiment detail): queue a confirm for a worker (`draftlab confirm` run from the queue,
storage/serving/confirm_jobs.py), follow it live, then read its stored measurements beside the lab's: speedup against
concurrency (server and lab, each with its 95 % interval), acceptance by draft position (the lab run with its
interval, the server's counters), the latency table and, for a k grid's schedule, the lab's schedule beside what
the server made of it. The dashboard starts no server itself: a worker does, with its own vLLM command."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from engine.wording import plural
from pages.widgets import charts
from pages.widgets.common import cached, chart_with_csv, csv_download, store, table
from pages.widgets.prefill import md_text
from storage.analysis.confirm_report import confirm_document, lab_schedule_beside
from storage.db.errors import QueueError
from storage.records import production
from storage.records.confirms import LATENCY_KEYS, beside_lab
from storage.serving import confirm_jobs

REFRESH_SECONDS = 2.0  # a queued or running confirm's progress
IDLE_POLL_SECONDS = 5.0  # the check for a confirm queued elsewhere (a shell, another browser)
CONCURRENCY_CHOICES = (1, 2, 4, 8, 16, 32, 64)
CONFIG_HELP = {
    "chosen": "the verdict's configuration",
    "schedule": "the k grid's schedule, one k per batch size",
    "all": "every finished lossless speculative run",
}
LATENCY_COLUMNS = ["who", "concurrency", "tokens_per_second", *LATENCY_KEYS]


def render_confirm(experiment_id: int, experiment: dict, sizes: list[int] | None) -> None:
    """The panel: the form, the live progress of a queued or running confirm and the newest ended confirm's
    results. Every confirm's status follows the database without a reload: a fragment polls the experiment's
    confirms (every REFRESH_SECONDS while one is queued or running, with its progress; every IDLE_POLL_SECONDS
    otherwise, drawing nothing) and redraws the page once when any confirm's status moved (one queued, claimed or
    ended here or from a shell), so the results and the form's state are redrawn with it."""
    st.subheader("Confirm in vLLM", anchor="confirm-in-vllm")
    st.caption(
        "Serve this experiment's configuration in vLLM's OpenAI server, with exactly the speculative config "
        'of "Use these settings", beside the target served alone: the same prompts, streamed at each '
        "concurrency, the two servers alternating pass by pass. A worker starts both servers with its own "
        "vLLM (`$DRAFTLAB_VLLM`, else `.vllm-venv`); `draftlab confirm` does the same from a shell."
    )
    jobs = confirm_jobs.confirm_jobs(store(), experiment_id)
    _form(experiment_id, experiment, sizes, jobs)
    seen = confirm_state(jobs)
    if confirm_active(jobs):
        st.fragment(run_every=REFRESH_SECONDS)(_live)(experiment_id, seen)
    else:
        st.fragment(run_every=IDLE_POLL_SECONDS)(_watch)(experiment_id, seen)
    _ended(experiment_id, jobs)


def confirm_state(jobs: pd.DataFrame) -> tuple:
    """What the panel is drawn for: each confirm with its status (not its progress, which the live part draws)."""
    return tuple((int(i), str(s)) for i, s in zip(jobs["confirm_id"], jobs["status"]))


def confirm_active(jobs: pd.DataFrame) -> bool:
    return bool(jobs["status"].isin(confirm_jobs.ACTIVE).any()) if not jobs.empty else False


def _fresh(experiment_id: int, seen: tuple) -> pd.DataFrame:
    """The experiment's confirms now; redraws the whole page (st.rerun) when a status moved since it was drawn:
    only a full run changes the poll's interval and draws the results (a fragment-scoped rerun would rerun this
    fragment with the state it was drawn for, again and again)."""
    jobs = confirm_jobs.confirm_jobs(store(), experiment_id)
    if confirm_state(jobs) != seen:
        st.rerun()
    return jobs


def _watch(experiment_id: int, seen: tuple) -> None:
    """Nothing queued or running: draws nothing, redraws the page once a confirm appears (e.g. from a shell)."""
    _fresh(experiment_id, seen)


def _form(experiment_id: int, experiment: dict, sizes: list[int] | None, jobs: pd.DataFrame) -> None:
    """The form, offering only the configurations a confirm would be queued for (storage/serving/confirm_jobs.py's
    check, the one pressing the button runs), its button disabled with the reason beside it when nothing can be queued
    now (the verdict serves the target alone and no run is lossless, or a confirm is already unfinished)."""
    choices = ["chosen", "schedule", "all"] if sizes else ["chosen", "all"]
    refused = {
        c: cached(confirm_jobs.configurations_refusal, experiment_id, c, experiment_id=experiment_id) for c in choices
    }
    offered = [c for c in choices if refused[c] is None]
    busy = jobs[jobs["status"].isin(confirm_jobs.ACTIVE)]
    why_not = (
        f"confirm {int(busy['confirm_id'].iloc[0])} is {busy['status'].iloc[0]}: one confirm of an experiment at a time"
        if not busy.empty
        else None
        if offered
        else "; ".join(f"{c}: {refused[c]}" for c in choices)
    )
    default = sorted({*(sizes or [int(experiment.get("batch_size") or 1)])})
    with st.form(key=f"confirm_form_{experiment_id}", border=False):
        c1, c2, c3 = st.columns([1.2, 2, 1])
        c1.selectbox(
            "Configurations", offered or choices, key="confirm_configs", format_func=lambda c: f"{c}: {CONFIG_HELP[c]}"
        )
        c2.multiselect(
            "Concurrency (requests in flight)",
            sorted({*CONCURRENCY_CHOICES, *default}),
            default=default,
            key="confirm_concurrency",
            help="each measured with both servers; the lab's figures show "
            "beside the concurrency equal to a batch size it measured",
        )
        c3.number_input(
            "Passes",
            min_value=1,
            max_value=confirm_jobs.MAX_REPEATS,
            value=confirm_jobs.DEFAULT_REPEATS,
            step=1,
            key="confirm_repeats",
            help="per server and concurrency; two or more give the speedup an interval",
        )
        button, reason = st.columns([1, 4], vertical_alignment="center")
        button.form_submit_button(
            "Queue confirm",
            icon=":material/dns:",
            type="secondary",
            disabled=why_not is not None,
            on_click=_queue,
            args=(experiment_id,),
        )
        if why_not:
            reason.caption(md_text(f"Nothing to queue now: {why_not}"))
        elif len(offered) < len(choices):
            reason.caption(md_text("; ".join(f"{c} is not offered: {refused[c]}" for c in choices if refused[c])))
    result = st.session_state.pop(QUEUED, None)
    if result and result[0] == experiment_id:
        if isinstance(result[1], int):
            st.toast(f"Confirm {result[1]} queued: a worker runs it")
        else:
            st.error(md_text(result[1]), icon=":material/error:")


QUEUED = "confirm_queued"  # session key: (experiment id, the confirm id queued or why it was not)


def _queue(experiment_id: int) -> None:
    """The button's callback, before the page is drawn again: queue the confirm as the form says, so the panel
    drawn next already shows it (and its button disabled while it is unfinished)."""
    state = st.session_state
    outcome: int | str  # the queued confirm's id, or why it was refused
    try:
        outcome = confirm_jobs.enqueue_confirm(
            store(),
            experiment_id,
            configs=state["confirm_configs"],
            concurrency=[int(c) for c in state["confirm_concurrency"]],
            repeats=int(state["confirm_repeats"]),
            launched_by=_launcher(),
        )
    except QueueError as exc:
        outcome = str(exc)
    state[QUEUED] = (experiment_id, outcome)


def _live(experiment_id: int, seen: tuple) -> None:
    """The queued and running confirms' progress, redrawn every REFRESH_SECONDS from the database."""
    jobs = _fresh(experiment_id, seen)
    for job in jobs[jobs["status"].isin(confirm_jobs.ACTIVE)].itertuples(index=False):
        _progress(job)


def _ended(experiment_id: int, jobs: pd.DataFrame) -> None:
    """The newest ended confirm's error, and the measured confirms' results (a choice of them when several)."""
    if jobs.empty:
        st.caption("No confirm yet.")
        return
    measured = jobs[(jobs["measurements"] > 0) & ~jobs["status"].isin(confirm_jobs.ACTIVE)]
    ended = jobs[~jobs["status"].isin(confirm_jobs.ACTIVE)]
    if not ended.empty:
        last = ended.iloc[0]
        if last["status"] != "done" and last["error"]:
            st.error(
                md_text(f"Confirm {int(last['confirm_id'])} {last['status']}: {last['error']}"), icon=":material/error:"
            )
    if measured.empty:
        return
    ids = [int(i) for i in measured["confirm_id"]]
    confirm_id = (
        ids[0]
        if len(ids) == 1
        else st.selectbox(
            "Confirm",
            ids,
            key=f"confirm_shown_{experiment_id}",
            format_func=lambda i: _label(measured.set_index("confirm_id").loc[i]),
        )
    )
    _results(experiment_id, confirm_id, measured.set_index("confirm_id").loc[confirm_id])


def _label(job) -> str:
    return f"confirm {int(job.name)} · {job['configs']} · concurrency {job['concurrency']} · {job['status']}" + (
        f" · {job['launched_by']}" if job["launched_by"] else ""
    )


def _progress(job) -> None:
    total = int(job.requests_total) if job.requests_total == job.requests_total and job.requests_total else 0
    done = int(job.requests_done) if job.requests_done == job.requests_done and job.requests_done else 0
    state = (
        "queued, waiting for a worker (`draftlab worker`, or the one `draftlab ui` starts, runs it)"
        if job.status == "queued"
        else f"{job.status}: {job.phase or 'starting'}"
    )
    what = (
        f"Confirm {int(job.confirm_id)} ({job.configs}, concurrency {job.concurrency}, "
        f"{plural(int(job.repeats), 'pass', 'passes')} per server) — {state}"
    )
    if total:
        st.progress(min(done / total, 1.0), text=md_text(f"{what} · {done} of {total} requests"))
    else:
        st.info(md_text(what), icon=":material/hourglass:")


def speedup_frame(beside: pd.DataFrame) -> pd.DataFrame:
    """What the speedup chart draws: per measurement the server's speedup, and the lab's at the batch size equal
    to its concurrency (where the lab measured one), each with its interval."""
    rows = []
    for r in beside.itertuples(index=False):
        if r.speedup == r.speedup and r.speedup is not None:  # withheld (no result): its finding says why
            rows.append(
                {
                    "concurrency": int(r.concurrency),
                    "source": f"vLLM · {r.label} (k={r.k})",
                    "kind": "server",
                    "speedup": r.speedup,
                    "lo": r.speedup_ci_lo,
                    "hi": r.speedup_ci_hi,
                }
            )
        if r.lab_speedup == r.lab_speedup and r.lab_speedup is not None:
            rows.append(
                {
                    "concurrency": int(r.concurrency),
                    "source": f"lab · {r.label} (k={r.k})",
                    "kind": "lab",
                    "speedup": r.lab_speedup,
                    "lo": r.lab_speedup_ci_lo,
                    "hi": r.lab_speedup_ci_hi,
                }
            )
    return pd.DataFrame(rows, columns=["concurrency", "source", "kind", "speedup", "lo", "hi"])


def positions_frame(experiment_id: int, beside: pd.DataFrame) -> pd.DataFrame:
    """production_positions' frame: the configuration's lab run per position with its interval (kind 'lab'), and
    the server's counters per position at each concurrency (kind 'production')."""
    frames = []
    served = production.positions(store(), experiment_id)
    for r in beside.itertuples(index=False):
        if r.series_id == r.series_id and r.series_id is not None:
            mine = served[(served["series_id"] == int(r.series_id)) & (served["position"] <= r.positions)]
            frames.append(
                pd.DataFrame(
                    {
                        "position": mine["position"],
                        "conditional": mine["conditional"],
                        "source": f"vLLM · {r.label} (k={r.k}), concurrency {r.concurrency}",
                        "kind": "production",
                        "lo": None,
                        "hi": None,
                    }
                )
            )
    runs = sorted({int(r) for r in beside["run_id"].dropna()})
    if len(runs) == 1:  # one lab interval to draw (a confirm of several runs: the table has each)
        lab = production.lab_positions(store(), runs[0])
        frames.append(
            lab.assign(source=f"lab (run {runs[0]})", kind="lab")[
                ["position", "source", "kind", "conditional", "lo", "hi"]
            ]
        )
    frames = [f for f in frames if not f.empty]
    columns = ["position", "source", "kind", "conditional", "lo", "hi"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def latency_frame(document: dict, beside: pd.DataFrame) -> pd.DataFrame:
    """Throughput and latency per server and concurrency, the lab's run at that batch size below each."""
    rows = [
        {
            "who": "vLLM · target alone",
            "concurrency": b["concurrency"],
            "tokens_per_second": b["tokens_per_second"],
            **{key: b[key] for key in LATENCY_KEYS},
        }
        for b in document["baseline"]["per_concurrency"]
    ]
    for r in beside.itertuples(index=False):
        rows.append(
            {
                "who": f"vLLM · {r.label} (k={r.k})",
                "concurrency": int(r.concurrency),
                "tokens_per_second": r.tokens_per_second,
                **{key: getattr(r, key) for key in LATENCY_KEYS},
            }
        )
        if r.lab_run_id is not pd.NA and r.lab_run_id == r.lab_run_id:
            rows.append(
                {
                    "who": f"lab · run {int(r.lab_run_id)} (batch {int(r.concurrency)})",
                    "concurrency": int(r.concurrency),
                    "tokens_per_second": r.lab_tokens_per_second,
                    **{key: getattr(r, f"lab_{key}") for key in LATENCY_KEYS},
                }
            )
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS).sort_values("concurrency", kind="stable")


def _results(experiment_id: int, confirm_id: int, job) -> None:
    document = confirm_document(store(), confirm_id)
    beside = beside_lab(store(), confirm_id)
    wall = (
        f", {job['wall_seconds']:.0f} s in all"
        if job["wall_seconds"] == job["wall_seconds"] and job["wall_seconds"] is not None
        else ""
    )
    st.markdown(
        md_text(
            f"Confirm {confirm_id} in {document['engine']} {document['engine_version'] or ''}"
            f" ({plural(int(job['repeats']), 'pass', 'passes')} per server and concurrency{wall})"
        )
    )
    for config in document["configs"]:
        st.code(json.dumps(config["speculative_config"]), language="json", wrap_lines=True)
    outputs = beside[
        ["label", "concurrency", "k", "outputs_match_server_baseline", "outputs_match_lab", "first_divergence"]
    ]
    left, right = st.columns(2)
    with left:
        st.markdown("#### Speedup vs concurrency")
        frame = speedup_frame(beside)
        if frame.empty:
            st.caption(
                "No speedup to show: speculation changed the server's outputs, or its timing exceeded what "
                "its tokens per step allow (the findings say which)."
            )
        else:
            chart_with_csv(charts.confirm_speedup(frame), frame, f"confirm{confirm_id}_speedup.csv")
        st.caption(
            "vLLM: its speculative tokens per second over its target-only tokens per second on the same "
            "prompts (equal work per generated token), 95 % interval over paired passes; none where its "
            "outputs changed or it exceeds its tokens per step; lab: the run at the batch size equal to the "
            "concurrency with the same k, 95 % interval over prompts. A concurrency the lab never measured "
            "has the server's point alone."
        )
    with right:
        st.markdown("#### Acceptance by draft position, vLLM and lab")
        positions = positions_frame(experiment_id, beside)
        if positions.empty:
            st.caption("The server counted no per-position acceptance.")
        else:
            chart_with_csv(
                charts.production_positions(positions, points_title="vLLM"),
                positions,
                f"confirm{confirm_id}_positions.csv",
            )
            st.caption(
                "Grey: the lab run's 95 % interval over prompts (tick: its value); points: the server's "
                "counters over its passes, in DraftLab's conditional definition (no interval: one pool). A "
                "schedule shows the positions every k it served at that concurrency reaches."
            )
    st.markdown("#### Throughput and latency, vLLM and lab")
    latency = latency_frame(document, beside)
    table(
        latency,
        LATENCY_COLUMNS,
        f"confirm_latency_{confirm_id}",
        who=st.column_config.TextColumn("server or lab run", width="medium"),
        concurrency=st.column_config.NumberColumn("concurrency", format="%d"),
    )
    csv_download(latency, f"confirm{confirm_id}_latency.csv")
    st.markdown("#### Outputs (greedy)")
    table(
        outputs,
        list(outputs.columns),
        f"confirm_outputs_{confirm_id}",
        label=st.column_config.TextColumn("configuration"),
        outputs_match_server_baseline=st.column_config.NumberColumn(
            "= vLLM target alone",
            format="percent",
            help="share of prompts whose output with speculation equals the server's own target-only output",
        ),
        outputs_match_lab=st.column_config.NumberColumn(
            "= lab", format="percent", help="share of prompts equal to the lab run's output"
        ),
        first_divergence=st.column_config.TextColumn("first divergence", width="large"),
    )
    schedule = (
        lab_schedule_beside(store(), confirm_id) if any(c["label"] == "schedule" for c in document["configs"]) else []
    )
    if schedule:
        st.markdown("#### The lab's schedule and vLLM's answer")
        side = pd.DataFrame(
            [
                {
                    "batch_size": s["batch_size"],
                    "lab_k": s["k"],
                    "lab": charts.speedup_text(s["speedup"], *(s["speedup_ci"] or [None, None])),
                    "server_k": s["server_k"],
                    "server": charts.speedup_text(s["server_speedup"], *(s["server_speedup_ci"] or [None, None]))
                    if s["server_speedup"] is not None
                    else None,
                }
                for s in schedule
            ]
        )
        table(
            side,
            list(side.columns),
            f"confirm_schedule_{confirm_id}",
            batch_size=st.column_config.NumberColumn("batch size = concurrency", format="%d"),
            lab_k=st.column_config.NumberColumn("lab's k", format="%d"),
            lab=st.column_config.TextColumn("lab speedup (95 %)"),
            server_k=st.column_config.NumberColumn(
                "vLLM's k", format="%d", help="num_speculative_tokens_per_batch_size at this batch size"
            ),
            server=st.column_config.TextColumn("vLLM speedup (95 %)"),
        )
        csv_download(side, f"confirm{confirm_id}_schedule.csv")
    st.caption(
        f"Stored with the experiment: `draftlab export {experiment_id} --format json` carries it (`server_confirms`)."
    )


def _launcher() -> str:
    from pages.widgets.access import launcher

    return launcher()
