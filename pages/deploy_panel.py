"""The "Use these settings" panel: a measured run's equivalent vLLM, SGLang, llama.cpp and transformers settings,
one tab per engine, from storage.deploy (the document `draftlab export --format deploy` prints)."""
from __future__ import annotations

import json

import streamlit as st

from storage.deploy import DeployError, deploy_document

TABS = (("vllm", "vLLM"), ("sglang", "SGLang"), ("llama_cpp", "llama.cpp"), ("transformers", "transformers"))


def _summary(doc: dict) -> str:
    cfg, measured = doc["configuration"], doc["measured"]
    which = "the best run" if doc["chosen"] == "best" else "run"
    draft = f"draft `{cfg['draft']}` → " if cfg.get("draft") else ""
    sampling = ("greedy" if cfg["greedy"] else
                f"temperature {cfg['temperature']:g}, top-k {cfg['top_k'] or 'off'}, top-p {cfg['top_p']:g}")
    speed = f" · measured {measured['speedup']:.2f}×" if measured.get("speedup") is not None else ""
    return (f"From {which} #{doc['run_id']}: {draft}target `{cfg['target']}`, drafter `{cfg['drafter']}`, "
            f"k = {cfg['k']}, {sampling}{speed}. Each tab says what its engine cannot express.")


def render_deploy_panel(store, experiment_id: int, run_id: int | None = None, expanded: bool = False) -> None:
    """A "Use these settings" expander for `run_id` (None: the experiment's best run by the verdict)."""
    with st.expander("Use these settings", expanded=expanded, icon=":material/rocket_launch:"):
        try:
            doc = deploy_document(store, experiment_id, run_id)
        except (DeployError, KeyError) as exc:
            reason = str(exc) if isinstance(exc, DeployError) else f"no experiment {experiment_id}"
            st.caption(f"No settings to carry to production yet: {reason}.")
            return
        st.caption(_summary(doc))
        for tab, (key, label) in zip(st.tabs([label for _, label in TABS]), TABS):
            engine = doc["engines"][key]
            with tab:
                st.code(engine["snippet"], language=engine["language"])
                if engine.get("request"):
                    st.caption("Sampling, sent with every request (/v1/completions):")
                    st.code(json.dumps(engine["request"]), language="json")
                for note in engine["notes"]:
                    st.caption(note)
        st.download_button("Download as JSON", json.dumps(doc, indent=2).encode("utf-8"),
                           file_name=f"experiment{experiment_id}_run{doc['run_id']}_deploy.json",
                           mime="application/json", key=f"deploy_json_{experiment_id}_{doc['run_id']}",
                           icon=":material/download:", on_click="ignore")
