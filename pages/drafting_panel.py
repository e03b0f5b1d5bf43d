"""How many tokens each round drafted, per run: a heuristic or confidence drafter varies k_r from round to round
(and every drafter drafts fewer in a prompt's last round), so the per-position charts read against this."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from pages.common import store
from storage import queries as q


def k_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """run, k, rounds, share for every finished speculative run (k_r distribution)."""
    frames = []
    for r in runs[(runs["kind"] == "speculative") & (runs["rounds"] > 0)].itertuples():
        label = str(r.sweep_label) if isinstance(getattr(r, "sweep_label", None), str) else f"run {r.run_id}"
        frames.append(q.k_distribution(store(), int(r.run_id)).assign(run=label))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["k", "rounds", "share", "run"])


def render_k_distribution(runs: pd.DataFrame) -> None:
    """A bar chart of k_r per run, shown when some run's drafter varies k (more than a last-round cut)."""
    frame = k_frame(runs)
    varying = "drafter" in runs and runs["drafter"].fillna("model").str.match(r"(heuristic|confidence|prompt)").any()
    if frame.empty or not varying:
        return
    st.subheader("Tokens drafted per round (k_r)")
    st.caption("A heuristic, confidence or prompt-lookup drafter chooses k_r round by round; the per-position "
               "acceptance above is conditional on the rounds that reached each position.")
    chart = alt.Chart(frame).mark_bar().encode(
        x=alt.X("k:O", title="k_r (drafts in the round)"), y=alt.Y("share:Q", title="share of rounds", axis=alt.Axis(format="%")),
        color=alt.Color("run:N", title="run", legend=alt.Legend(labelLimit=0)), xOffset="run:N",
        tooltip=["run", "k", "rounds", alt.Tooltip("share:Q", format=".1%")])
    st.altair_chart(chart, width="stretch")
