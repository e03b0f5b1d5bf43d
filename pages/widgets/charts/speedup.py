"""Speedup and k: the measured speedup per swept value against its predictions, a grid's k schedule per batch size,
the acceptance rates and tokens per round per swept value, k_r per round, and the speedup or cost per concurrency of
a confirm, a server cost profile and the server prediction. All are drawn on the experiment detail page: its speedup
section (speedup_curve, rates_curve, tokens_per_round_curve), the k schedule (schedule_curve), tokens drafted per
round (k_distribution), the confirm panel (confirm_speedup), the server cost profile (cost_ratio_curve) and In the
server (predicted) (server_predicted_curve)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from pages.widgets.charts.look import (
    BOTTOM,
    COST_AWARE,
    FINISHED,
    FORMULA,
    HEIGHT,
    LEGEND_ROW,
    SERIES_LEGEND,
    STATE_SHAPES,
    _x,
    is_valid,
    is_value,
)

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


# Of a k: how far apart the concurrencies' points stand at one k, so their bars do not cover each other.
CONCURRENCY_OFFSET = 0.06


def server_predicted_curve(frame: pd.DataFrame) -> alt.LayerChart:
    """Predicted server speedup against k, one line per concurrency, each point with its 95 % interval (a bar), the
    k to serve at each concurrency ringed, the target alone (1×) a dashed rule. frame: prediction_frame's
    (pages/panels/server_predicted_panel.py)."""
    ks = sorted({int(k) for k in frame["k"]})
    concurrencies = sorted({int(c) for c in frame["concurrency"]})
    names = [f"concurrency {c}" for c in concurrencies]
    middle = (len(concurrencies) - 1) / 2
    shift = {c: (i - middle) * CONCURRENCY_OFFSET for i, c in enumerate(concurrencies)}
    data = frame.assign(
        series=[f"concurrency {int(c)}" for c in frame["concurrency"]],
        x=[int(k) + shift[int(c)] for k, c in zip(frame["k"], frame["concurrency"])],
    )[["series", "concurrency", "k", "x", "predicted_speedup", "predicted_lo", "predicted_hi", "serve"]]
    x = alt.X(
        "x:Q",
        title="k (draft tokens per step)",
        axis=alt.Axis(values=ks, format="d"),
        scale=alt.Scale(domain=[min(ks) - 0.5, max(ks) + 0.5], nice=False, zero=False),
    )
    y = alt.Y("predicted_speedup:Q", title="server speedup (×)", scale=alt.Scale(zero=False))
    color = alt.Color(
        "series:N", title=None, legend=BOTTOM, sort=names, scale=alt.Scale(domain=names, scheme="tableau10")
    )
    tooltip = [
        "series:N",
        alt.Tooltip("k:Q", title="k"),
        alt.Tooltip("predicted_speedup:Q", title="predicted", format=".2f"),
        alt.Tooltip("predicted_lo:Q", title="95 % low", format=".2f"),
        alt.Tooltip("predicted_hi:Q", title="95 % high", format=".2f"),
        alt.Tooltip("serve:N", title="the k to serve"),
    ]
    base = alt.Chart(data).encode(x, color, tooltip=tooltip)
    line = base.mark_line(point=alt.OverlayMarkDef(filled=True, size=50)).encode(y)
    bars = base.mark_rule(strokeWidth=2).encode(
        alt.Y("predicted_lo:Q", title="server speedup (×)"), alt.Y2("predicted_hi:Q")
    )
    served = base.transform_filter(alt.FieldEqualPredicate(field="serve", equal=True)).mark_point(
        size=220, strokeWidth=2, filled=False
    )
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 4], color="#757575").encode(y="y:Q")
    return alt.layer(one, bars, line, served.encode(y)).properties(height=HEIGHT)
