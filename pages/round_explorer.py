"""Round explorer: one prompt's output token by token, coloured by how each token was produced, and one
round's proposals with their probabilities under both models."""

from __future__ import annotations

import html
import re

import pandas as pd
import streamlit as st

from pages.widgets import charts
from pages.widgets.common import (
    cached,
    chart_with_csv,
    csv_download,
    draw,
    empty_state,
    experiment_label,
    query_ids,
    run_label,
    run_stamp,
    select_id,
    version,
)
from storage.analysis import catalog

KIND_LABELS = {
    "first": "first token, from the target's prefill (no round)",
    "accepted": "accepted draft",
    "correction": "correction after a rejection",
    "bonus": "bonus, every draft accepted",
}
PICKER_CHARS = 60  # a prompt's text in the prompt picker, on one line


def _visible(text: str) -> str:
    """Token text with whitespace made visible, HTML-escaped."""
    shown = text.replace(" ", "·").replace("\t", "→").replace("\n", "↵\n") if not text.strip() else text
    return html.escape(shown)


def output_html(output: pd.DataFrame, selected_round: int | None) -> str:
    """The output as spans coloured by kind; the selected round is outlined."""
    spans = []
    for token in output.itertuples():
        color = charts.KIND_COLORS.get(token.kind, "#616161")
        is_selected = (
            selected_round is not None and pd.notna(token.round_index) and int(token.round_index) == selected_round
        )
        outline = "outline:2px solid #ef6c00;" if is_selected else ""
        round_text = f"round {int(token.round_index)}" if pd.notna(token.round_index) else "no round"
        title = html.escape(f"{round_text} · {token.kind} · id {token.token_id}", quote=True)
        spans.append(
            f'<span title="{title}" style="color:{color};{outline}border-bottom:1px dotted {color};">'
            f"{_visible(token.text)}</span>"
        )
    return (
        '<div style="font-family:monospace;white-space:pre-wrap;line-height:1.7;padding:0.6rem;'
        'border:1px solid #e0e0e0;border-radius:0.4rem;">' + "".join(spans) + "</div>"
    )


def readable(text) -> bool:
    """Output a person can read as text: three or more different words of letters (not `↵ #` repeated)."""
    words = re.findall(r"[^\W\d_]{2,}", str(text) if isinstance(text, str) else "")
    return len({w.lower() for w in words}) >= 3


def opening_prompt(per_prompt: pd.DataFrame) -> int:
    """The prompt the explorer opens on: of the prompts with a readable output, the one with the most rejected
    drafts (where there is most to see), the first such on a tie; without a readable output, the most rejected.
    per_prompt: prompt_index, rejected, text (storage.records.queries.per_prompt)."""
    return _opening(per_prompt)[0]


def opening_reason(per_prompt: pd.DataFrame) -> str:
    """Why the explorer opens on `opening_prompt`, in a sentence the page shows under the picker."""
    index, rejected, among_readable = _opening(per_prompt)
    which = "of the outputs that read as text, the one" if among_readable else "the output"
    return (
        f"Opened on prompt {index}: {which} with the most rejected drafts ({rejected}), where there is most to "
        f"see. Pick another prompt above."
    )


def _opening(per_prompt: pd.DataFrame) -> tuple[int, int, bool]:
    """(the opening prompt, its rejected drafts, whether it was picked among readable outputs)."""
    frame = per_prompt.assign(
        readable=per_prompt["text"].map(readable), rejected=per_prompt["rejected"].fillna(0)
    ).sort_values("prompt_index")
    among_readable = bool(frame["readable"].any())
    pool = frame[frame["readable"]] if among_readable else frame
    first = pool.sort_values("rejected", ascending=False, kind="stable").iloc[0]
    return int(first["prompt_index"]), int(first["rejected"]), among_readable


def picker_label(index: int, prompt) -> str:
    """A prompt as the picker lists it: its index and its first PICKER_CHARS characters on one line, each line
    break shown as ⏎ (a select box joins lines: "import logginglogger = …")."""
    text = re.sub(r"\r?\n", " ⏎ ", str(prompt)).replace("\t", " ")
    return f"{index}: {text[:PICKER_CHARS]}".rstrip() + ("…" if len(text) > PICKER_CHARS else "")


def legend_html(output: pd.DataFrame) -> str:
    """The colour key of the kinds this output has, each with its count of tokens."""
    counts = output["kind"].value_counts()
    return " ".join(
        f'<span style="color:{charts.KIND_COLORS[kind]};font-weight:600;">■ {label}: '
        f"{int(counts[kind])}</span>&nbsp;&nbsp;"
        for kind, label in KIND_LABELS.items()
        if kind in counts
    )


def render() -> None:
    st.title("Round explorer")
    listing = cached(catalog.experiments)
    if listing.empty:
        empty_state("No experiments yet: the round explorer shows the rounds of a finished speculative run.")
        return
    c1, c2, c3 = st.columns(3)
    ids = [int(i) for i in listing["experiment_id"]]
    experiment_id = select_id("Experiment", "experiment", ids, experiment_label(listing), container=c1)
    runs = cached("runs", experiment_id, stamp=version(experiment_id))
    speculative = runs[runs["kind"] == "speculative"]
    if speculative.empty:
        st.info("This experiment has no speculative runs.")
        return
    sweep_variable = listing.set_index("experiment_id").loc[experiment_id, "sweep_variable"] or "k"
    run_id = select_id(
        "Run", "run", [int(i) for i in speculative["run_id"]], run_label(runs, sweep_variable), container=c2
    )
    if run_id is None:
        return
    stamp = run_stamp(runs, run_id)  # a finished run's rounds are read once, then every slider move is a cache hit
    per_prompt = cached("per_prompt", run_id, stamp=stamp)
    if per_prompt.empty:
        st.info("This run has no outputs yet; pick a finished run.", icon=":material/hourglass:")
        return
    prompts = dict(zip(per_prompt["prompt_index"].astype(int), per_prompt["prompt"]))
    opening = opening_prompt(per_prompt)
    prompt_index = select_id(
        "Prompt", "prompt", list(prompts), lambda i: picker_label(i, prompts[i]), container=c3, default=opening
    )
    if prompt_index == opening:
        st.caption(opening_reason(per_prompt))

    output = cached("prompt_output", run_id, prompt_index, stamp=stamp)
    rounds = sorted(int(r) for r in output["round_index"].dropna().unique())
    st.markdown(f"**Prompt {prompt_index}:**")
    st.code(str(prompts[prompt_index]), language=None, wrap_lines=True)  # its line breaks kept, nothing interpreted
    selected = None
    chart_key = _token_chart_key((run_id, prompt_index))
    if rounds:
        _follow_click(rounds, chart_key)
        wanted = query_ids("round")
        default = wanted[0] if wanted and wanted[0] in rounds else rounds[0]
        if len(rounds) > 1:
            if st.session_state.get("select_round") not in rounds:  # first view, or another run or prompt
                st.session_state["select_round"] = default
            selected = st.select_slider("Round", rounds, key="select_round", on_change=_forget_click)
        else:
            selected = rounds[0]
        if query_ids("round")[:1] != [selected]:
            st.query_params["round"] = str(selected)
    st.markdown(legend_html(output), unsafe_allow_html=True)
    if len(output):
        st.caption("Click a token to select the round that emitted it.")
        draw(
            charts.token_chart(charts.token_layout(output), selected),
            width="content",
            on_select="rerun",
            selection_mode=charts.TOKEN_SELECTION,
            key=chart_key,
        )
    with st.expander("The output as text"):
        st.markdown(output_html(output, selected), unsafe_allow_html=True)
    csv_download(output, f"run{run_id}_prompt{prompt_index}_output.csv", "Download output tokens (CSV)")
    if selected is None:
        st.caption("No rounds in this output.")
        return

    st.subheader(f"Round {selected}: the draft's proposals")
    proposals = cached("round_proposals", run_id, prompt_index, selected, stamp=stamp)
    emitted = output[output["round_index"] == selected]
    st.caption(
        "Emitted this round: " + " ".join(f"`{_visible(t)}` ({k})" for t, k in zip(emitted["text"], emitted["kind"]))
    )
    if proposals.empty:
        st.caption("No proposals were recorded for this round.")
        return
    if proposals["sibling_rank"].isna().all():  # a chain: no ranks (a token tree's path has one per depth)
        proposals = proposals.drop(columns="sibling_rank")
    shown = proposals.assign(token=proposals["text"].map(lambda t: repr(t)[1:-1] if isinstance(t, str) else t))
    shown = shown[["position", "token", *[c for c in proposals if c not in ("position", "text")]]]
    # Sized to its content: every row shown (no inner scroll), every column at its width (the outcome never cut).
    st.dataframe(
        shown,
        hide_index=True,
        width="content",
        height=TABLE_ROW * (len(shown) + 1) + 3,
        key="proposals_table",
        column_config={
            "token": st.column_config.TextColumn(width="medium"),
            "outcome": st.column_config.TextColumn(width="small"),
            **{c: st.column_config.NumberColumn(format="%.4f") for c in ("p_draft", "p_target", "beta", "kl")},
        },
    )
    left, right = st.columns([2, 3])
    with left:
        st.caption(
            "A draft token is accepted with probability min(1, p_target / p_draft) (greedy: iff it is the "
            "target's argmax); β = Σ min(p_draft, p_target) is its expected acceptance; tokens after the "
            "first rejection are discarded, never verified."
        )
    with right:
        chart_with_csv(
            charts.proposal_probabilities(proposals),
            proposals,
            f"run{run_id}_prompt{prompt_index}_round{selected}_proposals.csv",
        )


TABLE_ROW = 35  # st.dataframe's row height in pixels (header included)


def _token_chart_key(view: tuple) -> str:
    """The token chart's widget key: a new one for each run and prompt shown and after each move of the round
    slider, so the chart's selection only ever holds a click made since then (a keyed chart keeps its selection
    across reruns, and clicking the token already selected changes nothing Streamlit would send)."""
    state = st.session_state
    if state.get("token_chart_view") != view:
        state["token_chart_view"] = view
        _forget_click()
    return f"token_chart_{state['token_chart_generation']}"


def _forget_click() -> None:
    """The round slider moved (or the view changed): drop the chart's last click, so that clicking the same
    token again selects its round again, and the slider stays where it was put."""
    st.session_state["token_chart_generation"] = st.session_state.get("token_chart_generation", 0) + 1


def _follow_click(rounds: list[int], chart_key: str) -> None:
    """A click on the token chart (its selection, read from the last run's widget state) moves the round slider
    and the URL to the clicked token's round."""
    picked = charts.selected_round(st.session_state.get(chart_key), rounds)
    if picked is None:
        return
    st.session_state["select_round"] = picked
    st.query_params["round"] = str(picked)
