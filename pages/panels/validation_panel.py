"""Validation on the detail page: a button that queues the verdict's choice (storage/analysis/verdict.py: the best, or
the cheaper configuration statistically tied with it) on held-out prompts (the other split of a built-in set, or an
uploaded file), and, on a validation experiment, tune against validation with the verdict in words. The worker runs what
the button queues, like any experiment."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.errors import DraftLabError
from engine.text.prompt_sets import Prompt, set_name
from pages.widgets.common import nav_page, store, table
from pages.widgets.prefill import md_text
from pages.widgets.uploads import UPLOAD_TYPES
from storage.analysis.validation import ValidationError, held_out_prompts, validation_plan, validation_result
from storage.jobs.experiments import enqueue_experiment

_COLUMNS = ["k", "speedup", "speedup_ci_lo", "speedup_ci_hi", "alpha", "tokens_per_round", "accepted", "rejected", "c"]


def _held_out_file(upload) -> tuple[str, list[Prompt]]:
    """(saved path, prompts) of an uploaded held-out file, saved where the worker can read it."""
    from engine.text.prompt_sets import load_prompt_file  # pure Python: no model, no torch
    from pages.widgets.uploads import save_upload

    path = save_upload(upload.name, upload.getvalue())
    prompts = load_prompt_file(path)
    if not prompts:
        raise ValidationError(f"{upload.name} holds no prompts")
    return str(path), prompts


def render_validation(experiment: dict, verdict: dict) -> None:
    """The validate button (tuning experiments) or the tune-versus-validation verdict (validation ones)."""
    if experiment.get("validates"):
        _render_result(int(experiment["experiment_id"]))
        return
    if verdict.get("best") is None:
        return
    eid = int(experiment["experiment_id"])
    with st.expander("Validate on held-out prompts", icon=":material/fact_check:"):
        try:
            default = held_out_prompts(experiment["prompts"])
        except ValidationError:
            default = None
        st.caption(
            "Reruns the verdict's choice (the best, or the cheaper configuration tied with it) and its baseline "
            "on prompts the tuning never saw, as a new experiment linked to this one; the worker runs it."
        )
        upload = (
            None
            if default
            else st.file_uploader(
                "Held-out prompts (.jsonl, conversations too / .csv / .txt / .parquet / .arrow)",
                type=UPLOAD_TYPES,
                key="validation_file",
            )
        )
        if st.button(
            "Validate" + (f" on {set_name(default)}" if default else ""),
            key="validate",
            disabled=not default and upload is None,
        ):
            try:
                texts = None
                spec = default
                if upload is not None:
                    spec, uploaded = _held_out_file(upload)
                plan = validation_plan(store(), eid, spec)
                if upload is not None:  # conversations: rendered as the tuning experiment's were, then frozen
                    from pages.widgets.pair_check import render_prompts

                    texts = render_prompts(plan["target"], uploaded, plan["chat_template"])
                from pages.widgets.access import launcher

                vid = enqueue_experiment(store(), **plan, prompt_texts=texts, launched_by=launcher())
            except (ValidationError, DraftLabError) as exc:  # DraftLabError: a malformed held-out file
                st.error(md_text(str(exc)), icon=":material/error:")
            else:
                st.success(f"Queued validation experiment #{vid}.", icon=":material/check:")
                st.page_link(
                    nav_page("experiment"), label=f"Open experiment #{vid}", query_params={"experiment": str(vid)}
                )


def _render_result(validation_id: int) -> None:
    try:
        result = validation_result(store(), validation_id)
    except ValidationError as exc:
        st.info(str(exc))
        return
    st.subheader("Validation")
    holds = result["holds"]
    message = md_text(f"Validates experiment #{result['validates']}: {result['reason']}")
    (st.success if holds else st.warning if holds is False else st.info)(message)
    names = [
        f"#{result['validates']}, tuned on {result['tune_set']}",
        f"#{result['experiment_id']}, validated on {result['validation_set']}",
    ]
    rows = pd.DataFrame([result["tune"][_COLUMNS], result["validation"][_COLUMNS]]).assign(experiment=names)
    # Headers, help and formats from storage/records/columns.py (not the raw column names), the page's width.
    table(
        rows,
        ["experiment", *_COLUMNS],
        "validation_table",
        experiment=st.column_config.TextColumn(
            "experiment", help="the tuning experiment, then its validation", pinned=True
        ),
    )
