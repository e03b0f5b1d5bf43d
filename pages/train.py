"""Train a draft: distil a draft toward its target (the worker runs `draftlab distill`) or train an EAGLE-3 head for
a target (`draftlab train-head`) as a queued job, watch its loss and held-out figures live (a head's acceptance by
draft position and acceptance length too), cancel it, resume it from its checkpoint, and read its before/after
figures and the timed experiment queued when it ends. `?job=ID` selects a job."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pandas as pd
import streamlit as st

from engine import zoo
from engine.config import head_settings
from engine.errors import DraftLabError
from engine.text.prompt_sets import (
    DEFAULT_SPLIT,
    EVERY_SET,
    PROMPT_SET_DESCRIPTIONS,
    UNION,
    held_out_split,
    list_prompt_sets,
    load_prompt_file,
    load_prompts,
    set_name,
)
from engine.wording import plural
from pages.widgets import charts
from pages.widgets.common import (
    NO_DATABASE,
    csv_download,
    draw,
    nav_page,
    number,
    parse_id,
    select_id,
    store,
    table,
)
from pages.widgets.prefill import md_text
from storage.analysis import catalog
from storage.db.errors import QueueError
from storage.db.schema import CANCELLED, DISTILL, DONE, FAILED, HEAD, INTERRUPTED, QUEUED, RUNNING
from storage.jobs import training
from storage.records import queries as q

REFRESH_SECONDS = 2.0
DEVICES = ["auto", "cpu", "cuda"]
NO_FOCUS = 0
KINDS = {DISTILL: "Distil a draft", HEAD: "Train an EAGLE-3 head"}  # the form's "What to train"


def _set_choice(spec: str) -> str:
    """The built-in set menu's entry naming the same prompts as `spec` (`code+english+...`: every set's tune split)."""

    def parts(s: str) -> frozenset:
        return frozenset(p if ":" in p else f"{p}:{DEFAULT_SPLIT}" for p in s.split(UNION))

    return next((choice for choice in [*list_prompt_sets(), EVERY_SET] if parts(choice) == parts(spec)), spec)


# The form starts from the recipe that made the shipped demo-draft-distilled (its distill.json, the command the
# benchmarks/bench_distilled.md gives), not from the first version's settings, which made a weak draft.
_RECIPE = zoo.recipe("demo-draft-distilled")
DEFAULTS = {
    "train_target": zoo.DEMO_TARGET,
    "train_draft": zoo.DEMO_DRAFTS[0],
    "train_steps": _RECIPE["steps"],
    "train_lr": _RECIPE["lr"],
    "train_batch_size": _RECIPE["batch_size"],
    "train_samples": _RECIPE["samples"],
    "train_max_new_tokens": _RECIPE["max_new_tokens"],
    "train_seed": _RECIPE["seed"],
    "train_device": "auto",
    "train_source": "Built-in",
    "train_set": _set_choice(_RECIPE["prompts"]),
    "train_kind": DISTILL,
    # a head's own fields start from `draftlab train-head`'s defaults (engine/config/head_settings.py)
    **{f"head_{key}": value for key, value in head_settings.DEFAULTS.items() if key != "seed"},
}


def _seed(key: str) -> None:
    if key not in st.session_state:
        st.session_state[key] = DEFAULTS[key]


def _pair_check(target: str, draft: str):
    """The tokenizer check, drawn into one placeholder: 'checking…' replaces the previous answer while it runs."""
    from pages.widgets.pair_check import check_pair_names

    slot = st.empty()
    slot.caption("Checking that the two tokenizers match…")
    check = check_pair_names(target.strip(), draft.strip())
    if check.ok and check.vocab == "intersection":  # distillation compares the two distributions in one vocabulary
        check = replace(
            check,
            ok=False,
            message=f"{check.message}; distillation needs a draft that shares the target's tokenizer",
        )
    if check.ok:
        slot.success(f"Pair check: {md_text(check.message)}", icon=":material/check_circle:")
    else:
        slot.error(f"Pair check: {md_text(check.message)}", icon=":material/error:")
    return check


def _prompts() -> tuple[str | None, str | None, str | None]:
    """(training prompt spec or saved corpus path, held-out spec, error)."""
    from pages.widgets.uploads import UPLOAD_TYPES, save_upload

    _seed("train_source")
    source = st.radio("Training prompts", ["Built-in", "Upload a corpus"], horizontal=True, key="train_source")
    sets = list_prompt_sets()
    if source == "Built-in":
        _seed("train_set")
        spec = st.selectbox(
            "Built-in set (NAME:SPLIT)",
            sets + [EVERY_SET],
            key="train_set",
            format_func=lambda v: f"{v} (every set's tune split)" if v == EVERY_SET else v,
            help="train on `tune`; the held-out figures use `validation`",
        )
        about = (
            "every built-in set's tune split, one after another"
            if spec == EVERY_SET
            else PROMPT_SET_DESCRIPTIONS.get(spec.split(":")[0], "")
        )
        try:
            st.caption(f"{plural(len(load_prompts(spec)), 'prompt')} — {about}")
        except DraftLabError as exc:
            return None, None, str(exc)
        default_val = held_out_split(spec)[0]
    else:
        upload = st.file_uploader(
            'Corpus: .jsonl (a "prompt" field per line), .csv (a "prompt" column) or .txt '
            "(one prompt a line); the target continues each one",
            type=UPLOAD_TYPES,
            key="train_upload",
        )
        if upload is None:
            return None, None, None
        path = save_upload(upload.name, upload.getvalue())
        try:
            texts = load_prompt_file(path)
        except DraftLabError as exc:
            return None, None, str(exc).replace(str(path), upload.name)
        if not texts:
            return None, None, f"{upload.name} holds no prompts"
        st.caption(md_text(f"{plural(len(texts), 'prompt')} from {upload.name}"))
        spec, default_val = str(path), "code:validation"
    options = list(dict.fromkeys([default_val, *sets] + ([spec] if source != "Built-in" else [])))
    if st.session_state.get("train_validation_of") != spec:  # another training set: its own held-out split
        st.session_state["train_validation_of"] = spec
        st.session_state["train_validation"] = default_val
    val = st.selectbox(
        "Held-out prompts (the before/after figures)",
        options,
        key="train_validation",
        format_func=lambda v: "the training corpus itself (not held out)" if v == spec else v,
    )
    if val == spec:
        st.caption("Held-out figures on the training prompts measure fit, not generalisation.")
    return spec, val, None


def _focus_options() -> tuple[list[int], dict]:
    exps = catalog.experiments(store())
    if exps.empty:
        return [NO_FOCUS], {NO_FOCUS: "none (every token weighs 1)"}
    done = exps[exps["status"] == "done"]
    labels = {NO_FOCUS: "none (every token weighs 1)"}
    labels.update({int(r.experiment_id): f"#{r.experiment_id} · {r.name}" for r in done.itertuples()})
    return list(labels), labels


def _form() -> None:
    st.subheader("New training job")
    for key in DEFAULTS:
        if key.startswith(("train_", "head_")) and key not in ("train_source", "train_set"):
            _seed(key)
    models = training.models_dir()
    kind = st.radio(
        "What to train",
        list(KINDS),
        format_func=KINDS.get,
        horizontal=True,
        key="train_kind",
        help="distil a copy of a small draft model toward the target; or train an EAGLE-3 head, one "
        "decoder layer that drafts from the target's own hidden states (served by vLLM and SGLang)",
    )
    c1, c2 = st.columns(2)
    target = c1.text_input("Target model", key="train_target", help=zoo.model_help("target"))
    check = None
    if kind == DISTILL:
        draft = c2.text_input(
            "Draft to start from", key="train_draft", help="its copy is trained; the original is left as it is"
        )
        check = _pair_check(target, draft) if target.strip() and draft.strip() else None
    else:
        draft = ""
        c2.caption(
            "No draft to start from: the head is built for the target, reads its hidden states and shares "
            "its tokenizer and embedding."
        )
    spec, val, prompt_error = _prompts()
    if prompt_error:
        st.error(md_text(prompt_error), icon=":material/error:")
    settings, problems = _distill_fields() if kind == DISTILL else _head_fields()
    c1, c2 = st.columns([1, 2])
    device = c1.selectbox("Device", DEVICES, key="train_device")
    ids, labels = _focus_options()
    wanted = parse_id(st.query_params.get("focus_from"))  # a finding's "Try it" link (storage/analysis/findings/)
    if wanted in ids and st.session_state.get("train_focus_from_link") != wanted:
        st.session_state["train_focus"] = wanted  # once per link, so the user can still change it
        st.session_state["train_focus_from_link"] = wanted
    focus = c2.selectbox(
        "Focus on an experiment's rejections",
        ids,
        format_func=labels.get,
        key="train_focus",
        help="weigh the loss by (1 - acceptance) of each token type and draft position in that experiment's best run",
    )
    base = os.path.basename((draft if kind == DISTILL else target).strip().rstrip("/"))
    default_name = (
        f"{base or 'draft'}-distilled-{_next_id()}" if kind == DISTILL else f"{base or 'target'}-eagle3-{_next_id()}"
    )
    made = "draft" if kind == DISTILL else "head"
    name = st.text_input(f"Name of the trained {made}", value=default_name, key=f"train_name_{default_name}")
    st.caption(
        f"Written to this directory. Trained drafts and heads go to `${training.MODELS_ENV}` (here: the "
        f"directory above); share it and the database, and the team sees each other's."
    )
    st.code(str(models / name.strip()), language=None, wrap_lines=True)
    _estimate(
        {
            "kind": kind,
            "target": target.strip(),
            "draft": draft.strip(),
            "prompts": spec,
            "validation": val,
            **{key: settings[key] for key in ("steps", "batch_size", "max_new_tokens", "samples")},
        }
    )
    if not target.strip():
        problems.append("no target model")
    if kind == DISTILL and not draft.strip():
        problems.append("no draft to start from")
    if check is not None and not check.ok:
        problems.append("the pair check failed")
    if spec is None:
        problems.append("no training prompts")
    ready = check is not None if kind == DISTILL else bool(target.strip())
    disabled = bool(problems) or not ready  # the button's help lists the problems: never disabled without one
    if st.button(
        "Queue training job",
        type="primary",
        icon=":material/model_training:",
        disabled=disabled,
        key="train_launch",
        help="; ".join(problems) or None,
    ):
        assert spec is not None and val is not None, "the button is disabled without prompts"
        try:
            job_id = training.enqueue_training(
                store(),
                kind=kind,
                name=name,
                target=target,
                draft=draft,
                prompts=spec,
                validation=val,
                focus_from=None if focus == NO_FOCUS else int(focus),
                device=device,
                launched_by=_launcher(),
                **settings,
            )
        except QueueError as exc:
            st.error(md_text(str(exc)), icon=":material/error:")
        else:
            st.query_params["job"] = str(job_id)
            st.toast(f"Training job {job_id} queued")
            st.rerun()


def _distill_fields() -> tuple[dict, list[str]]:
    """A distillation's settings from its fields (and what keeps it from being queued: nothing here)."""
    c1, c2, c3 = st.columns(3)
    steps = c1.number_input("Steps", min_value=1, step=50, key="train_steps", help="optimiser steps")
    lr = c2.number_input("Learning rate", min_value=0.0, step=1e-4, format="%.1e", key="train_lr")
    batch = c3.number_input("Batch size", min_value=1, step=1, key="train_batch_size", help="sequences per step")
    c1, c2, c3 = st.columns(3)
    samples = c1.number_input(
        "Samples per prompt",
        min_value=1,
        step=1,
        key="train_samples",
        help="continuations per prompt: 1 is the target's greedy one; more adds temperature-1 samples",
    )
    max_new = c2.number_input(
        "Max new tokens", min_value=1, step=16, key="train_max_new_tokens", help="length of the target's continuations"
    )
    seed = c3.number_input("Seed", step=1, key="train_seed")
    return {
        "steps": int(steps),
        "lr": float(lr),
        "batch_size": int(batch),
        "samples": int(samples),
        "max_new_tokens": int(max_new),
        "seed": int(seed),
    }, []


def _head_fields() -> tuple[dict, list[str]]:
    """An EAGLE-3 head's settings from its fields (`draftlab train-head`'s options), and what keeps them from being
    queued (aux layers that are not a list of ids, shown as one error)."""
    c1, c2, c3 = st.columns(3)
    steps = c1.number_input("Steps", min_value=1, step=50, key="head_steps", help="optimiser steps")
    ttt = c2.number_input(
        "TTT steps",
        min_value=1,
        max_value=head_settings.MAX_TTT_STEPS,
        step=1,
        key="head_ttt_steps",
        help="training-time test: the draft positions trained, the chain "
        "it learns to draft (and the k its held-out figures use)",
    )
    vocab = c3.number_input(
        "Draft vocabulary size",
        min_value=0,
        step=1000,
        key="head_draft_vocab_size",
        help="the N target tokens most frequent in the target's responses; 0: the whole vocabulary (at most 32,000)",
    )
    c1, c2, c3 = st.columns(3)
    aux = c1.text_input(
        "Aux layers",
        key="head_aux_layers",
        help="target layers the head reads, vLLM's convention (id i = the input of decoder layer "
        "i): auto (2, L/2, L-3) or e.g. 2,6,9",
    )
    lr = c2.number_input("Learning rate", min_value=0.0, step=1e-4, format="%.1e", key="head_lr")
    max_new = c3.number_input(
        "Max new tokens", min_value=1, step=16, key="head_max_new_tokens", help="length of the target's responses"
    )
    c1, c2, c3 = st.columns(3)
    batch = c1.number_input("Batch size", min_value=1, step=1, key="head_batch_size", help="sequences per step")
    samples = c2.number_input(
        "Samples per prompt",
        min_value=1,
        step=1,
        key="head_samples",
        help="responses per prompt: 1 is the target's greedy one; more adds temperature-1 samples",
    )
    seed = c3.number_input("Seed", step=1, key="train_seed")
    problems = []
    try:
        head_settings.parse_aux_layers(aux, "aux layers")
    except DraftLabError as exc:
        st.error(md_text(str(exc)), icon=":material/error:")
        problems.append("the aux layers are not a list of layer ids")
    return {
        "steps": int(steps),
        "lr": float(lr),
        "batch_size": int(batch),
        "samples": int(samples),
        "max_new_tokens": int(max_new),
        "seed": int(seed),
        "ttt_steps": int(ttt),
        "draft_vocab_size": int(vocab),
        "aux_layers": aux,
    }, problems


def _estimate(shape_args: dict) -> None:
    """How long the job will take, before it is queued: a figure with its range and basis
    (pages/panels/training_estimate.py), scaled from the finished jobs (the same kind's steps; either kind's loading and
    responses), else from the shipped demo's recorded run of the kind."""
    from pages.panels.training_estimate import Shape, training_estimate

    counts = {
        "train_prompts": _count(shape_args.pop("prompts")),
        "validation_prompts": _count(shape_args.pop("validation")),
    }
    estimate = training_estimate(Shape(**shape_args, **counts), _timings(), _count)
    if estimate is None:
        st.caption(
            "No duration estimate: no training job of this kind has finished here and no shipped run of it is recorded."
        )
    else:
        st.caption(md_text(f"{estimate.text()[0].upper()}{estimate.text()[1:]}, on one worker."))


def _timings() -> pd.DataFrame:
    """The finished jobs' timings (storage.jobs.training.job_timings); none when there is no database to ask (the form
    still queues: it opens it then). A bug is raised, never read as "no job finished here"."""
    try:
        return training.job_timings(store())
    except NO_DATABASE:
        return pd.DataFrame(columns=training.TIMING_COLUMNS)


@st.cache_data(ttl=60, show_spinner=False)
def _count(spec: str | None) -> int | None:
    """How many prompts a spec names (None when it is not readable here)."""
    try:
        return len(load_prompts(spec)) if spec else None
    except (DraftLabError, OSError):
        return None


def _next_id() -> int:
    frame = training.jobs(store())
    return int(frame["id"].max()) + 1 if not frame.empty else 1


def _delta(after, before, fmt):
    if after is None or before is None or any(isinstance(v, float) and math.isnan(v) for v in (after, before)):
        return None
    return fmt.format(after - before)


def _figures(job: dict) -> None:
    # Each figure after training, the delta against before, and before itself in the label (values stay short).
    c1, c2, c3 = st.columns(3)
    if job["kind"] == HEAD:  # a fresh head's held-out KL is its TTT loss (on the curve); the greedy figures here
        c1.metric(
            f"acceptance length (before: {number(job['acceptance_length_before'], '{:.2f}')})",
            number(job["acceptance_length_after"], "{:.2f}"),
            delta=_delta(job["acceptance_length_after"], job["acceptance_length_before"], "{:+.2f}"),
        )
    else:
        c1.metric(
            f"held-out KL (before: {number(job['kl_before'], '{:.3f}')})",
            number(job["kl_after"], "{:.3f}"),
            delta=_delta(job["kl_after"], job["kl_before"], "{:+.3f}"),
            delta_color="inverse",
        )
    c2.metric(
        f"α, greedy k={job['eval_k'] or 4} (before: {number(job['alpha_before'])})",
        number(job["alpha_after"]),
        delta=_delta(job["alpha_after"], job["alpha_before"], "{:+.3f}"),
    )
    c3.metric(
        f"tokens per round (before: {number(job['tokens_per_round_before'], '{:.2f}')})",
        number(job["tokens_per_round_after"], "{:.2f}"),
        delta=_delta(job["tokens_per_round_after"], job["tokens_per_round_before"], "{:+.2f}"),
    )
    if job["kind"] == HEAD:
        st.caption(
            f"Greedy speculation at k={job['eval_k']} through the engine's loop on the held-out prompts, "
            f"before (the fresh head) and after (the saved head, reloaded); acceptance length = 1 + accepted "
            f"drafts per drafting round."
        )


def _evaluation(job: dict) -> None:
    eid = job["eval_experiment_id"]
    if eid is None:
        return
    runs = q.runs(store(), int(eid))
    spec = runs[runs["kind"] == "speculative"]
    head = job["kind"] == HEAD
    if head:  # no "before" draft to time: the trained head against the target alone (app/training/training_kinds.py)
        st.markdown(
            f"**Timed experiment #{int(eid)}** — the trained head (drafter eagle3) against the target alone "
            f"on `{md_text(job['validation'])}` (greedy, k={job['eval_k']}, interleaved):"
        )
    else:
        st.markdown(
            f"**Before/after experiment #{int(eid)}** — both drafts timed against one baseline on "
            f"`{md_text(job['validation'])}` (greedy, k={job['eval_k'] or 4}, interleaved):"
        )
    if spec.empty:
        st.caption("queued")
    else:
        names = [job["name"]] if head else [job["draft"], job["name"]]
        rows = []
        for i, r in enumerate(spec.itertuples()):
            interval = (
                f"{r.speedup:.2f}× ({r.speedup_ci_lo:.2f}–{r.speedup_ci_hi:.2f})"
                if pd.notna(r.speedup) and pd.notna(r.speedup_ci_lo)
                else None
            )
            rows.append(
                {
                    "draft": names[i] if i < len(names) else str(i),
                    "status": r.status,
                    "alpha": r.alpha,
                    "kl": r.kl,
                    "tokens_per_round": r.tokens_per_round,
                    "best": interval,
                    "outputs_match_baseline": r.outputs_match_baseline,
                }
            )
        frame = pd.DataFrame(rows)
        table(
            frame,
            list(frame.columns),
            f"eval_{job['id']}",  # headers, help and formats: storage/records/columns.py
            draft=st.column_config.TextColumn("head" if head else "draft"),
            best=st.column_config.TextColumn(
                "speedup (95 % interval)", help="against the target alone, paired bootstrap over prompts"
            ),
        )
    st.page_link(
        nav_page("experiment"),
        label=f"Open experiment #{int(eid)}",
        icon=":material/monitoring:",
        query_params={"experiment": str(int(eid))},
    )


def _about(job: dict) -> str:
    """What a job trains, on what, with which settings, and where it writes (one caption)."""
    on = f" on {set_name(job['prompts'])} (held-out: {set_name(job['validation'])})"
    recipe = f"{plural(job['steps'], 'step')} × {job['batch_size']}, lr {job['lr']:g}"
    if job["kind"] == HEAD:
        vocabulary = f"{job['draft_vocab_size']:,}" if job["draft_vocab_size"] else "the whole vocabulary (≤ 32,000)"
        what = (
            f"EAGLE-3 head for {job['target']}{on}; {recipe}, TTT steps {job['ttt_steps']}, draft vocabulary "
            f"{vocabulary}, aux layers {job['aux_layers'] or 'auto'}"
        )
    else:
        what = f"{job['draft']} → {job['target']}{on}; {recipe}"
    focus = f", focus: experiment {job['focus_from']}" if job["focus_from"] is not None else ""
    return f"{what}{focus}; writes {job['out']}"


def _curves(job: dict) -> None:
    """The loss curve (with its CSV); for a head under it, side by side, its held-out acceptance by draft position
    at each eval point and its acceptance length along the run (their CSV)."""
    job_id = job["id"]
    points = training.points(store(), job_id)
    chart = charts.training_curves(points, head=job["kind"] == HEAD)
    if chart is not None:
        draw(chart, width="stretch")
        csv_download(points, f"training-job-{job_id}-curve.csv", key=f"curve_csv_{job_id}")
    if job["kind"] != HEAD:
        return
    by_position = training.acceptance_by_position(store(), job_id)
    positions, length = charts.head_acceptance_by_position(by_position), charts.acceptance_length_curve(points)
    if positions is None and length is None:
        return
    left, right = st.columns(2)
    if positions is not None:
        with left:
            draw(positions, width="stretch")
    if length is not None:
        with right:
            draw(length, width="stretch")
    st.caption(
        "Held-out, teacher-forced on the target's greedy responses: the acceptance at each draft position "
        "given every position before it accepted, at each eval point (latest darkest), and the acceptance "
        "length it makes (1 + expected accepted drafts per round at k = the TTT steps)."
    )
    csv_download(
        by_position,
        f"training-job-{job_id}-acceptance.csv",
        label="Download acceptance CSV",
        key=f"acceptance_csv_{job_id}",
    )


def _job_view(job_id: int) -> None:
    job = training.get_job(store(), job_id)
    if job is None:
        st.info("That job is gone.")
        return
    status, head = job["status"], job["kind"] == HEAD
    st.markdown(
        f"**Job {job_id} · {md_text(job['name'])}** — {status}"
        + (f" · {md_text(job['phase'])}" if job["phase"] and status in (RUNNING, CANCELLED) else "")
        + (f" · on {md_text(job['device_name'])}" if job["device_name"] else "")
    )
    st.caption(md_text(_about(job)))
    if status in (RUNNING, QUEUED):
        st.progress(
            float(job["progress"] or 0.0),
            text=f"step {job['step']} of {job['steps']}"
            + (f" (checkpoint at step {job['checkpoint_step']})" if job["checkpoint_step"] else ""),
        )
    if job["error"]:
        st.error(md_text(job["error"]), icon=":material/error:")
    _curves(job)
    if job["kl_before"] is not None:
        _figures(job)
    c1, c2, _ = st.columns([1, 2, 2])
    if status in (RUNNING, QUEUED):
        if c1.button(
            "Cancel",
            key=f"cancel_job_{job_id}",
            icon=":material/cancel:",
            help="stops after the current step; its checkpoint is kept so Resume continues from there",
        ):
            training.cancel_job(store(), job_id)
            st.rerun()
    elif status in (CANCELLED, INTERRUPTED, FAILED):
        if c1.button(
            "Resume",
            key=f"resume_job_{job_id}",
            icon=":material/replay:",
            help="requeue it; a worker continues from its last checkpoint",
        ):
            training.resume_job(store(), job_id)
            st.rerun()
    if status == DONE:
        saved = (
            "Trained EAGLE-3 head saved: {out} — offered among the drafts of New experiment (it drafts for "
            "{target} with the eagle3 drafter)"
            if head
            else "Trained draft saved: {out} — offered among the draft candidates of New experiment"
        )
        st.success(md_text(saved.format(out=job["out"], target=job["target"])), icon=":material/check_circle:")
        c2.page_link(nav_page("new"), label="New experiment", icon=":material/add_circle:")
        _evaluation(job)


def _jobs() -> None:
    frame = training.jobs(store())
    if frame.empty:
        st.caption("No training jobs yet.")
        return
    active = frame["status"].isin([RUNNING, QUEUED]).any()
    shown = frame.assign(progress=frame["progress"].fillna(0.0), kind=frame["kind"].fillna(DISTILL))[
        [
            "id",
            "name",
            "kind",
            "status",
            "step",
            "steps",
            "progress",
            "phase",
            "alpha_before",
            "alpha_after",
            "eval_experiment_id",
            "created",
        ]
    ]
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        key="jobs_table",
        placeholder="—",
        column_config={
            "id": st.column_config.NumberColumn("job", width="small"),
            "kind": st.column_config.TextColumn("kind", help="distill: a draft model; head: an EAGLE-3 head"),
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0),
            "alpha_before": st.column_config.NumberColumn("α before", format="%.3f"),
            "alpha_after": st.column_config.NumberColumn("α after", format="%.3f"),
            "eval_experiment_id": st.column_config.NumberColumn("timed experiment", format="%d"),
        },
    )
    if active:
        st.caption(f"Refreshing every {REFRESH_SECONDS:g} s while a job is queued or running.")
    ids = [int(i) for i in frame["id"]]
    job_id = select_id("Job", "job", ids, lambda i: f"job {i} · {frame.set_index('id').loc[i, 'name']}")
    if job_id is not None:
        _job_view(job_id)


def render() -> None:
    st.title("Train a draft")
    st.caption(
        "Distil a copy of a draft toward its target: forward KL(p_target ‖ p_draft) on the target's own "
        "continuations of a prompt set (cached once), optionally weighted toward what an experiment's "
        "drafts got rejected for; or train an EAGLE-3 head that drafts from the target's hidden states. A "
        "worker runs the job; when it ends the trained draft is measured on held-out prompts and timed "
        "against the draft it started from (a head: against the target alone)."
    )
    left, right = st.columns([2, 3])
    with left:
        _form()
    with right:
        st.subheader("Training jobs")
        frame = training.jobs(store())
        busy = not frame.empty and frame["status"].isin([RUNNING, QUEUED]).any()
        st.fragment(run_every=REFRESH_SECONDS if busy else None)(_jobs)()


def _launcher() -> str:
    from pages.widgets.access import launcher

    return launcher()
