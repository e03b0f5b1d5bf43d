"""Round explorer: one prompt's output token by token, coloured by how each token was produced, and one
round's proposals with their probabilities under both models."""
from __future__ import annotations

import html

import pandas as pd
import streamlit as st

from pages import charts
from pages.common import chart_with_csv, csv_download, empty_state, experiment_label, query_ids, run_label, select_id, store
from storage import queries as q

KIND_LABELS = {"first": "first token (target prefill, no round)", "accepted": "accepted draft",
               "correction": "correction (after a rejection)", "bonus": "bonus (all drafts accepted)"}


def _visible(text: str) -> str:
    """Token text with whitespace made visible, HTML-escaped."""
    shown = text.replace(" ", "·").replace("\t", "→").replace("\n", "↵\n") if not text.strip() else text
    return html.escape(shown)


def output_html(output: pd.DataFrame, selected_round: int | None) -> str:
    """The output as spans coloured by kind; the selected round is outlined."""
    spans = []
    for token in output.itertuples():
        color = charts.KIND_COLORS.get(token.kind, "#616161")
        is_selected = selected_round is not None and pd.notna(token.round_index) and int(token.round_index) == selected_round
        outline = "outline:2px solid #ef6c00;" if is_selected else ""
        round_text = f"round {int(token.round_index)}" if pd.notna(token.round_index) else "no round"
        title = html.escape(f"{round_text} · {token.kind} · id {token.token_id}", quote=True)
        spans.append(f'<span title="{title}" style="color:{color};{outline}border-bottom:1px dotted {color};">'
                     f"{_visible(token.text)}</span>")
    return ('<div style="font-family:monospace;white-space:pre-wrap;line-height:1.7;padding:0.6rem;'
            'border:1px solid #e0e0e0;border-radius:0.4rem;">' + "".join(spans) + "</div>")


def legend_html(output: pd.DataFrame) -> str:
    counts = output["kind"].value_counts()
    return " ".join(f'<span style="color:{charts.KIND_COLORS[kind]};font-weight:600;">■ {label} '
                    f"({int(counts.get(kind, 0))})</span>&nbsp;&nbsp;" for kind, label in KIND_LABELS.items())


def render() -> None:
    st.title("Round explorer")
    listing = q.experiments(store())
    if listing.empty:
        empty_state("No experiments yet: the round explorer shows the rounds of a finished speculative run.")
        return
    c1, c2, c3 = st.columns(3)
    ids = [int(i) for i in listing["experiment_id"]]
    experiment_id = select_id("Experiment", "experiment", ids, experiment_label(listing), container=c1)
    runs = q.runs(store(), experiment_id)
    speculative = runs[runs["kind"] == "speculative"]
    if speculative.empty:
        st.info("This experiment has no speculative runs.")
        return
    sweep_variable = listing.set_index("experiment_id").loc[experiment_id, "sweep_variable"] or "k"
    run_id = select_id("Run", "run", [int(i) for i in speculative["run_id"]], run_label(runs, sweep_variable),
                       container=c2)
    per_prompt = q.per_prompt(store(), run_id)
    if per_prompt.empty:
        st.info("This run has no outputs yet; pick a finished run.", icon=":material/hourglass:")
        return
    prompts = dict(zip(per_prompt["prompt_index"].astype(int), per_prompt["prompt"]))
    prompt_index = select_id("Prompt", "prompt", list(prompts), lambda i: f"{i}: {str(prompts[i])[:60]}",
                             container=c3)

    output = q.prompt_output(store(), run_id, prompt_index)
    rounds = sorted(int(r) for r in output["round_index"].dropna().unique())
    st.markdown(f"**Prompt {prompt_index}:** `{str(prompts[prompt_index])[:500]}`")
    selected = None
    if rounds:
        wanted = query_ids("round")
        default = wanted[0] if wanted and wanted[0] in rounds else rounds[0]
        selected = st.select_slider("Round", rounds, value=default, key="select_round") if len(rounds) > 1 else rounds[0]
        st.query_params["round"] = str(selected)
    st.markdown(legend_html(output), unsafe_allow_html=True)
    st.markdown(output_html(output, selected), unsafe_allow_html=True)
    csv_download(output, f"run{run_id}_prompt{prompt_index}_output.csv", "Download output tokens (CSV)")
    if selected is None:
        st.caption("No rounds in this output.")
        return

    st.subheader(f"Round {selected}: the draft's proposals")
    proposals = q.round_proposals(store(), run_id, prompt_index, selected)
    emitted = output[output["round_index"] == selected]
    st.caption("Emitted this round: " + " ".join(f"`{_visible(t)}` ({k})" for t, k in zip(emitted["text"], emitted["kind"])))
    if proposals.empty:
        st.caption("No proposals were recorded for this round.")
        return
    shown = proposals.assign(token=proposals["text"].map(lambda t: repr(t)[1:-1] if isinstance(t, str) else t))
    left, right = st.columns([3, 2])
    with left:
        st.dataframe(shown[["position", "token", *[c for c in proposals if c not in ("position", "text")]]],
                     hide_index=True, width="stretch", key="proposals_table", column_config={
                         c: st.column_config.NumberColumn(format="%.4f") for c in ("p_draft", "p_target", "beta", "kl")})
        st.caption("A draft token is accepted with probability min(1, p_target / p_draft) (greedy: iff it is the "
                   "target's argmax); β = Σ min(p_draft, p_target) is its expected acceptance; tokens after the "
                   "first rejection are discarded, never verified.")
    with right:
        chart_with_csv(charts.proposal_probabilities(proposals), proposals,
                       f"run{run_id}_prompt{prompt_index}_round{selected}_proposals.csv")
