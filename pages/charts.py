"""Every Altair chart the dashboard draws, built from the DataFrames the pages download as CSV.

Each builder takes exactly the frame a page offers for download, so what is drawn and what is exported agree.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

# Emitted-token kinds (SPEC: a round emits accepted drafts then a correction or a bonus).
KIND_COLORS = {"first": "#9e9e9e", "accepted": "#2e7d32", "correction": "#c62828", "bonus": "#1565c0"}
OUTCOME_COLORS = {"accepted": "#2e7d32", "rejected": "#c62828", "discarded": "#9e9e9e"}
HEIGHT = 260
BOTTOM = alt.Legend(orient="bottom", labelLimit=0, symbolLimit=0)  # below the plot: narrow columns' plots stay wide
# Compare's series (experiments, runs): one per line under the plot, never truncated, never dropped.
SERIES_LEGEND = alt.Legend(orient="bottom", direction="vertical", columns=1, labelLimit=0, symbolLimit=0)
MIN_SAMPLE = 30  # a rate from fewer verified tokens than this is flagged as a small sample


def series_scale(frame: pd.DataFrame, series: str) -> alt.Scale:
    """Distinct categorical colours for Compare's series: tableau10, tableau20 beyond ten."""
    n = frame[series].nunique() if series in frame else 0
    return alt.Scale(scheme="tableau20" if n > 10 else "tableau10")


def _x(field: str, title: str) -> alt.X:
    return alt.X(f"{field}:Q", title=title, axis=alt.Axis(tickMinStep=1))


SPEEDUP_SERIES = {"speedup": ("measured", "#1565c0"),
                  "predicted_speedup_refined": ("predicted (cost-aware)", "#6a1b9a"),
                  "predicted_speedup": ("predicted (formula)", "#9e9e9e"),
                  "predicted_auto": ("predicted (k auto)", "#00897b")}
FINISHED, UNFINISHED, WARNED = "finished", "not finished", "timing warning"  # a measured point's `state`
STATE_SHAPES = alt.Scale(domain=[FINISHED, UNFINISHED, WARNED], range=["circle", "circle", "cross"])


def run_states(frame: pd.DataFrame) -> np.ndarray:
    """Each run's `state` for the speedup charts, from its status and timing_warning: only FINISHED points are
    filled (the others can never be the best); a WARNED one (impossible speedup) is also drawn as a cross."""
    return np.select([frame["timing_warning"].notna(), frame["status"] == "done"], [WARNED, FINISHED], UNFINISHED)


def speedup_text(speedup, lo=None, hi=None) -> str:
    """`1.31× (1.22–1.40)`: a speedup with its 95 % interval; `1.31×` without one; `—` when not measured."""
    if speedup is None or pd.isna(speedup):
        return "—"
    if lo is None or hi is None or pd.isna(lo) or pd.isna(hi):
        return f"{speedup:.2f}×"
    return f"{speedup:.2f}× ({lo:.2f}–{hi:.2f})"


def speedup_curve(frame: pd.DataFrame, x: str = "k", best_x: float | None = None,
                  best_label: str | None = None) -> alt.LayerChart:
    """Measured speedup per swept value with its 95 % interval (error bars; hollow while the run is not finished),
    the predictions as dashed lines, the best value marked.

    frame: x, speedup, speedup_ci_lo, speedup_ci_hi, state (FINISHED or not), and any of predicted_speedup_refined,
    predicted_speedup, predicted_auto (NaN where not predicted). best_label: how to name best_x (default: the number).
    """
    x_title = x
    frame = frame.rename(columns={x: "x", "speedup_ci_lo": "lo", "speedup_ci_hi": "hi"})
    for column in ("lo", "hi", "state"):
        if column not in frame:
            frame[column] = None
    series = [c for c in SPEEDUP_SERIES if c in frame]
    long = frame.melt(id_vars=["x", "lo", "hi", "state"], value_vars=series, var_name="series",
                      value_name="value").dropna(subset=["value"])
    long.loc[long["series"] != "speedup", ["lo", "hi", "state"]] = None  # intervals and states are the measurement's
    long["series"] = long["series"].map(lambda s: SPEEDUP_SERIES[s][0])
    shown = [SPEEDUP_SERIES[s] for s in series if SPEEDUP_SERIES[s][0] in set(long["series"])]
    color = alt.Color("series:N", title=None, legend=BOTTOM,
                      scale=alt.Scale(domain=[n for n, _ in shown], range=[c for _, c in shown]))
    tooltip = [alt.Tooltip("x:Q", title=x_title), "series:N", alt.Tooltip("value:Q", format=".3f"),
               alt.Tooltip("lo:Q", title="95 % low", format=".3f"), alt.Tooltip("hi:Q", title="95 % high", format=".3f"),
               alt.Tooltip("state:N", title="run")]
    base = alt.Chart(long).encode(_x("x", x_title), alt.Y("value:Q", title="speedup (×)"), color, tooltip=tooltip)
    is_measured = alt.datum.series == "measured"
    predicted = base.transform_filter(~is_measured).mark_line(strokeDash=[5, 4], point=alt.OverlayMarkDef(size=25))
    measured = base.transform_filter(is_measured)
    bars = measured.transform_filter("isValid(datum.lo)").mark_errorbar(ticks=True).encode(
        alt.Y("lo:Q", title="speedup (×)"), alt.Y2("hi:Q"))
    points = measured.mark_point(filled=False, size=90, strokeWidth=2).encode(
        fill=alt.condition(alt.datum.state == FINISHED, alt.value(SPEEDUP_SERIES["speedup"][1]), alt.value("white")),
        shape=alt.Shape("state:N", scale=STATE_SHAPES, legend=None))
    even = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#bdbdbd").encode(y="y:Q")
    layers = [even, predicted, measured.mark_line(), bars, points]
    if best_x is not None:
        label = f"best {x_title} = {best_label or f'{best_x:g}'}"
        best = alt.Chart(pd.DataFrame({"x": [best_x], "label": [label]}))
        layers.append(best.mark_rule(color="#ef6c00", strokeWidth=2).encode(x="x:Q"))
        layers.append(best.mark_text(align="left", dx=4, dy=-6, color="#ef6c00").encode(
            x="x:Q", y=alt.value(8), text="label:N"))
    return alt.layer(*layers).properties(height=HEIGHT)


def rates_curve(frame: pd.DataFrame, x: str = "k") -> alt.Chart:
    """alpha and draft_acceptance_rate per swept value. frame: x, alpha, draft_acceptance_rate."""
    x_title = x
    frame = frame.rename(columns={x: "x"})
    long = frame.melt(id_vars=["x"], value_vars=["alpha", "draft_acceptance_rate"], var_name="metric")
    return alt.Chart(long).mark_line(point=True).encode(
        _x("x", x_title), alt.Y("value:Q", title="rate", scale=alt.Scale(domain=[0, 1])),
        alt.Color("metric:N", title=None, legend=BOTTOM),
        tooltip=[alt.Tooltip("x:Q", title=x_title), "metric:N", alt.Tooltip("value:Q", format=".3f")],
    ).properties(height=HEIGHT)


def tokens_per_round_curve(frame: pd.DataFrame, x: str = "k") -> alt.Chart:
    """Measured tokens_per_round and, where given, the formula's expected tokens per round.

    frame: x, tokens_per_round, expected_tokens_per_round (either may be NaN).
    """
    x_title = x
    frame = frame.rename(columns={x: "x"})
    cols = [c for c in ("tokens_per_round", "expected_tokens_per_round") if c in frame]
    long = frame.melt(id_vars=["x"], value_vars=cols, var_name="metric").dropna(subset=["value"])
    return alt.Chart(long).mark_line(point=True).encode(
        _x("x", x_title), alt.Y("value:Q", title="tokens per round"),
        alt.Color("metric:N", title=None, legend=BOTTOM),
        alt.StrokeDash("metric:N", title=None, legend=BOTTOM),
        tooltip=[alt.Tooltip("x:Q", title=x_title), "metric:N", alt.Tooltip("value:Q", format=".3f")],
    ).properties(height=HEIGHT)


def acceptance_by_position(frame: pd.DataFrame) -> alt.LayerChart:
    """Conditional acceptance per draft position, each bar labelled with its n (tokens that reached it); bars from
    fewer than MIN_SAMPLE tokens are faded and starred. frame: position, reached, accepted, conditional[, ...]."""
    frame = with_counts(frame, "reached")
    base = alt.Chart(frame).encode(
        alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
        alt.Y("conditional:Q", title="accepted / reached", scale=alt.Scale(domain=[0, 1.1]),
              axis=alt.Axis(values=[0, 0.2, 0.4, 0.6, 0.8, 1.0])),
        tooltip=["position:O", alt.Tooltip("reached:Q", title="n (reached)"), "accepted:Q",
                 alt.Tooltip("conditional:Q", format=".3f"), alt.Tooltip("sample:N", title="sample")])
    bars = base.mark_bar(color="#2e7d32").encode(opacity=alt.condition(alt.datum.small, alt.value(0.45), alt.value(1.0)))
    labels = base.mark_text(dy=-6, fontSize=10, color="#424242").encode(text="n_label:N")
    return alt.layer(bars, labels).properties(height=HEIGHT)


def acceptance_by_type(frame: pd.DataFrame) -> alt.LayerChart:
    """Acceptance rate per token type, bars sorted by how many were verified, each labelled with its n; fewer than
    MIN_SAMPLE verified tokens: faded and starred. frame: token_type, verified, accepted, rate."""
    frame = with_counts(frame, "verified")
    base = alt.Chart(frame).encode(
        alt.Y("token_type:N", title=None, sort=alt.SortField("verified", order="descending")),
        alt.X("rate:Q", title="accepted / verified", scale=alt.Scale(domain=[0, 1.15]),
              axis=alt.Axis(values=[0, 0.2, 0.4, 0.6, 0.8, 1.0])),
        tooltip=["token_type:N", alt.Tooltip("verified:Q", title="n (verified)"), "accepted:Q",
                 alt.Tooltip("rate:Q", format=".3f"), alt.Tooltip("sample:N", title="sample")])
    bars = base.mark_bar().encode(
        alt.Color("rate:Q", scale=alt.Scale(scheme="redyellowgreen", domain=[0, 1]), legend=None),
        opacity=alt.condition(alt.datum.small, alt.value(0.45), alt.value(1.0)))
    labels = base.mark_text(align="left", dx=3, fontSize=10, color="#424242").encode(text="n_label:N")
    return alt.layer(bars, labels).properties(height=HEIGHT)


SMALL_SAMPLE_NOTE = (f"n = tokens behind each rate; a starred, faded bar rests on fewer than {MIN_SAMPLE} tokens: "
                     f"too few to read much into.")


def overlaid_curves(frame: pd.DataFrame, x: str, y: str, series: str, x_title: str, y_title: str,
                    y_domain: tuple[float, float] | None = None, lo: str | None = None,
                    hi: str | None = None) -> alt.Chart | alt.LayerChart:
    """One line per series (experiment or run), for Compare. frame: x, y, series columns as named; with `lo` and
    `hi` (a 95 % interval per point) error bars too, and hollow points where a `state` column is not FINISHED."""
    scale = alt.Scale(domain=list(y_domain)) if y_domain else alt.Undefined
    tooltip = [f"{series}:N", alt.Tooltip(f"{x}:Q", title=x_title), alt.Tooltip(f"{y}:Q", format=".3f")]
    if lo and hi:
        tooltip += [alt.Tooltip(f"{lo}:Q", title="95 % low", format=".3f"),
                    alt.Tooltip(f"{hi}:Q", title="95 % high", format=".3f")]
    color = alt.Color(f"{series}:N", title=None, legend=SERIES_LEGEND, scale=series_scale(frame, series))
    base = alt.Chart(frame).encode(_x(x, x_title), alt.Y(f"{y}:Q", title=y_title, scale=scale), color, tooltip=tooltip)
    if not (lo and hi):
        return base.mark_line(point=True).properties(height=HEIGHT)
    bars = base.transform_filter(f"isValid(datum['{lo}'])").mark_errorbar(ticks=True).encode(
        alt.Y(f"{lo}:Q", title=y_title, scale=scale), alt.Y2(f"{hi}:Q"))
    fill = alt.Fill(f"{series}:N", legend=None, scale=series_scale(frame, series))  # the same colours as the lines
    if "state" in frame:
        fill = alt.condition(alt.datum.state == FINISHED, fill, alt.value("white"))
    points = base.mark_point(filled=False, size=60, strokeWidth=2).encode(fill=fill)
    if "state" in frame:
        points = points.encode(shape=alt.Shape("state:N", scale=STATE_SHAPES, legend=None))
    return alt.layer(base.mark_line(), bars, points).properties(height=HEIGHT)


def grouped_bars(frame: pd.DataFrame, category: str, value: str, series: str, value_title: str,
                 count: str | None = None) -> alt.LayerChart:
    """Bars per category, one colour per series (Compare: acceptance by type across runs); with `count` (the
    number of tokens behind each rate) an `n=` label at each bar's end, and small samples (< MIN_SAMPLE) faded."""
    encoding = [alt.Y(f"{category}:N", title=None),
                alt.X(f"{value}:Q", title=value_title, scale=alt.Scale(domain=[0, 1])),
                alt.Color(f"{series}:N", title=None, legend=SERIES_LEGEND, scale=series_scale(frame, series)),
                alt.YOffset(f"{series}:N")]
    tooltip = [f"{series}:N", f"{category}:N", alt.Tooltip(f"{value}:Q", format=".3f")]
    if count:
        frame = with_counts(frame, count)
        tooltip += [alt.Tooltip(f"{count}:Q", title="n"), alt.Tooltip("sample:N", title="sample")]
    base = alt.Chart(frame).encode(*encoding, tooltip=tooltip)
    bars = base.mark_bar()
    if not count:
        return alt.layer(bars).properties(height=HEIGHT + 60)
    bars = bars.encode(opacity=alt.condition(alt.datum.small, alt.value(0.45), alt.value(1.0)))
    labels = base.mark_text(align="left", dx=3, fontSize=10, color="#424242").encode(text="n_label:N")
    return alt.layer(bars, labels).properties(height=HEIGHT + 60)


def with_counts(frame: pd.DataFrame, count: str) -> pd.DataFrame:
    """The frame with what rate bars are labelled with: n_label (`n=12*` below MIN_SAMPLE), small, sample."""
    n = frame[count].fillna(0).astype(int)
    small = n < MIN_SAMPLE
    return frame.assign(n_label=[f"n={v}" + ("*" if s else "") for v, s in zip(n, small)], small=small,
                        sample=np.where(small, f"small (< {MIN_SAMPLE} tokens)", "ok"))


def theory_curves(frame: pd.DataFrame, k_selected: int) -> alt.LayerChart:
    """Speedup and expected tokens per round over k from the formulas. frame: k, predicted_speedup,
    expected_tokens_per_round[, refined_speedup]."""
    series = [c for c in ("predicted_speedup", "refined_speedup", "expected_tokens_per_round") if c in frame]
    long = frame.melt(id_vars=["k"], value_vars=series, var_name="metric")
    lines = alt.Chart(long).mark_line(point=True).encode(
        _x("k", "k (draft tokens per round)"), alt.Y("value:Q", title=None), alt.Color("metric:N", title=None, legend=BOTTOM),
        tooltip=["k:Q", "metric:N", alt.Tooltip("value:Q", format=".3f")])
    rule = alt.Chart(pd.DataFrame({"k": [k_selected]})).mark_rule(color="#ef6c00").encode(x="k:Q")
    even = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#bdbdbd", strokeDash=[2, 2]).encode(y="y:Q")
    return alt.layer(even, lines, rule).properties(height=HEIGHT + 40)


def simulation_vs_formula(frame: pd.DataFrame, y: str, y_formula: str, y_title: str) -> alt.LayerChart:
    """Simulated points against the formula's line. frame: k, y, y_formula."""
    formula = alt.Chart(frame).mark_line(color="#9e9e9e", strokeDash=[5, 4]).encode(
        _x("k", "k"), alt.Y(f"{y_formula}:Q", title=y_title), tooltip=["k:Q", alt.Tooltip(f"{y_formula}:Q", format=".3f")])
    simulated = alt.Chart(frame).mark_point(filled=True, size=70, color="#1565c0").encode(
        _x("k", "k"), alt.Y(f"{y}:Q"), tooltip=["k:Q", alt.Tooltip(f"{y}:Q", format=".3f")])
    return alt.layer(formula, simulated).properties(height=HEIGHT)


def distribution_pair(frame: pd.DataFrame) -> alt.Chart:
    """Target and draft probabilities per token id. frame: token, target, draft."""
    long = frame.melt(id_vars=["token"], value_vars=["target", "draft"], var_name="model", value_name="probability")
    return alt.Chart(long).mark_bar().encode(
        alt.X("token:O", title="token id", axis=alt.Axis(labelAngle=0)), alt.Y("probability:Q"), alt.Color("model:N", title=None, legend=BOTTOM),
        alt.XOffset("model:N"), tooltip=["token:O", "model:N", alt.Tooltip("probability:Q", format=".3f")],
    ).properties(height=HEIGHT - 60)


def proposal_probabilities(frame: pd.DataFrame) -> alt.Chart:
    """p_draft vs p_target of each proposal in a round, coloured by outcome. frame: position, p_draft, p_target, outcome."""
    long = frame.melt(id_vars=["position", "text", "outcome"], value_vars=["p_draft", "p_target"],
                      var_name="model", value_name="probability")
    return alt.Chart(long).mark_bar().encode(
        alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)), alt.Y("probability:Q", scale=alt.Scale(domain=[0, 1])),
        alt.XOffset("model:N"), alt.Color("model:N", title=None, legend=BOTTOM),
        alt.Opacity("outcome:N", legend=None,
                    scale=alt.Scale(domain=["accepted", "rejected", "discarded"], range=[1, 0.9, 0.3])),
        tooltip=["position:O", "text:N", "model:N", "outcome:N", alt.Tooltip("probability:Q", format=".3f")],
    ).properties(height=HEIGHT - 40)
