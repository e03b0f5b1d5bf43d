"""The "Use these settings" panel: a measured run's equivalent vLLM, SGLang, llama.cpp and transformers settings,
one tab per engine, from storage.serving.deploy (the document `draftlab export --format deploy` prints): the verdict's
choice (the one rule: the cheapest configuration tied with the best that is measurably faster than the target alone; a
grid's: the k schedule's entry for the batch size picked, the smallest first) with the verdict's caveats (ties, an
interval too wide to choose by). The test's max new tokens is carried only when the checkbox asks for it."""

from __future__ import annotations

import json

import streamlit as st

from pages.panels.advice import panel_advice
from pages.widgets.prefill import md_text
from storage.records import queries as q
from storage.serving.deploy import DeployError, deploy_document

TABS = (("vllm", "vLLM"), ("sglang", "SGLang"), ("llama_cpp", "llama.cpp"), ("transformers", "transformers"))


def _summary(doc: dict) -> str:
    cfg, measured = doc["configuration"], doc["measured"]
    which = {"best": "the best run", "cheaper tied": "the cheaper run tied with the best"}.get(doc["chosen"], "run")
    if doc.get("batch_size") is not None:  # a grid: the schedule's entry for this batch size
        which += f" at batch {doc['batch_size']} (the k schedule's entry there; vLLM's tab carries every batch size)"
    draft = f"draft `{cfg['draft']}` → " if cfg.get("draft") else ""
    sampling = (
        "greedy"
        if cfg["greedy"]
        else f"temperature {cfg['temperature']:g}, top-k {cfg['top_k'] or 'off'}, top-p {cfg['top_p']:g}"
    )
    speed = f" · measured {measured['speedup']:.2f}×" if measured.get("speedup") is not None else ""
    length = f", {cfg['max_new_tokens']} new tokens (the test's)" if cfg.get("max_new_tokens") is not None else ""
    return (
        f"From {which} #{doc['run_id']}: {draft}target `{cfg['target']}`, drafter `{cfg['drafter']}`, "
        f"k = {cfg['k']}, {sampling}{length}{speed}. Each tab says what its engine cannot express."
    )


def render_deploy_panel(store, experiment_id: int, run_id: int | None = None, expanded: bool = False) -> None:
    """A "Use these settings" expander for `run_id` (None: the experiment's best run by the verdict)."""
    with st.expander("Use these settings", expanded=expanded, icon=":material/rocket_launch:"):
        with_length = st.checkbox(
            "Copy the test's max new tokens",
            value=False,
            key=f"deploy_max_new_tokens_{experiment_id}_{run_id}",
            help="The experiment stopped every prompt at its max new tokens to measure; that "
            "is not a serving length, so it is left out unless checked.",
        )
        experiment = q.experiment(store, experiment_id)
        sizes = q.grid_sizes(experiment or {}) if run_id is None else None
        batch_size = (
            st.selectbox(
                "For batch size",
                sizes,
                index=0,
                key=f"deploy_batch_{experiment_id}",
                help="A grid: the engines that take one k take the k schedule's entry for this batch size.",
            )
            if sizes
            else None
        )
        if experiment is None:  # checked, not caught: a KeyError from deploy is a bug, never "no experiment"
            st.caption(f"No settings to carry to production yet: no experiment {experiment_id}.")
            return
        try:
            doc = deploy_document(store, experiment_id, run_id, with_length, batch_size)
        except DeployError as exc:
            st.caption(f"No settings to carry to production yet: {exc}.")
            return
        st.caption(_summary(doc))
        for caveat in doc["caveats"]:
            st.warning(md_text(panel_advice(caveat)), icon=":material/balance:")
        for tab, (key, _label) in zip(st.tabs([label for _, label in TABS]), TABS):
            engine = doc["engines"][key]
            with tab:
                st.code(engine["snippet"], language=engine["language"])
                if engine.get("request"):
                    st.caption("Sampling, sent with every request (/v1/completions):")
                    st.code(json.dumps(engine["request"]), language="json")
                for note in engine["notes"]:
                    st.caption(panel_advice(note))
        st.download_button(
            "Download as JSON",
            json.dumps(doc, indent=2).encode("utf-8"),
            file_name=f"experiment{experiment_id}_run{doc['run_id']}_deploy.json",
            mime="application/json",
            key=f"deploy_json_{experiment_id}_{doc['run_id']}",
            icon=":material/download:",
            on_click="ignore",
        )
