"""Every Altair chart the dashboard draws, built from the DataFrames the pages download as CSV.

Each builder takes exactly the frame a page offers for download, so what is drawn and what is exported agree.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import numpy as np
import pandas as pd

# Emitted-token kinds (SPEC: a round emits accepted drafts then a correction or a bonus).
KIND_COLORS = {"first": "#9e9e9e", "accepted": "#2e7d32", "correction": "#c62828", "bonus": "#1565c0"}
OUTCOME_COLORS = {"accepted": "#2e7d32", "rejected": "#c62828", "discarded": "#9e9e9e"}
HEIGHT = 260
# Altair validates every channel object as it is built and the whole spec again when Streamlit serializes it; the
# first pass is debugging help and most of a page's chart time (the detail page's reruns), so it is off. The full
# spec is still validated once, in to_dict.
alt.utils.schemapi.disable_debug_mode()
BOTTOM = alt.Legend(orient="bottom", labelLimit=0, symbolLimit=0)  # below the plot: narrow columns' plots stay wide
# Compare's series (experiments, runs): one per line under the plot, never truncated, never dropped.
SERIES_LEGEND = alt.Legend(orient="bottom", direction="vertical", columns=1, labelLimit=0, symbolLimit=0)
MIN_SAMPLE = 30  # a rate from fewer verified tokens than this is flagged as a small sample


# Names and labels (experiments, runs, drafts, series) reach Vega as data: fields, and predicates that compare a
# field with a value (Vega-Lite writes the value into its expressions as a JSON string). An expression written here
# names only this module's own field names; text from people or the database is never pasted into one.
def is_value(field: str, value) -> alt.FieldEqualPredicate:
    """Rows whose `field` equals `value`."""
    return alt.FieldEqualPredicate(field=field, equal=value)


def is_valid(field: str) -> alt.FieldValidPredicate:
    """Rows with a `field` value (not null, not NaN)."""
    return alt.FieldValidPredicate(field=field, valid=True)


def series_scale(frame: pd.DataFrame, series: str) -> alt.Scale:
    """Distinct categorical colours for Compare's series: tableau10, tableau20 beyond ten."""
    n = frame[series].nunique() if series in frame else 0
    # The domain is every series of the frame, in order, so separate charts drawn from one frame (Compare's sweep
    # panels) give each series the same colour even where a panel has no point of it.
    domain = sorted(frame[series].dropna().astype(str).unique()) if series in frame else alt.Undefined
    return alt.Scale(scheme="tableau20" if n > 10 else "tableau10", domain=domain)


def _x(field: str, title: str, values=None, margin: float = 0.0) -> alt.X:
    """The swept value on a quantitative x axis. Whole numbers (k, top-k; the values drawn, or k when none are
    given) get whole-number ticks; a single value gets a span around it, a unit either side for a whole number
    (without one, Vega ticked the zero-width domain as `2.000000`). margin: room right of the last value, as a
    share of the range (for end labels), with ticks only at the values drawn."""
    xs = pd.Series([] if values is None else list(values), dtype=float).dropna()
    whole = bool((xs == xs.round()).all()) if len(xs) else values is None
    axis = alt.Axis(tickMinStep=1, format="d") if whole else alt.Axis()
    scale = alt.Undefined
    if xs.nunique() == 1:
        v = float(xs.iloc[0])
        pad = 1.0 if whole else max(abs(v) / 2, 0.1)
        scale = alt.Scale(domain=[max(v - pad, 0.0) if v >= 0 else v - pad, v + pad])
    elif margin and len(xs):
        low, high = float(xs.min()), float(xs.max())
        scale = alt.Scale(domain=[low, high + margin * (high - low)], nice=False, zero=False)
        values_drawn = sorted(set(xs))
        axis = alt.Axis(values=values_drawn, format="d") if whole else alt.Axis(values=values_drawn)
    return alt.X(f"{field}:Q", title=title, axis=axis, scale=scale)


# The two predictions, said as what they compute (a legend, a caption), never as "the formula" or "SPEC's".
FORMULA = "predicted from α and c: (1 − α^(k+1)) / ((1 − α)(1 + k/c))"
COST_AWARE = "predicted from round times: E[L]·t / (k·t_d + verify)"
SPEEDUP_SERIES = {
    "speedup": ("measured", "#1565c0"),
    "predicted_speedup_refined": (COST_AWARE, "#6a1b9a"),
    "predicted_speedup": (FORMULA, "#9e9e9e"),
    "predicted_auto": ("predicted by k auto from its one measured k", "#00897b"),
}
# The rates' and tokens' curves: their legends in words (the frame keeps its column names: the CSV's).
RATE_NAMES = {"alpha": "α: accepted / verified drafts", "draft_acceptance_rate": "accepted / proposed drafts"}
TOKEN_NAMES = {
    "tokens_per_round": "measured tokens per round",
    "expected_tokens_per_round": "expected from α: (1 − α^(k+1)) / (1 − α)",
}
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


def speedup_curve(
    frame: pd.DataFrame, x: str = "k", best_x: float | None = None, best_label: str | None = None
) -> alt.LayerChart:
    """Measured speedup per swept value with its 95 % interval (error bars; hollow while the run is not finished),
    the predictions as dashed lines, the best value marked.

    frame: x, speedup, speedup_ci_lo, speedup_ci_hi, state (FINISHED or not), and any of predicted_speedup_refined,
    predicted_speedup, predicted_auto (NaN where not predicted). best_x: where to mark the verdict's choice,
    best_label: its label (default: `best k = 2`).
    """
    x_title = x
    frame = frame.rename(columns={x: "x", "speedup_ci_lo": "lo", "speedup_ci_hi": "hi"})
    for column in ("lo", "hi", "state"):
        if column not in frame:
            frame[column] = None
    series = [c for c in SPEEDUP_SERIES if c in frame]
    long = frame.melt(
        id_vars=["x", "lo", "hi", "state"], value_vars=series, var_name="series", value_name="value"
    ).dropna(subset=["value"])
    long.loc[long["series"] != "speedup", ["lo", "hi", "state"]] = None  # intervals and states are the measurement's
    long["series"] = long["series"].map(lambda s: SPEEDUP_SERIES[s][0])  # the legend's words, as data
    shown = [SPEEDUP_SERIES[s] for s in series if SPEEDUP_SERIES[s][0] in set(long["series"])]
    color = alt.Color(
        "series:N",
        title=None,
        legend=BOTTOM,
        scale=alt.Scale(domain=[n for n, _ in shown], range=[c for _, c in shown]),
    )
    tooltip = [
        alt.Tooltip("x:Q", title=x_title),
        "series:N",
        alt.Tooltip("value:Q", format=".3f"),
        alt.Tooltip("lo:Q", title="95 % low", format=".3f"),
        alt.Tooltip("hi:Q", title="95 % high", format=".3f"),
        alt.Tooltip("state:N", title="run"),
    ]
    base = alt.Chart(long).encode(
        _x("x", x_title, long["x"]), alt.Y("value:Q", title="speedup (×)"), color, tooltip=tooltip
    )
    is_measured = is_value("series", SPEEDUP_SERIES["speedup"][0])
    predicted = base.transform_filter(~is_measured).mark_line(strokeDash=[5, 4], point=alt.OverlayMarkDef(size=25))
    measured = base.transform_filter(is_measured)
    bars = (
        measured.transform_filter(is_valid("lo"))
        .mark_errorbar(ticks=True)
        .encode(alt.Y("lo:Q", title="speedup (×)"), alt.Y2("hi:Q"))
    )
    points = measured.mark_point(filled=False, size=90, strokeWidth=2).encode(
        fill=alt.condition(is_value("state", FINISHED), alt.value(SPEEDUP_SERIES["speedup"][1]), alt.value("white")),
        shape=alt.Shape("state:N", scale=STATE_SHAPES, legend=None),
    )
    even = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#bdbdbd").encode(y="y:Q")
    layers = [even, predicted, measured.mark_line(), bars, points]
    if best_x is not None:
        label = best_label or f"best {x_title} = {best_x:g}"
        best = alt.Chart(pd.DataFrame({"x": [best_x], "label": [label]}))
        layers.append(best.mark_rule(color="#ef6c00", strokeWidth=2).encode(x="x:Q"))
        # Above the plot area (y < 0), where no measured or predicted point can be: the label never covers the line;
        # it runs into the plot from the mark, so at either end it stays on the chart.
        xs = pd.concat([long["x"], pd.Series([best_x])]).astype(float)
        align = "left" if best_x <= (xs.min() + xs.max()) / 2 else "right"
        layers.append(
            best.mark_text(
                align=align,
                baseline="bottom",
                dy=-4,
                dx=4 if align == "left" else -4,
                color="#ef6c00",
                fontWeight="bold",
            ).encode(x="x:Q", y=alt.value(0), text="label:N")
        )
    return alt.layer(*layers).properties(height=HEIGHT)


SCHEDULE_SERVE, SCHEDULE_OFF = "served", "off (k = 0)"  # a schedule marker's `mark`


def schedule_curve(
    frame: pd.DataFrame,
    served: pd.DataFrame,
    x: str = "k",
    x_title: str | None = None,
    nominal: bool = False,
    predicted: pd.DataFrame | None = None,
) -> alt.LayerChart:
    """A grid's k schedule: measured speedup against the swept value, one line per batch size (never mixed), each
    point with its 95 % interval (error bars; hollow while the run has not finished, a cross for a timing warning),
    a rule at 1× (the target alone at that batch size), and what each batch size serves marked with a large
    diamond in its line's colour; where the target alone is served the marker is a cross at k = 0, 1×, labelled in
    words.

    frame: x, batch (the batch size's name, e.g. `batch 4`), batch_size, speedup, speedup_ci_lo, speedup_ci_hi,
    state. served: x, batch, batch_size, speedup, mark (SCHEDULE_SERVE or SCHEDULE_OFF), label (words), label_y
    (where an off label goes), optionally caption (the off label's text, one for all off batch sizes, drawn in
    grey), and optionally why (the interval behind it, in the tooltip). The y axis does not
    start at 0: the spread around 1× is what matters. predicted (`--k auto` at several batch sizes): x, batch,
    batch_size, predicted_speedup: each batch size's predicted curve, dashed in its line's colour. Batch sizes keep
    their numeric order in the legend. nominal: the swept values are names (a draft or drafter grid): x is the name, in
    the frame's order."""
    x_title = x_title or x
    data = frame.rename(columns={x: "x", "speedup_ci_lo": "lo", "speedup_ci_hi": "hi"})
    marks = served.rename(columns={x: "x"})
    guesses = predicted.rename(columns={x: "x"}) if predicted is not None and len(predicted) else None
    named = [d[["batch_size", "batch"]] for d in (data, marks, guesses) if d is not None]
    names = list(dict.fromkeys(pd.concat(named).sort_values("batch_size")["batch"]))
    scale = alt.Scale(domain=names, scheme="tableau20" if len(names) > 10 else "tableau10")
    color = alt.Color("batch:N", title="batch size", legend=BOTTOM, scale=scale, sort=names)
    if nominal:
        order = list(dict.fromkeys(data["x"].astype(str)))
        x_enc = alt.X("x:N", title=x_title, sort=order, axis=alt.Axis(labelAngle=0, labelLimit=160))
    else:
        x_enc = _x("x", x_title, pd.concat([data["x"], marks["x"]]))
    y_title = "speedup (×) at that batch size"
    y_scale = alt.Scale(zero=False)  # the spread between batch sizes, not the distance from 0
    tooltip = [
        "batch:N",
        alt.Tooltip("x:N" if nominal else "x:Q", title=x_title),
        alt.Tooltip("speedup:Q", format=".3f"),
        alt.Tooltip("lo:Q", title="95 % low", format=".3f"),
        alt.Tooltip("hi:Q", title="95 % high", format=".3f"),
        alt.Tooltip("state:N", title="run"),
    ]
    base = (
        alt.Chart(data)
        .transform_filter(is_valid("speedup"))
        .encode(x_enc, alt.Y("speedup:Q", title=y_title, scale=y_scale), color, tooltip=tooltip)
    )
    bars = (
        base.transform_filter(is_valid("lo"))
        .mark_errorbar(ticks=True)
        .encode(alt.Y("lo:Q", title=y_title, scale=y_scale), alt.Y2("hi:Q"))
    )
    fill = alt.condition(is_value("state", FINISHED), alt.Fill("batch:N", legend=None, scale=scale), alt.value("white"))
    points = base.mark_point(filled=False, size=60, strokeWidth=2).encode(
        fill=fill, shape=alt.Shape("state:N", scale=STATE_SHAPES, legend=None)
    )
    even = (
        alt.Chart(pd.DataFrame({"y": [1.0]}))
        .mark_rule(color="#757575", strokeDash=[4, 3])
        .encode(alt.Y("y:Q", scale=y_scale))
    )
    mark_tooltip = ["label:N", *(["why:N"] if "why" in marks else []), alt.Tooltip("speedup:Q", format=".3f")]
    # Fixed shapes, not a shape channel: the points' state shapes and these would share one scale in the layer.
    marked = alt.Chart(marks).encode(
        x_enc, alt.Y("speedup:Q", title=y_title, scale=y_scale), color, tooltip=mark_tooltip
    )
    chosen = marked.transform_filter(is_value("mark", SCHEDULE_SERVE)).mark_point(
        shape="diamond", size=360, strokeWidth=3, filled=False
    )
    off_mark = marked.transform_filter(is_value("mark", SCHEDULE_OFF)).mark_point(
        shape="cross", size=260, strokeWidth=1, filled=True, opacity=1
    )
    off_label = (
        alt.Chart(marks)
        .transform_filter(is_value("mark", SCHEDULE_OFF))
        .mark_text(align="left", baseline="bottom", dx=10, dy=-4, fontSize=11, fontWeight="bold", color="#424242")
        .encode(
            x_enc,
            alt.Y("label_y:Q", title=y_title, scale=y_scale),
            *([] if "caption" in marks else [color]),
            text=("caption:N" if "caption" in marks else "label:N"),
            tooltip=mark_tooltip,
        )
    )
    layers = [even, base.mark_line(), bars, points, chosen, off_mark, off_label]
    if guesses is not None:
        layers.insert(
            1,
            alt.Chart(guesses)
            .mark_line(strokeDash=[5, 4], opacity=0.7, point=alt.OverlayMarkDef(size=20))
            .encode(
                x_enc,
                alt.Y("predicted_speedup:Q", title=y_title, scale=y_scale),
                color,
                tooltip=[
                    "batch:N",
                    alt.Tooltip("x:Q", title=x_title),
                    alt.Tooltip("predicted_speedup:Q", title="predicted (k auto)", format=".3f"),
                ],
            ),
        )
    return alt.layer(*layers).properties(height=HEIGHT + 80)


def rates_curve(frame: pd.DataFrame, x: str = "k") -> alt.Chart:
    """alpha and draft_acceptance_rate per swept value. frame: x, alpha, draft_acceptance_rate."""
    x_title = x
    frame = frame.rename(columns={x: "x"})
    long = frame.melt(id_vars=["x"], value_vars=list(RATE_NAMES), var_name="metric")
    long["metric"] = long["metric"].map(RATE_NAMES)
    return (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            _x("x", x_title, long["x"]),
            alt.Y("value:Q", title="rate", scale=alt.Scale(domain=[0, 1])),
            alt.Color("metric:N", title=None, legend=SERIES_LEGEND, sort=list(RATE_NAMES.values())),
            tooltip=[alt.Tooltip("x:Q", title=x_title), "metric:N", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(height=HEIGHT + LEGEND_ROW * len(RATE_NAMES))
    )  # the plot keeps HEIGHT above its legend


def tokens_per_round_curve(frame: pd.DataFrame, x: str = "k") -> alt.Chart:
    """Measured tokens_per_round and, where given, the formula's expected tokens per round.

    frame: x, tokens_per_round, expected_tokens_per_round (either may be NaN).
    """
    x_title = x
    frame = frame.rename(columns={x: "x"})
    cols = [c for c in TOKEN_NAMES if c in frame]
    long = frame.melt(id_vars=["x"], value_vars=cols, var_name="metric").dropna(subset=["value"])
    long["metric"] = long["metric"].map(TOKEN_NAMES)
    names = [TOKEN_NAMES[c] for c in cols]
    return (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            _x("x", x_title, long["x"]),
            alt.Y("value:Q", title="tokens per round"),
            alt.Color("metric:N", title=None, legend=SERIES_LEGEND, sort=names),  # one name a line: never cut off
            alt.StrokeDash("metric:N", title=None, legend=SERIES_LEGEND, sort=names),
            tooltip=[alt.Tooltip("x:Q", title=x_title), "metric:N", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(height=HEIGHT + LEGEND_ROW * len(names))
    )


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


def confirm_speedup(frame: pd.DataFrame) -> alt.LayerChart:
    """Speedup against concurrency, the serving engine's and the lab's side by side at each concurrency (the lab's
    at the batch size equal to it), each a point with its 95 % interval; the dashed rule is 1× (the target alone).
    frame: concurrency, source (a label), kind ('server' or 'lab'), speedup, lo, hi."""
    x = alt.X("concurrency:O", title="concurrency = lab batch size", axis=alt.Axis(labelAngle=0))
    offset = alt.XOffset("source:N")
    color = alt.Color("source:N", title=None, legend=BOTTOM)
    y = alt.Y("speedup:Q", title="speedup", scale=alt.Scale(zero=False))  # over the target alone: the caption
    tooltip = [
        "source:N",
        "concurrency:O",
        alt.Tooltip("speedup:Q", format=".2f"),
        alt.Tooltip("lo:Q", format=".2f"),
        alt.Tooltip("hi:Q", format=".2f"),
    ]
    base = alt.Chart(frame)
    intervals = (
        base.transform_filter(is_valid("lo"))
        .mark_rule(strokeWidth=2)
        .encode(x, offset, color, alt.Y("lo:Q", title="speedup"), alt.Y2("hi:Q"), tooltip=tooltip)
    )
    points = base.mark_point(filled=True, size=80).encode(
        x, offset, color, y, shape=alt.Shape("kind:N", legend=None), tooltip=tooltip
    )  # the source names it
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 4], color="#757575").encode(y="y:Q")
    return alt.layer(one, intervals, points).properties(height=HEIGHT)


def cost_ratio_curve(frame: pd.DataFrame) -> alt.LayerChart:
    """A server cost profile: a speculative step's cost over the target alone's, t_k / t_0, against k, one colour per
    concurrency, each point with its 95 % interval over passes; the dashed rule is 1 (a step of the target alone).
    frame: concurrency, k, cost_ratio, lo, hi."""
    x = alt.X("k:O", title="k (draft tokens per step)", axis=alt.Axis(labelAngle=0))
    offset = alt.XOffset("concurrency:N")
    color = alt.Color("concurrency:N", title="concurrency", legend=BOTTOM)
    tooltip = [
        "concurrency:N",
        "k:O",
        alt.Tooltip("cost_ratio:Q", format=".2f", title="t_k / t_0"),
        alt.Tooltip("lo:Q", format=".2f"),
        alt.Tooltip("hi:Q", format=".2f"),
    ]
    base = alt.Chart(frame)
    intervals = (
        base.transform_filter(is_valid("lo"))
        .mark_rule(strokeWidth=2)
        .encode(x, offset, color, alt.Y("lo:Q", title="t_k / t_0"), alt.Y2("hi:Q"), tooltip=tooltip)
    )
    points = base.mark_point(filled=True, size=80).encode(
        x, offset, color, alt.Y("cost_ratio:Q", title="t_k / t_0", scale=alt.Scale(zero=False)), tooltip=tooltip
    )
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 4], color="#757575").encode(y="y:Q")
    return alt.layer(one, intervals, points).properties(height=HEIGHT)


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


SMALL_SAMPLE_NOTE = (
    f"n = tokens behind each rate; a starred, faded bar rests on fewer than {MIN_SAMPLE} tokens: "
    f"too few to read much into."
)


def overlaid_curves(
    frame: pd.DataFrame,
    x: str,
    y: str,
    series: str,
    x_title: str,
    y_title: str,
    y_domain: tuple[float, float] | None = None,
    lo: str | None = None,
    hi: str | None = None,
    count: str | None = None,
    end_label: str | None = None,
    width: int | None = None,
    legend: bool = True,
) -> alt.Chart | alt.LayerChart:
    """One line per series (experiment, run or batch size). frame: x, y, series columns as named (rows without a
    y are left out of the drawing, so one frame can feed several panels); with `lo` and `hi` (a 95 % interval per
    point) error bars too, and hollow points where a `state` column is not FINISHED; `count`: the column holding
    each rate's n, shown in the tooltip; `end_label`: a column whose value (short: `#3 · batch 2`) is written, in
    the line's colour, in a margin right of the lines, at each line's last height (end_labels), so lines can be
    told apart without the legend; `width`: in pixels (a panel of small multiples; else the chart fills its
    column); `legend`: False when a legend drawn elsewhere names the series (Compare's series_legend).

    Lines with the same values lie on one another: each series' line is drawn wider than the next one's (the first
    widest), so a line under another still shows as a coloured edge (and coinciding() says which ones to name)."""
    scale = alt.Scale(domain=list(y_domain)) if y_domain else alt.Undefined
    tooltip = [f"{series}:N", alt.Tooltip(f"{x}:Q", title=x_title), alt.Tooltip(f"{y}:Q", format=".3f")]
    if count:  # the tokens behind each rate
        tooltip.append(alt.Tooltip(f"{count}:Q", title="n"))
    if lo and hi:
        tooltip += [
            alt.Tooltip(f"{lo}:Q", title="95 % low", format=".3f"),
            alt.Tooltip(f"{hi}:Q", title="95 % high", format=".3f"),
        ]
    color = alt.Color(
        f"{series}:N", title=None, legend=SERIES_LEGEND if legend else None, scale=series_scale(frame, series)
    )
    x_enc = _x(x, x_title, frame[x], margin=END_LABEL_MARGIN if end_label else 0.0)
    base = (
        alt.Chart(frame)
        .transform_filter(is_valid(y))
        .encode(x_enc, alt.Y(f"{y}:Q", title=y_title, scale=scale), color, tooltip=tooltip)
    )
    names = sorted(frame[series].dropna().astype(str).unique()) if series in frame else []
    # Vega draws the lines in the order their series first appear in the data: the first drawn (underneath) is the
    # widest, each next one narrower, so a line lying under another still shows as its coloured edge.
    drawn = list(dict.fromkeys(frame.loc[frame[y].notna(), series].dropna().astype(str))) if y in frame else []
    step = 3.0 if len(drawn) <= 3 else 2.0
    widths = alt.StrokeWidth(
        f"{series}:N",
        legend=None,
        scale=alt.Scale(domain=drawn, range=[2.0 + step * (len(drawn) - 1 - i) for i in range(len(drawn))]),
    )
    layers = []
    if not (lo and hi):
        layers.append(base.mark_line(point=True).encode(widths))
    else:
        bars = (
            base.transform_filter(is_valid(lo))
            .mark_errorbar(ticks=True)
            .encode(alt.Y(f"{lo}:Q", title=y_title, scale=scale), alt.Y2(f"{hi}:Q"))
        )
        fill = alt.Fill(f"{series}:N", legend=None, scale=series_scale(frame, series))  # the lines' colours
        if "state" in frame:
            fill = alt.condition(is_value("state", FINISHED), fill, alt.value("white"))
        points = base.mark_point(filled=False, size=60, strokeWidth=2).encode(fill=fill)
        if "state" in frame:
            points = points.encode(shape=alt.Shape("state:N", scale=STATE_SHAPES, legend=None))
        layers += [base.mark_line().encode(widths), bars, points]
    if end_label:
        # In the margin right of every line's end (the x scale is widened for it): a label never covers a line.
        labels = alt.Chart(end_labels(frame, x, y, series, end_label, y_domain)).encode(
            _x("label_x", x_title, frame[x], margin=END_LABEL_MARGIN),  # the lines' own x scale and axis
            alt.Y("label_y:Q", title=y_title, scale=scale),
            color,
            text=alt.Text(f"{end_label}:N"),
            tooltip=[f"{series}:N"],
        )
        layers.append(
            labels.mark_text(
                align="left", baseline="middle", dx=6, fontSize=11, fontWeight="bold", limit=END_LABEL_LIMIT
            )
        )
    chart = alt.layer(*layers) if len(layers) > 1 else layers[0]
    # Streamlit fits the whole chart, legend included, into its height: a row per series is added, so the plot
    # keeps HEIGHT and its axis title is never cut ("accepted / reache").
    rows = len(names) if legend else 0
    return chart.properties(height=HEIGHT + LEGEND_ROW * rows, **({"width": width} if width else {}))


END_LABEL_LIMIT = 110  # pixels: a longer label is cut with an ellipsis (the legend keeps every name whole)
END_LABEL_MARGIN = 0.45  # of the x range: room right of the lines' ends for their labels
END_LABEL_GAP = 0.1  # of the y range: labels closer than this are moved apart
LEGEND_ROW = 24  # pixels a vertical legend's row takes


def coinciding(frame: pd.DataFrame, x: str, y: str, series: str) -> list[list[str]]:
    """Groups (two or more) of series whose lines are the same: the same y (to 1e-9) at the same x values, so one
    is drawn exactly over the other (greedy decoding at batch 1 and 2 gives identical acceptance)."""
    valid = frame.dropna(subset=[x, y])
    if series not in valid or valid.empty:
        return []
    points: dict[Any, Any] = {}
    for name, rows in valid.groupby(series, sort=True):
        key = tuple((float(a), round(float(b), 9)) for a, b in sorted(zip(rows[x], rows[y])))
        points.setdefault(key, []).append(str(name))
    return [names for names in points.values() if len(names) > 1]


def coinciding_note(groups: list[list[str]], what: str, x_title: str) -> str | None:
    """The sentence under a chart whose lines coincide: which series draw the same line (or None)."""
    if not groups:
        return None
    parts = [", ".join(g[:-1]) + f" and {g[-1]}" for g in groups]
    return (
        f"{'; '.join(parts)}: the same {what} at every {x_title}, so their lines lie on one another (each line "
        f"under another shows as a wider coloured edge)."
    )


def end_labels(
    frame: pd.DataFrame, x: str, y: str, series: str, label: str, y_domain: tuple[float, float] | None = None
) -> pd.DataFrame:
    """Where each line's end label goes: the series' last point (largest x with a y), `label_y` its height moved
    down just enough that no two labels overlap (at least END_LABEL_GAP of the y range apart, top to bottom), and
    `label_x`, the largest x of the frame: the label starts right of every line's end, in the margin the x scale
    leaves for it. Columns: series, label, x, y, label_y, label_x. Vega draws the label as text: never markup."""
    valid = frame.dropna(subset=[y, x])
    if valid.empty:
        return pd.DataFrame(columns=list(dict.fromkeys([series, label, x, y, "label_y", "label_x"])))
    last = valid.sort_values(x).groupby(series, sort=False).tail(1)
    last = last[list(dict.fromkeys([series, label, x, y]))].sort_values(y, ascending=False).reset_index(drop=True)
    low, high = y_domain if y_domain else (min(0.0, float(valid[y].min())), float(valid[y].max()))
    gap = END_LABEL_GAP * ((high - low) or 1.0)
    placed: list[float] = []
    for value in last[y].astype(float):
        placed.append(value if not placed else min(value, placed[-1] - gap))
    return last.assign(label_y=placed, label_x=float(valid[x].max()))


SWEEP_PANELS = (
    ("speedup", "speedup (×)", None),
    ("alpha", "alpha", (0, 1)),
    ("tokens_per_round", "tokens per round", None),
)


def sweep_panels(
    frame: pd.DataFrame, x: str, series: str, x_title: str, end_label: str | None = None, interval: dict | None = None
) -> list:
    """Small multiples of sweeps across experiments, as separate charts (each fills its own column, so none runs
    past the page: a concatenated chart has a fixed width): one per metric of SWEEP_PANELS (speedup with its 95 %
    interval, alpha, tokens_per_round) against the swept value, one colour per series, the same in every panel
    (series_scale's domain); no legend of their own (series_legend draws the one they share); each line labelled
    at its end with `end_label`. frame: x, series, the metrics (any may be NaN), interval's lo/hi columns and
    state; the one frame every panel draws from (and the page's CSV)."""
    panels = []
    for y, title, domain in SWEEP_PANELS:
        if y not in frame:
            continue
        bounds = (interval or {}) if y == "speedup" else {}
        panel = overlaid_curves(
            frame, x, y, series, x_title, title, domain, **bounds, end_label=end_label, legend=False
        )
        panels.append(panel.properties(title=f"{title} vs {x_title}"))
    return panels


def category_panels(frame: pd.DataFrame, x: str, series: str, x_title: str, interval: dict | None = None) -> list:
    """sweep_panels for a swept variable whose values are names (a draft or drafter sweep): each name a category
    on the x axis, one point per series beside the others within it (no line: names have no order), the speedup
    with its 95 % interval as a rule; hollow points as sweep_panels' for runs not finished; the same colours and
    shared legend (series_legend). frame: x (the names), series, the metrics, interval's lo/hi columns and state."""
    names = list(dict.fromkeys(frame[x].dropna().astype(str)))
    axis = alt.Axis(labelAngle=-20, labelLimit=180, title=x_title)
    color = alt.Color(f"{series}:N", legend=None, scale=series_scale(frame, series))
    panels = []
    for y, title, domain in SWEEP_PANELS:
        if y not in frame:
            continue
        scale = alt.Scale(domain=list(domain)) if domain else alt.Undefined
        tooltip = [f"{series}:N", alt.Tooltip(f"{x}:N", title=x_title), alt.Tooltip(f"{y}:Q", format=".3f")]
        bounds = (interval or {}) if y == "speedup" else {}
        if bounds:
            tooltip += [
                alt.Tooltip(f"{bounds['lo']}:Q", title="95 % low", format=".3f"),
                alt.Tooltip(f"{bounds['hi']}:Q", title="95 % high", format=".3f"),
            ]
        base = (
            alt.Chart(frame)
            .transform_filter(is_valid(y))
            .encode(
                alt.X(f"{x}:N", sort=names, axis=axis),
                alt.XOffset(f"{series}:N", scale=alt.Scale(paddingOuter=0.3)),
                alt.Y(f"{y}:Q", title=title, scale=scale),
                color,
                tooltip=tooltip,
            )
        )
        layers = []
        if bounds:
            layers.append(
                base.transform_filter(is_valid(bounds["lo"]))
                .mark_rule(strokeWidth=2)
                .encode(alt.Y(f"{bounds['lo']}:Q", title=title, scale=scale), alt.Y2(f"{bounds['hi']}:Q"))
            )
        fill = alt.Fill(f"{series}:N", legend=None, scale=series_scale(frame, series))
        points = base.mark_point(filled=False, size=70, strokeWidth=2)
        if "state" in frame:
            points = points.encode(
                fill=alt.condition(is_value("state", FINISHED), fill, alt.value("white")),
                shape=alt.Shape("state:N", scale=STATE_SHAPES, legend=None),
            )
        else:
            points = points.encode(fill=fill)
        layers.append(points)
        panels.append(alt.layer(*layers).properties(height=HEIGHT, title=f"{title} vs {x_title}"))
    return panels


def series_legend(frame: pd.DataFrame, series: str) -> alt.LayerChart:
    """The legend several charts share, drawn once as a chart of its own: a dot in each series' colour (the
    scale series_scale gives every chart of `frame`) and its name, drawn by Vega as text."""
    names = sorted(frame[series].dropna().astype(str).unique())
    rows = pd.DataFrame({series: names, "row": range(len(names))})
    base = alt.Chart(rows).encode(alt.Y("row:O", axis=None), tooltip=[f"{series}:N"])
    dots = base.mark_point(filled=True, size=90, opacity=1).encode(
        x=alt.value(8), color=alt.Color(f"{series}:N", legend=None, scale=series_scale(frame, series))
    )
    labels = base.mark_text(align="left", baseline="middle", fontSize=12).encode(x=alt.value(20), text=f"{series}:N")
    return alt.layer(dots, labels).properties(height=22 * max(len(names), 1))


def grouped_bars(
    frame: pd.DataFrame, category: str, value: str, series: str, value_title: str, count: str | None = None
) -> alt.LayerChart:
    """Bars per category, one colour per series (Compare: acceptance by type across runs); with `count` (the
    number of tokens behind each rate) an `n=` label at each bar's end, and small samples (< MIN_SAMPLE) faded."""
    encoding = [
        alt.Y(f"{category}:N", title=None),
        alt.X(f"{value}:Q", title=value_title, scale=alt.Scale(domain=[0, 1])),
        alt.Color(f"{series}:N", title=None, legend=SERIES_LEGEND, scale=series_scale(frame, series)),
        alt.YOffset(f"{series}:N"),
    ]
    tooltip = [f"{series}:N", f"{category}:N", alt.Tooltip(f"{value}:Q", format=".3f")]
    if count:
        tooltip += [alt.Tooltip(f"{count}:Q", title="n")]
    base = alt.Chart(frame).encode(*encoding, tooltip=tooltip)
    if count:
        base = base.transform_calculate(**count_labels(count))
    bars = base.mark_bar()
    height = HEIGHT + 60 + LEGEND_ROW * frame[series].nunique()  # the legend's rows never squash the bars
    if not count:
        return alt.layer(bars).properties(height=height)
    bars = bars.encode(opacity=alt.condition(is_value("small", True), alt.value(0.45), alt.value(1.0)))
    labels = base.mark_text(align="left", dx=3, fontSize=10, color="#424242").encode(text="n_label:N")
    return alt.layer(bars, labels).properties(height=height)


def count_labels(count: str) -> dict:
    """Vega expressions for what a rate bar is labelled with, from its count column (left as is in the data, so the
    chart's data is still the frame the page downloads): n_label (`n=12*`: starred below MIN_SAMPLE) and small.
    `count` is one of the pages' own column names (verified, reached), never a name from the data."""
    return {
        "n_label": f"'n=' + datum['{count}'] + (datum['{count}'] < {MIN_SAMPLE} ? '*' : '')",
        "small": f"datum['{count}'] < {MIN_SAMPLE}",
    }


def with_counts(frame: pd.DataFrame, count: str) -> pd.DataFrame:
    """The labels count_labels() computes in the browser, computed here (for tests and for anyone reading the code)."""
    n = frame[count].fillna(0).astype(int)
    small = n < MIN_SAMPLE
    return frame.assign(n_label=[f"n={v}" + ("*" if s else "") for v, s in zip(n, small)], small=small)


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


def proposal_probabilities(frame: pd.DataFrame) -> alt.Chart:
    """p_draft vs p_target of each proposal in a round, coloured by outcome. frame: position, p_draft, p_target,
    outcome."""
    long = frame.melt(
        id_vars=["position", "text", "outcome"],
        value_vars=["p_draft", "p_target"],
        var_name="model",
        value_name="probability",
    )
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
            alt.Y("probability:Q", scale=alt.Scale(domain=[0, 1])),
            alt.XOffset("model:N"),
            alt.Color("model:N", title=None, legend=BOTTOM),
            alt.Opacity(
                "outcome:N",
                legend=None,
                scale=alt.Scale(domain=["accepted", "rejected", "discarded"], range=[1, 0.9, 0.3]),
            ),
            tooltip=["position:O", "text:N", "model:N", "outcome:N", alt.Tooltip("probability:Q", format=".3f")],
        )
        .properties(height=HEIGHT - 40)
    )


def k_distribution(frame: pd.DataFrame) -> alt.Chart:
    """The share of rounds that drafted each k_r, one bar per run side by side. frame: k, rounds, share, run (the
    run's label: a drafter spec, a draft's name)."""
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("k:O", title="k_r (drafts in the round)"),
            y=alt.Y("share:Q", title="share of rounds", axis=alt.Axis(format="%")),
            color=alt.Color("run:N", title="run", legend=alt.Legend(labelLimit=0)),
            xOffset="run:N",
            tooltip=["run:N", "k:O", "rounds:Q", alt.Tooltip("share:Q", format=".1%")],
        )
    )


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


TOKEN_SELECTION = "token"  # the token chart's point selection: clicking a token selects its round
LINE_CHARS = 80  # the token chart wraps its lines at this many characters (and at every newline)
TOKEN_FONT_PX = 12
# A monospace glyph's advance is 0.6 of its size (DejaVu Sans Mono, Menlo, Courier): the chart is exactly that wide
# per character, so each token's text ends where the next one's starts and a word reads as one ("My Parent", not
# "M y P a rent", which a chart stretched to the page drew).
CHAR_PX = 0.6 * TOKEN_FONT_PX


def token_layout(output: pd.DataFrame, line_chars: int = LINE_CHARS) -> pd.DataFrame:
    """Where each emitted token sits in the token chart: the output laid out as text, `line` and character offset
    `x`..`x2`, wrapped at line_chars and after a newline. shown: the token with whitespace made visible (Vega draws
    it as text, never as HTML). round: the round that emitted it (-1: the prefill token, no round).
    output: position, token_id, text, kind, round_index (storage.records.queries.prompt_output)."""
    rows, line, x = [], 0, 0
    for token in output.itertuples():
        text = str(token.text) if isinstance(token.text, str) else ""
        shown = text.replace("\n", "↵").replace("\t", "→")
        shown = shown.replace(" ", "·") if not shown.strip() else shown
        width = max(len(shown), 1)
        if x and x + width > line_chars:
            line, x = line + 1, 0
        rows.append(
            {
                "position": int(token.position),
                "token_id": int(token.token_id),
                "shown": shown,
                "kind": token.kind,
                "round": int(token.round_index) if pd.notna(token.round_index) else -1,
                "line": line,
                "x": x,
                "x2": x + width,
            }
        )
        x += width
        if "\n" in text:
            line, x = line + 1, 0
    return pd.DataFrame(rows, columns=["position", "token_id", "shown", "kind", "round", "line", "x", "x2"])


def token_chart(layout: pd.DataFrame, selected_round: int | None, line_chars: int = LINE_CHARS) -> alt.LayerChart:
    """The output token by token, coloured by how each was produced, the selected round boxed in orange; a click
    on a token selects its round (a point selection named TOKEN_SELECTION over the `round` field).

    Layers, bottom to top: the coloured boxes, the token texts, and an invisible box per token that carries the
    selection and the tooltip. The browser gives a click to the topmost mark under the pointer, so whether it
    lands on a glyph, on the space after it or on the box's edge, the mark that receives it is the one holding the
    selection, and its datum is that token's."""
    # A token's leading spaces are not drawn as text (the browser drew " Parent" flush against the token before
    # it, one cell early): its text starts that many cells into its box instead (`drawn` from `text_x`).
    lead = layout["shown"].str.len() - layout["shown"].str.lstrip(" ").str.len()
    frame = layout.assign(
        selected=layout["round"] == (selected_round if selected_round is not None else -2),
        drawn=layout["shown"].str.lstrip(" "),
        text_x=layout["x"] + lead,
    )
    pick = alt.selection_point(name=TOKEN_SELECTION, fields=["round"], on="click", clear=False, empty=False)
    lines = int(frame["line"].max()) + 1 if len(frame) else 1
    x = alt.X("x:Q", axis=None, scale=alt.Scale(domain=[0, line_chars], nice=False))
    y = alt.Y("line:O", axis=None)
    kind = alt.Color("kind:N", legend=None, scale=alt.Scale(domain=list(KIND_COLORS), range=list(KIND_COLORS.values())))
    tooltip = [
        alt.Tooltip("round:Q", title="round (-1: prefill)"),
        "kind:N",
        "token_id:Q",
        "position:Q",
        alt.Tooltip("shown:N", title="token"),
    ]
    base = alt.Chart(frame)
    boxes = base.mark_rect(cornerRadius=2).encode(
        x,
        alt.X2("x2:Q"),
        y,
        color=kind,
        opacity=alt.condition(is_value("selected", True), alt.value(0.35), alt.value(0.08)),
        stroke=alt.condition(is_value("selected", True), alt.value("#ef6c00"), alt.value(None)),
    )
    text = base.mark_text(align="left", baseline="middle", font="monospace", fontSize=TOKEN_FONT_PX).encode(
        alt.X("text_x:Q", axis=None, scale=alt.Scale(domain=[0, line_chars], nice=False)),
        y,
        alt.Text("drawn:N"),
        color=kind,
    )
    # Transparent, not absent: a fully transparent fill is still painted, so it receives the pointer.
    hits = (
        base.mark_rect(fill="transparent", stroke=None, cursor="pointer")
        .encode(x, alt.X2("x2:Q"), y, tooltip=tooltip)
        .add_params(pick)
    )
    return (
        alt.layer(boxes, text, hits)
        .properties(width=line_chars * CHAR_PX, height=max(40, 20 * lines), padding=0, autosize="pad")
        .configure_view(stroke=None)
    )


def selected_round(event, rounds: list[int]) -> int | None:
    """The round a token-chart selection picked (st.altair_chart(..., on_select="rerun")'s state), or None when
    nothing, the prefill token, or a round not in `rounds` was clicked."""
    try:
        points = (event or {}).get("selection", {}).get(TOKEN_SELECTION) or []
    except AttributeError:
        return None
    for point in points if isinstance(points, list) else []:
        try:
            value = int(point.get("round"))
        except (AttributeError, TypeError, ValueError):
            continue
        if value in rounds:
            return value
    return None
