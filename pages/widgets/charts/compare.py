"""Comparing runs: one line per series (experiment, run or batch size), lines that coincide named and drawn so each
still shows, each line labelled at its end; a sweep's small multiples (sweep_panels; category_panels where the swept
values are names) with the one legend they share (series_legend); bars per category, one colour per series
(grouped_bars). Drawn on Compare (every builder) and on the experiment detail page (overlaid_curves and coinciding:
a metric per batch size)."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from pages.widgets.charts.look import (
    FINISHED,
    HEIGHT,
    LEGEND_ROW,
    SERIES_LEGEND,
    STATE_SHAPES,
    _x,
    count_labels,
    is_valid,
    is_value,
    series_scale,
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
