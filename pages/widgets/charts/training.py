"""A training job's charts: its loss and held-out KL per step (training_curves) and, for an EAGLE-3 head, its
held-out acceptance by draft position at each eval point (head_acceptance_by_position) and its acceptance length
(acceptance_length_curve). Drawn on the Train page."""

from __future__ import annotations

import altair as alt
import pandas as pd

from pages.widgets.charts.look import HEIGHT, LEGEND_ROW, _x, is_valid, is_value

TRAINING_LOSS, HELD_OUT_KL = "train loss (weighted top-k KL)", "held-out KL (nats/token)"


# A head's (engine/training/head_training.py): the training-time test's loss, forward KL on the draft vocabulary summed
# over the TTT steps (step j weighted 0.8^j), in training (focus-weighted) and on the held-out prompts.
HEAD_LOSS, HEAD_HELD_OUT = "train loss (TTT KL)", "held-out TTT KL"


def training_curves(points: pd.DataFrame, head: bool = False) -> alt.LayerChart | None:
    """A training job's loss per step (a thin line) and its held-out KL (points where it was measured); None when
    there is nothing to draw yet. points: step, loss, kl (either may be missing at a step). head: an EAGLE-3 head's
    job, whose loss is the TTT objective (HEAD_LOSS, HEAD_HELD_OUT)."""
    if points.empty:
        return None
    train_name, held_out_name = (HEAD_LOSS, HEAD_HELD_OUT) if head else (TRAINING_LOSS, HELD_OUT_KL)
    loss = points.dropna(subset=["loss"]).assign(series=train_name, value=lambda d: d["loss"])
    kl = points.dropna(subset=["kl"]).assign(series=held_out_name, value=lambda d: d["kl"])
    frame = pd.concat([loss, kl])[["step", "series", "value"]]
    if frame.empty:
        return None
    base = alt.Chart(frame).encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1)),
        y=alt.Y("value:Q", title="TTT loss (KL, nats)" if head else "KL (nats per token)"),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=0)),
        tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("series:N"), alt.Tooltip("value:Q", format=".4f")],
    )
    held_out = is_value("series", held_out_name)
    return (
        base.transform_filter(~held_out).mark_line(opacity=0.6) + base.transform_filter(held_out).mark_line(point=True)
    ).properties(height=280)


def head_acceptance_by_position(frame: pd.DataFrame) -> alt.Chart | None:
    """An EAGLE-3 head job's held-out acceptance by draft position, one line per eval point, early steps light and
    the latest dark; None before the first eval point. frame: step, position, acceptance (conditional: given the
    positions before it accepted; NULL where none reached it), accuracy
    (storage.jobs.training.acceptance_by_position)."""
    drawn = frame.dropna(subset=["acceptance"]) if not frame.empty else frame
    if drawn.empty:
        return None
    steps = sorted(int(s) for s in frame["step"].unique())
    return (
        alt.Chart(frame)
        .transform_filter(is_valid("acceptance"))
        .mark_line(point=True)
        .encode(
            x=_x("position", "draft position", frame["position"]),
            y=alt.Y("acceptance:Q", title="acceptance", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color(
                "step:O",
                title="eval step",
                scale=alt.Scale(scheme="viridis", domain=steps, reverse=True),
                legend=alt.Legend(orient="bottom", labelLimit=0),
            ),
            tooltip=[
                alt.Tooltip("step:O"),
                alt.Tooltip("position:Q", title="draft position"),
                alt.Tooltip("acceptance:Q", format=".3f"),
                alt.Tooltip("accuracy:Q", format=".3f"),
            ],
        )
        .properties(height=HEIGHT + LEGEND_ROW)
    )


def acceptance_length_curve(points: pd.DataFrame) -> alt.Chart | None:
    """An EAGLE-3 head job's held-out acceptance length (1 + expected accepted drafts per round at k = its TTT
    steps) at each eval point; None before the first. points: step, acceptance_length (storage.jobs.training.points)."""
    frame = points.dropna(subset=["acceptance_length"])[["step", "acceptance_length"]] if not points.empty else points
    if frame.empty:
        return None
    return (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("step:Q", title="step", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y("acceptance_length:Q", title="acceptance length", scale=alt.Scale(zero=False)),
            tooltip=[
                alt.Tooltip("step:Q"),
                alt.Tooltip("acceptance_length:Q", title="acceptance length", format=".3f"),
            ],
        )
        .properties(height=HEIGHT)
    )
