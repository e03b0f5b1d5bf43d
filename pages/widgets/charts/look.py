"""The charts' shared look: the colours of token kinds and draft outcomes, the plot height and the legends, the
small-sample threshold (MIN_SAMPLE) and a rate bar's `n=` label, the predicates every chart filters with (a name
reaches Vega as data, never inside an expression), Compare's series colours, the swept value's x axis, a measured
point's run state and a speedup written with its interval. It draws no chart: every chart module draws with it, and
the pages write its words (speedup_text, FORMULA, COST_AWARE, SMALL_SAMPLE_NOTE) and run states (run_states) on
the detail page, Compare, Theory and the detail page's panels."""

from __future__ import annotations

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
LEGEND_ROW = 24  # pixels a vertical legend's row takes


# Names and labels (experiments, runs, drafts, series) reach Vega as data: fields, and predicates that compare a
# field with a value (Vega-Lite writes the value into its expressions as a JSON string). An expression written in
# these modules names only their own field names; text from people or the database is never pasted into one.
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


SMALL_SAMPLE_NOTE = (
    f"n = tokens behind each rate; a starred, faded bar rests on fewer than {MIN_SAMPLE} tokens: "
    f"too few to read much into."
)
