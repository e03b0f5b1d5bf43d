"""A token-tree run's breakdowns on the detail page (SPEC "Token trees"), under the run's acceptance by position:
acceptance by depth split by the sibling rank of the accepted node, and how often the accepted path left the draft's
top-1 chain (accepted_off_chain_share). A chain run shows nothing here. Read from storage only: no model loads."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.config.tree_shape import is_tree
from pages.widgets import charts
from pages.widgets.common import cached, chart_with_csv
from storage.records.columns import show
from storage.records.tree_breakdowns import acceptance_by_sibling_rank

TITLE = "Token tree: acceptance by depth and sibling rank"


def off_chain_sentence(run: pd.Series) -> str:
    """One line on the run's tree and its off-chain share, e.g. '0.210 of rounds ... (tree_topk 3, tree_tokens 8)'."""
    tokens = run.get("tree_tokens")
    verified = "every node" if tokens is None or tokens != tokens or int(tokens) == 0 else f"{int(tokens)} nodes"
    shape = (
        f"tree_topk {int(run['tree_topk'])} branches per node, {verified} verified per round, depth k={int(run['k'])}"
    )
    share = run.get("accepted_off_chain_share")
    return (
        f"**{show('accepted_off_chain_share', share)}** of rounds accepted a path that left the draft's top-1 "
        f"chain ({shape}): the rank 1 and above parts of the bars are what the tree won over a chain."
    )


def formula_note(runs: pd.DataFrame) -> str | None:
    """Why the speedup chart draws no formula for an experiment's token-tree runs (None when it has none): the
    formula, (1 − α^(k+1)) / ((1 − α)(1 + k/c)), models a chain of k drafts, one verified per depth."""
    trees = [int(r["tree_topk"]) for _, r in runs[runs["kind"] == "speculative"].iterrows() if is_tree(r)]
    if not trees:
        return None
    return (
        f"The article's formula (dashed grey, and each run's formula prediction) models a chain of k drafts: it does "
        f"not model token trees, so the tree runs (tree_topk {', '.join(map(str, sorted(set(trees))))}) have none and "
        f"are left out of its pooled α and c. Their cost-aware prediction (dashed purple) reads the run's own tokens "
        f"per round and round times, so it stands."
    )


def render_tree(runs: pd.DataFrame, run_id: int, stamp: tuple) -> None:
    """The chart and the off-chain share of run `run_id` when it drafted a tree (tree_topk above 1)."""
    rows = runs[runs["run_id"] == run_id]
    if rows.empty or not is_tree(rows.iloc[0]):
        return
    run = rows.iloc[0]
    st.subheader(TITLE)
    st.markdown(off_chain_sentence(run))
    frame = cached(acceptance_by_sibling_rank, run_id, stamp=stamp)
    if frame.empty:
        st.caption("No tree node accepted yet.")
        return
    chart_with_csv(charts.acceptance_by_sibling_rank(frame), frame, f"run{run_id}_acceptance_by_sibling_rank.csv")
    st.caption(
        "Each bar is the depth's accepted / reached (rounds whose path got there), split by the accepted node's rank "
        "among its siblings (0: the draft's top-1)."
    )
