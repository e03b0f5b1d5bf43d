"""How many tokens each round drafted, per run: a heuristic or confidence drafter varies k_r from round to round
(and every drafter drafts fewer in a prompt's last round), so the per-position charts read against this."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from pages.widgets import charts
from pages.widgets.common import draw, store
from storage.records import queries as q


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
    st.caption(
        "A heuristic, confidence or prompt-lookup drafter chooses k_r round by round; the per-position "
        "acceptance above is conditional on the rounds that reached each position."
    )
    chart = charts.k_distribution(frame)
    draw(chart, width="stretch")
