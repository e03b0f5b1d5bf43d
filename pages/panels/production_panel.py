"""Production against the lab (experiment detail): each imported series of a serving engine's counters
(`draftlab import-metrics`) next to the lab run of the same k, per draft position with the lab's 95 % interval.
The dashboard never fetches metrics itself: series arrive through the CLI."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from pages.widgets import charts
from pages.widgets.common import cached, chart_with_csv
from storage.records import production

TABLE = {
    "label": "series",
    "source": "source",
    "seconds": "window (s)",
    "drafts": "drafts",
    "draft_acceptance_rate": "draft acceptance rate",
    "alpha": "α",
    "tokens_per_round": "tokens per round",
    "run_id": "lab run",
    "lab_alpha": "lab α",
    "lab_draft_acceptance_rate": "lab draft acceptance rate",
    "lab_tokens_per_round": "lab tokens per round",
}


def position_frame(experiment_id: int, table: pd.DataFrame) -> pd.DataFrame:
    """position, source, kind, conditional, lo, hi: the lab run's rows (kind 'lab') and each series' points (kind
    'production'; a series may be labelled anything, "lab" included)."""
    frames = []
    prod = cached(production.positions, experiment_id, experiment_id=experiment_id)
    for row in table.itertuples(index=False):
        mine = prod[prod["series_id"] == row.series_id]
        frames.append(
            pd.DataFrame(
                {
                    "position": mine["position"],
                    "source": row.label,
                    "kind": "production",
                    "conditional": mine["conditional"],
                    "lo": None,
                    "hi": None,
                }
            )
        )
    run_ids = sorted({int(r) for r in table["run_id"].dropna()})
    if len(run_ids) == 1:  # one lab run to draw the interval of; several would need one panel each
        lab = cached(production.lab_positions, run_ids[0], experiment_id=experiment_id)
        frames.append(
            lab.assign(source=f"lab (run {run_ids[0]})", kind="lab")[
                ["position", "source", "kind", "conditional", "lo", "hi"]
            ]
        )
    frames = [f for f in frames if not f.empty]
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["position", "source", "kind", "conditional", "lo", "hi"])
    )


def render_production(experiment_id: int) -> None:
    table = cached(production.series, experiment_id, experiment_id=experiment_id)
    if table.empty:
        return
    st.subheader("Production against the lab")
    st.caption(
        "Counters imported from a serving engine's /metrics page (`draftlab import-metrics`), converted to "
        "DraftLab's definitions: α = accepted / (accepted + rejected rounds), per position accepted / rounds "
        "that reached it. The grey bars are the lab run's 95 % interval over prompts."
    )
    shown = table[[c for c in TABLE if c in table]].rename(columns=TABLE)
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        key="production_table",
        column_config={
            TABLE[c]: st.column_config.NumberColumn(format="%.3f")
            for c in (
                "draft_acceptance_rate",
                "alpha",
                "tokens_per_round",
                "lab_alpha",
                "lab_draft_acceptance_rate",
                "lab_tokens_per_round",
            )
        },
    )
    frame = position_frame(experiment_id, table)
    if frame.empty:
        st.info(
            "The server counted no per-position acceptance (vLLM's "
            "spec_decode_num_accepted_tokens_per_pos), so only the totals above compare.",
            icon=":material/info:",
        )
        return
    chart_with_csv(charts.production_positions(frame), frame, f"experiment{experiment_id}_production.csv")
