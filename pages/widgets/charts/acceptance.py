"""Acceptance breakdowns, why drafts are rejected: conditional acceptance per draft position and acceptance per
token type (each bar with its n, small samples faded), a token tree's acceptance by depth and sibling rank, what
block verification accepted that the standard rule rejected per position, and the lab's acceptance by position
against production's or a server's. Drawn on the experiment detail page: its acceptance section
(acceptance_by_position, acceptance_by_type), the token tree panel (acceptance_by_sibling_rank), the block
verification panel (block_gain_by_position), and the production and confirm panels (production_positions)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from pages.widgets.charts.look import BOTTOM, HEIGHT, count_labels, is_value


def acceptance_by_position(frame: pd.DataFrame) -> alt.LayerChart:
    """Conditional acceptance per draft position, each bar labelled with its n (tokens that reached it); bars from
    fewer than MIN_SAMPLE tokens are faded and starred. frame: position, reached, accepted, conditional[, ...]."""
    base = (
        alt.Chart(frame)
        .transform_calculate(**count_labels("reached"))
        .encode(
            alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
            alt.Y(
                "conditional:Q",
                title="accepted / reached",
                scale=alt.Scale(domain=[0, 1.1]),
                axis=alt.Axis(values=[0, 0.2, 0.4, 0.6, 0.8, 1.0]),
            ),
            tooltip=[
                "position:O",
                alt.Tooltip("reached:Q", title="n (reached)"),
                "accepted:Q",
                alt.Tooltip("conditional:Q", format=".3f"),
            ],
        )
    )
    bars = base.mark_bar(color="#2e7d32").encode(
        opacity=alt.condition(is_value("small", True), alt.value(0.45), alt.value(1.0))
    )
    labels = base.mark_text(dy=-6, fontSize=10, color="#424242").encode(text="n_label:N")
    return alt.layer(bars, labels).properties(height=HEIGHT)


def acceptance_by_sibling_rank(frame: pd.DataFrame) -> alt.Chart:
    """A token tree's acceptance by depth, each bar split by the sibling rank of the accepted node (rank 0: the draft's
    top-1 child; above 0: the tree's other branches won). A bar's height is the depth's accepted / reached.
    frame: depth, sibling_rank, accepted, reached, share (storage/records/tree_breakdowns.py)."""
    ranks = frame.assign(rank=frame["sibling_rank"].map(lambda r: "0 (top-1)" if int(r) == 0 else str(int(r))))
    return (
        alt.Chart(ranks)
        .mark_bar()
        .encode(
            alt.X("depth:O", title="depth (draft position)", axis=alt.Axis(labelAngle=0)),
            alt.Y(
                "share:Q",
                stack="zero",
                title="accepted / reached",
                scale=alt.Scale(domain=[0, 1]),
            ),
            alt.Color("rank:N", title="sibling rank", legend=BOTTOM),
            alt.Order("sibling_rank:Q"),
            tooltip=[
                "depth:O",
                alt.Tooltip("rank:N", title="sibling rank"),
                "accepted:Q",
                alt.Tooltip("reached:Q", title="n (reached)"),
                alt.Tooltip("share:Q", format=".3f"),
            ],
        )
        .properties(height=HEIGHT)
    )


def production_positions(frame: pd.DataFrame, points_title: str = "production") -> alt.LayerChart:
    """Conditional acceptance per draft position: the lab run's estimate with its 95 % interval (grey bar and rule)
    and each production series as a point (`points_title`: their legend's title, "server" for a confirm's).
    frame: position, source (a label), kind ('lab' or 'production'), conditional, lo, hi."""
    x = alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0))
    y_scale = alt.Scale(domain=[0, 1])
    lab_data = frame[frame["kind"] == "lab"]
    prod_data = frame[frame["kind"] != "lab"]
    interval = (
        alt.Chart(lab_data)
        .mark_rule(color="#9e9e9e", strokeWidth=6, opacity=0.6)
        .encode(
            x,
            alt.Y("lo:Q", title="accepted / reached", scale=y_scale),
            alt.Y2("hi:Q"),
            tooltip=[
                "position:O",
                alt.Tooltip("conditional:Q", title="lab", format=".3f"),
                alt.Tooltip("lo:Q", format=".3f"),
                alt.Tooltip("hi:Q", format=".3f"),
            ],
        )
    )
    lab = alt.Chart(lab_data).mark_tick(color="#424242", thickness=2, size=18).encode(x, alt.Y("conditional:Q"))
    points = (
        alt.Chart(prod_data)
        .mark_point(filled=True, size=80)
        .encode(
            x,
            alt.Y("conditional:Q"),
            alt.Color("source:N", title=points_title, legend=BOTTOM),
            tooltip=["source:N", "position:O", alt.Tooltip("conditional:Q", format=".3f")],
        )
    )
    return alt.layer(interval, lab, points).properties(height=HEIGHT)


OUTSIDE_VOCAB = "rejected: target token outside the shared vocab"


def acceptance_by_type(frame: pd.DataFrame) -> alt.LayerChart:
    """Acceptance rate per token type, bars sorted by how many were verified, each labelled with its n; fewer than
    MIN_SAMPLE verified tokens: faded and starred. frame: token_type, verified, accepted, rate (and outside_vocab: a
    draft with another vocabulary's rejections for a target token outside the shared vocabulary, drawn as a grey tick
    at the rate those would have added: where the intersection costs acceptance)."""
    outside = "outside_vocab" in frame and bool(frame["outside_vocab"].fillna(0).sum() > 0)
    base = (
        alt.Chart(frame)
        .transform_calculate(**count_labels("verified"))
        .encode(
            alt.Y("token_type:N", title=None, sort=alt.SortField("verified", order="descending")),
            alt.X(
                "rate:Q",
                title="accepted / verified",
                scale=alt.Scale(domain=[0, 1.15]),
                axis=alt.Axis(values=[0, 0.2, 0.4, 0.6, 0.8, 1.0]),
            ),
            tooltip=[
                "token_type:N",
                alt.Tooltip("verified:Q", title="n (verified)"),
                "accepted:Q",
                alt.Tooltip("rate:Q", format=".3f"),
                # a draft with another vocabulary: rejections for a target token outside the shared vocabulary
                *([alt.Tooltip("outside_vocab:Q", title=OUTSIDE_VOCAB)] if outside else []),
            ],
        )
    )
    bars = base.mark_bar().encode(
        alt.Color("rate:Q", scale=alt.Scale(scheme="redyellowgreen", domain=[0, 1]), legend=None),
        opacity=alt.condition(is_value("small", True), alt.value(0.45), alt.value(1.0)),
    )
    labels = base.mark_text(align="left", dx=3, fontSize=10, color="#424242").encode(text="n_label:N")
    if outside:
        ceiling = base.transform_calculate(rate="(datum.accepted + datum.outside_vocab) / datum.verified").mark_tick(
            color="#9e9e9e", thickness=3
        )
        return alt.layer(bars, ceiling, labels).properties(height=HEIGHT)
    return alt.layer(bars, labels).properties(height=HEIGHT)


BLOCK_ONLY = "accepted by block, rejected by standard"
STANDARD_ONLY = "accepted by standard, rejected by block"


def block_gain_by_position(frame: pd.DataFrame) -> alt.Chart:
    """A block-verification run, per position: the share of rounds drafting there that one rule accepted and the
    other rejected, side by side. frame: storage/records/block_positions.py's COLUMNS."""
    long = pd.concat(
        [
            frame.assign(which=BLOCK_ONLY, rounds=frame["block_only"]),
            frame.assign(which=STANDARD_ONLY, rounds=frame["standard_only"]),
        ],
        ignore_index=True,
    )
    long["share"] = long["rounds"] / long["drafted"].where(long["drafted"] > 0)
    return (
        alt.Chart(long[["position", "which", "rounds", "drafted", "share"]])
        .mark_bar()
        .encode(
            alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
            alt.XOffset("which:N", sort=[BLOCK_ONLY, STANDARD_ONLY]),
            alt.Y("share:Q", title="share of rounds drafting there"),
            alt.Color(
                "which:N",
                title=None,
                sort=[BLOCK_ONLY, STANDARD_ONLY],
                scale=alt.Scale(domain=[BLOCK_ONLY, STANDARD_ONLY], range=["#2e7d32", "#c62828"]),
                legend=BOTTOM,
            ),
            tooltip=[
                "position:O",
                alt.Tooltip("which:N", title="verdicts"),
                "rounds:Q",
                alt.Tooltip("drafted:Q", title="n (rounds drafting there)"),
                alt.Tooltip("share:Q", format=".3f"),
            ],
        )
        .properties(height=HEIGHT)
    )
