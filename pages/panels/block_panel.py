"""A block-verification run's breakdown on the detail page (SPEC "Verification rule"), under the run's acceptance by
position: per draft position, the rounds whose draft block verification accepted and the standard rule (on the same
drafts with the same uniforms) rejected, and the reverse, with one line on the acceptance length each rule reached.
A standard run shows nothing here. Read from storage only (storage/records/block_positions.py): no model loads."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from pages.widgets import charts
from pages.widgets.common import cached, chart_with_csv
from storage.records.block_positions import block_gain_by_position

TITLE = "Block verification: what it accepted that the standard rule rejected"


def is_block(run: pd.Series) -> bool:
    return str(run.get("verify") or "") == "block"


def gain_sentence(run: pd.Series) -> str | None:
    """'Block accepted 1.84 drafts per round, the standard rule 1.62 on the same drafts (+13.6 %).' (None before a
    round is stored)."""
    rounds, block, standard = run.get("rounds"), run.get("accepted"), run.get("accepted_standard")
    if any(v is None or v != v for v in (rounds, block, standard)) or not rounds:
        return None
    per_block, per_standard = float(block) / float(rounds), float(standard) / float(rounds)
    change = f" ({(per_block / per_standard - 1) * 100:+.1f} %)" if per_standard else ""
    return (
        f"Block verification accepted **{per_block:.2f}** drafts per round; the standard rule, on the same drafts "
        f"with the same uniforms, would have accepted **{per_standard:.2f}**{change}."
    )


def render_block(runs: pd.DataFrame, run_id: int, stamp: tuple) -> None:
    """The chart and the acceptance-length line of run `run_id` when it verified with block verification."""
    rows = runs[runs["run_id"] == run_id]
    if rows.empty or not is_block(rows.iloc[0]):
        return
    st.subheader(TITLE)
    sentence = gain_sentence(rows.iloc[0])
    if sentence:
        st.markdown(sentence)
    frame = cached(block_gain_by_position, run_id, stamp=stamp)
    if frame.empty:
        st.caption("No round recorded yet.")
        return
    chart_with_csv(charts.block_gain_by_position(frame), frame, f"run{run_id}_block_gain_by_position.csv")
    st.caption(
        "Both verdicts come from the same round: the standard rule's is what it would have accepted on the drafts "
        "block verification judged, with the same uniforms. Block looks at the whole block: a draft the standard "
        "rule stops at may stand, and (less often) the reverse; in expectation block accepts at least as many."
    )
