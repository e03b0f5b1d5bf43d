"""The formulas' charts: speedup and expected tokens per round over k (theory_curves), a simulation's points against
its formula's line (simulation_vs_formula) and a target's and a draft's distributions side by side
(distribution_pair). Drawn on the Theory page."""

from __future__ import annotations

import altair as alt
import pandas as pd

from pages.widgets.charts.look import BOTTOM, FORMULA, HEIGHT, _x

THEORY_SERIES = {
    "predicted_speedup": f"speedup {FORMULA}",
    "cost_aware_speedup": "speedup predicted with the measured verify cost: E[L_k] / (k/c + verify)",
    "measured_cost_aware": "each measured run's cost-aware prediction (its own round times)",
    "expected_tokens_per_round": "expected tokens per round E[L_k]",
}


def theory_curves(frame: pd.DataFrame, k_selected: int) -> alt.LayerChart:
    """Speedup and expected tokens per round over k from the formulas. frame: k, predicted_speedup,
    expected_tokens_per_round[, cost_aware_speedup]. Both are ratios to one target step's output (×, tokens per
    round), so they share the y axis; the legend names them in words."""
    series = [c for c in THEORY_SERIES if c in frame]
    long = frame.melt(id_vars=["k"], value_vars=series, var_name="metric").dropna(subset=["value"])
    long["series"] = long["metric"].map(THEORY_SERIES)  # the curves' names in words, as data (`metric`: the CSV's)
    names = [THEORY_SERIES[c] for c in series]
    lines = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            _x("k", "k (draft tokens per round)"),
            alt.Y("value:Q", title="speedup (×) · tokens per round"),
            alt.Color("series:N", title=None, legend=BOTTOM, sort=names, scale=alt.Scale(domain=names)),
            tooltip=["k:Q", alt.Tooltip("series:N", title="curve"), alt.Tooltip("value:Q", format=".3f")],
        )
    )
    rule = alt.Chart(pd.DataFrame({"k": [k_selected]})).mark_rule(color="#ef6c00").encode(x="k:Q")
    even = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#bdbdbd", strokeDash=[2, 2]).encode(y="y:Q")
    return alt.layer(even, lines, rule).properties(height=HEIGHT + 40)


def simulation_vs_formula(frame: pd.DataFrame, y: str, y_formula: str, y_title: str) -> alt.LayerChart:
    """Simulated points against the formula's line. frame: k, y, y_formula."""
    formula = (
        alt.Chart(frame)
        .mark_line(color="#9e9e9e", strokeDash=[5, 4])
        .encode(
            _x("k", "k"),
            alt.Y(f"{y_formula}:Q", title=y_title),
            tooltip=["k:Q", alt.Tooltip(f"{y_formula}:Q", format=".3f")],
        )
    )
    simulated = (
        alt.Chart(frame)
        .mark_point(filled=True, size=70, color="#1565c0")
        .encode(_x("k", "k"), alt.Y(f"{y}:Q"), tooltip=["k:Q", alt.Tooltip(f"{y}:Q", format=".3f")])
    )
    return alt.layer(formula, simulated).properties(height=HEIGHT)


def distribution_pair(frame: pd.DataFrame) -> alt.Chart:
    """Target and draft probabilities per token id. frame: token, target, draft."""
    long = frame.melt(id_vars=["token"], value_vars=["target", "draft"], var_name="model", value_name="probability")
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            alt.X("token:O", title="token id", axis=alt.Axis(labelAngle=0)),
            alt.Y("probability:Q"),
            alt.Color("model:N", title=None, legend=BOTTOM),
            alt.XOffset("model:N"),
            tooltip=["token:O", "model:N", alt.Tooltip("probability:Q", format=".3f")],
        )
        .properties(height=HEIGHT - 60)
    )
