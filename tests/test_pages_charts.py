"""Names reach Vega as data, never as code: every chart builder of pages/widgets/charts/, fed frames whose names,
labels and texts hold quotes, apostrophes, `<`, `&` and non-ASCII (tests/chart_data.py), builds a spec (to_dict(), which
also validates it against Vega-Lite's schema) in which no expression holds any of those names, nor any string of the
chart's own data. An expression that did (a series name pasted into a quoted Vega expression) stops Vega from parsing
the chart: the browser logs "Unexpected identifier" and draws nothing (tests/test_browser_charts.py sees that in a real
browser). No browser here: this runs in well under a second per chart."""

from __future__ import annotations

import inspect
import re

import altair as alt
import numpy as np
import pandas as pd
import pytest

from pages import theory as theory_page
from pages.widgets import charts
from tests.chart_data import DRAFTS, NAMES, NASTY, TOKEN_TEXTS

SERIES = [NAMES["k"], NAMES["draft"], *DRAFTS]  # e.g. Compare's experiments, runs and their end labels
# Every name a test frame carries, and every name the builders write into the data themselves (a lone quote or
# `&` is left to the literal check: expressions have quotes of their own).
WORDS = [
    w
    for w in [
        NASTY,
        *NAMES.values(),
        *DRAFTS,
        *TOKEN_TEXTS,
        *charts.THEORY_SERIES.values(),
        *(name for name, _ in charts.SPEEDUP_SERIES.values()),
        charts.TRAINING_LOSS,
        charts.HELD_OUT_KL,
        charts.HEAD_LOSS,
        charts.HEAD_HELD_OUT,
    ]
    if len(w.strip()) >= 3
]
# Where a Vega-Lite spec holds expressions: a transform's `calculate` and `filter`, a condition's `test`, an
# ExprRef's `expr`, a parameter's `update`/`signal`; inside a composed predicate (and / or / not) too.
EXPRESSION_KEYS = {"calculate", "filter", "test", "expr", "update", "signal"}
COMPOSED = {"and", "or", "not"}
LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")


def expressions(node, inside: bool = False) -> list[str]:
    """Every expression string in a spec."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasets":
                continue
            found += expressions(value, key in EXPRESSION_KEYS or (inside and key in COMPOSED))
    elif isinstance(node, list):
        for item in node:
            found += expressions(item, inside)
    elif isinstance(node, str) and inside:
        found.append(node)
    return found


def data_strings(spec: dict) -> set[str]:
    """Every string value in the chart's inline data."""
    return {
        value
        for rows in spec.get("datasets", {}).values()
        for row in rows
        for value in row.values()
        if isinstance(value, str) and value
    }


def pasted(spec: dict) -> list[str]:
    """Expressions that hold a name: one of WORDS anywhere in them, or a string literal equal to a data value."""
    data = data_strings(spec)
    bad = []
    for expression in expressions(spec):
        literals = {a or b for a, b in LITERAL.findall(expression)}
        if any(word in expression for word in WORDS) or literals & data:
            bad.append(expression)
    return bad


def _sweep(x: str = "k") -> pd.DataFrame:
    return pd.DataFrame(
        {
            x: [1, 2, 4],
            "speedup": [1.2, 1.5, 1.4],
            "speedup_ci_lo": [1.1, 1.4, np.nan],
            "speedup_ci_hi": [1.3, 1.6, np.nan],
            "predicted_speedup_refined": [1.25, 1.5, 1.45],
            "predicted_speedup": [1.3, 1.6, 1.5],
            "predicted_auto": [np.nan, 1.55, 1.5],
            "state": [charts.FINISHED, charts.WARNED, charts.UNFINISHED],
            "alpha": [0.6, 0.7, 0.65],
            "draft_acceptance_rate": [0.5, 0.6, 0.55],
            "tokens_per_round": [1.6, 2.1, 2.4],
            "expected_tokens_per_round": [1.6, 2.2, 2.5],
        }
    )


def _across(series: list[str]) -> pd.DataFrame:
    """Compare's frame: a sweep per series, with an end label each."""
    return pd.concat(
        [
            _sweep("sweep_value").assign(experiment=name, experiment_name=f"#{i} · {name}")
            for i, name in enumerate(series)
        ],
        ignore_index=True,
    )


def _by_position() -> pd.DataFrame:
    return pd.DataFrame(
        {"position": [1, 2, 3], "reached": [100, 40, 12], "accepted": [60, 20, 3], "conditional": [0.6, 0.5, 0.25]}
    )


def _by_type() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "token_type": [NASTY, "code", "中文"],
            "verified": [100, 20, 5],
            "accepted": [60, 10, 1],
            "rate": [0.6, 0.5, 0.2],
        }
    )


def _output() -> pd.DataFrame:
    texts = [*TOKEN_TEXTS, "\n", " "]
    return pd.DataFrame(
        {
            "position": range(len(texts)),
            "token_id": range(len(texts)),
            "text": texts,
            "kind": ["first", *(["accepted", "correction", "bonus"] * 4)[: len(texts) - 1]],
            "round_index": [None] + [i // 3 for i in range(len(texts) - 1)],
        }
    )


def _grid() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A grid's points (a k sweep per batch size, each batch size named by a nasty name) and what each serves: a
    k at the first two, off (k = 0) at the last, labelled in words that hold the names."""
    points = pd.concat(
        [_sweep().assign(batch=name, batch_size=size) for size, name in enumerate([NAMES["k"], *DRAFTS], start=1)],
        ignore_index=True,
    )
    served = pd.DataFrame(
        {
            "k": [2, 1, 0],
            "batch": [NAMES["k"], *DRAFTS],
            "batch_size": [1, 2, 3],
            "speedup": [1.5, 1.2, 1.0],
            "mark": [charts.SCHEDULE_SERVE] * 2 + [charts.SCHEDULE_OFF],
            "label": [f"{NAMES['k']}: serve k = 2", f"{DRAFTS[0]}: serve k = 1", f"{DRAFTS[1]}: off, k = 0"],
            "label_y": [1.5, 1.2, 1.0],
            "why": [f"faster: {NASTY}", "not measurably faster", "loses"],
        }
    )
    return points, served


# One case per builder: (the call, what it is). A builder added to a module of pages/widgets/charts/ without a case
# fails test_every_builder_is_covered.
CASES = {
    "speedup_curve": lambda: charts.speedup_curve(_sweep(), "k", 2, None),
    "speedup_curve by label": lambda: charts.speedup_curve(_sweep("draft"), "draft", 1, f"serve draft = {DRAFTS[0]}"),
    "schedule_curve": lambda: charts.schedule_curve(*_grid(), "k", "k (0 = off)"),
    "schedule_curve by name": lambda: charts.schedule_curve(
        _grid()[0].assign(draft=lambda f: [DRAFTS[int(k) % 2] for k in f["k"]]).drop(columns=["k"]),
        _grid()[1].iloc[:2].assign(draft=DRAFTS).drop(columns=["k"]),
        "draft",
        "draft",
        nominal=True,
    ),
    "schedule_curve with predictions": lambda: charts.schedule_curve(
        *_grid(),
        "k",
        "k",
        predicted=pd.DataFrame(
            {
                "k": [1, 2, 3, 1, 2, 3],
                "batch": [NAMES["k"]] * 3 + [DRAFTS[0]] * 3,
                "batch_size": [1] * 3 + [2] * 3,
                "predicted_speedup": [1.2, 1.4, 1.3, 1.0, 1.1, 0.9],
            }
        ),
    ),
    "rates_curve": lambda: charts.rates_curve(_sweep()[["k", "alpha", "draft_acceptance_rate"]]),
    "tokens_per_round_curve": lambda: charts.tokens_per_round_curve(
        _sweep()[["k", "tokens_per_round", "expected_tokens_per_round"]]
    ),
    "acceptance_by_position": lambda: charts.acceptance_by_position(_by_position()),
    "acceptance_by_type": lambda: charts.acceptance_by_type(_by_type()),
    "overlaid_curves": lambda: charts.overlaid_curves(
        pd.concat([_by_position().assign(run=name) for name in SERIES]),
        "position",
        "conditional",
        "run",
        "draft position",
        "accepted / reached",
        (0, 1),
        count="reached",
    ),
    "overlaid_curves with intervals and end labels": lambda: charts.overlaid_curves(
        _across(SERIES),
        "sweep_value",
        "speedup",
        "experiment",
        "k",
        "speedup",
        None,
        lo="speedup_ci_lo",
        hi="speedup_ci_hi",
        end_label="experiment_name",
    ),
    "sweep_panels": lambda: alt.vconcat(
        *charts.sweep_panels(  # separate charts: checked together here
            _across(SERIES),
            "sweep_value",
            "experiment",
            "swept value",
            end_label="experiment_name",
            interval={"lo": "speedup_ci_lo", "hi": "speedup_ci_hi"},
        )
    ),
    "series_legend": lambda: charts.series_legend(_across(SERIES), "experiment"),
    "grouped_bars": lambda: charts.grouped_bars(
        pd.concat([_by_type().assign(run=name) for name in SERIES]),
        "token_type",
        "rate",
        "run",
        "accepted / verified",
        count="verified",
    ),
    "grouped_bars without counts": lambda: charts.grouped_bars(
        pd.concat([_by_type().assign(run=name) for name in SERIES]), "token_type", "rate", "run", "rate"
    ),
    "theory_curves": lambda: charts.theory_curves(
        theory_page.formula_frame(
            0.7, 5.0, k_max=8, verify_cost=1.2, measured=pd.DataFrame({"k": [2], "predicted_speedup_refined": [1.3]})
        ),
        3,
    ),
    "simulation_vs_formula": lambda: charts.simulation_vs_formula(
        pd.DataFrame({"k": [1, 2], "speedup": [1.1, 1.3], "predicted_speedup": [1.1, 1.2]}),
        "speedup",
        "predicted_speedup",
        "speedup (×)",
    ),
    "distribution_pair": lambda: charts.distribution_pair(
        pd.DataFrame({"token": [0, 1], "target": [0.6, 0.4], "draft": [0.5, 0.5]})
    ),
    "proposal_probabilities": lambda: charts.proposal_probabilities(
        pd.DataFrame(
            {
                "position": [1, 2, 3],
                "text": TOKEN_TEXTS[:3],
                "outcome": ["accepted", "rejected", "discarded"],
                "p_draft": [0.9, 0.5, 0.2],
                "p_target": [0.8, 0.1, 0.3],
            }
        )
    ),
    "token_chart": lambda: charts.token_chart(charts.token_layout(_output()), 1),
    "production_positions": lambda: charts.production_positions(
        pd.DataFrame(
            {
                "position": [1, 2, 1, 2, 1, 2],
                "source": ["lab", "lab", NAMES["k"], NAMES["k"], DRAFTS[0], DRAFTS[0]],
                "kind": ["lab", "lab"] + ["production"] * 4,
                "conditional": [0.8, 0.6, 0.75, 0.5, 0.7, 0.55],
                "lo": [0.7, 0.5, None, None, None, None],
                "hi": [0.9, 0.7, None, None, None, None],
            }
        )
    ),
    "production_positions as vLLM": lambda: charts.production_positions(
        pd.DataFrame(
            {
                "position": [1, 2, 1],
                "source": ["lab", "lab", DRAFTS[1]],
                "kind": ["lab", "lab", "production"],
                "conditional": [0.8, 0.6, 0.7],
                "lo": [0.7, 0.5, None],
                "hi": [0.9, 0.7, None],
            }
        ),
        points_title=NAMES["k"],
    ),
    "confirm_speedup": lambda: charts.confirm_speedup(
        pd.DataFrame(
            {
                "concurrency": [1, 1, 4, 4],
                "source": [NAMES["k"], DRAFTS[0], NAMES["k"], DRAFTS[0]],
                "kind": ["server", "lab", "server", "lab"],
                "speedup": [1.4, 1.3, 0.98, 1.2],
                "lo": [1.3, 1.1, 0.9, None],
                "hi": [1.5, 1.5, 1.07, None],
            }
        )
    ),
    "cost_ratio_curve": lambda: charts.cost_ratio_curve(
        pd.DataFrame(
            {
                "concurrency": [1, 1, 4, 4],
                "k": [1, 2, 1, 2],
                "cost_ratio": [1.4, 1.9, 1.1, None],
                "lo": [1.3, 1.7, 1.0, None],
                "hi": [1.5, 2.1, 1.2, None],
            }
        )
    ),
    "acceptance_by_sibling_rank": lambda: charts.acceptance_by_sibling_rank(
        pd.DataFrame(
            {
                "depth": [1, 1, 2, 3],
                "sibling_rank": [0, 2, 0, 1],
                "accepted": [50, 10, 20, 3],
                "reached": [100, 100, 60, 20],
                "share": [0.5, 0.1, 0.333, 0.15],
            }
        )
    ),
    "block_gain_by_position": lambda: charts.block_gain_by_position(
        pd.DataFrame(
            {
                "position": [1, 2, 3],
                "drafted": [100, 80, 0],
                "block": [70, 40, 0],
                "standard": [65, 38, 0],
                "block_only": [8, 4, 0],
                "standard_only": [3, 2, 0],
            }
        )
    ),
    "server_predicted_curve": lambda: charts.server_predicted_curve(
        pd.DataFrame(
            {
                "concurrency": [4, 4, 16, 16],
                "k": [1, 2, 1, 2],
                "predicted_speedup": [1.3, 1.4, 0.9, 0.8],
                "predicted_lo": [1.2, 1.25, 0.8, 0.7],
                "predicted_hi": [1.4, 1.5, 1.0, 0.9],
                "serve": [False, True, False, False],
            }
        )
    ),
    "k_distribution": lambda: charts.k_distribution(
        pd.DataFrame(
            {
                "k": [1, 2, 3, 1, 3],
                "rounds": [2, 3, 5, 1, 9],
                "share": [0.2, 0.3, 0.5, 0.1, 0.9],
                "run": [DRAFTS[0]] * 3 + [NAMES["drafter"]] * 2,
            }
        )
    ),
    "training_curves": lambda: charts.training_curves(
        pd.DataFrame({"step": [1, 2, 3, 4], "loss": [1.0, 0.5, 0.3, 0.2], "kl": [None, 0.4, None, 0.2]})
    ),
    "training_curves of a head": lambda: charts.training_curves(
        pd.DataFrame({"step": [0, 1, 2], "loss": [None, 0.5, 0.3], "kl": [0.6, None, 0.2]}), head=True
    ),
    "head_acceptance_by_position": lambda: charts.head_acceptance_by_position(
        pd.DataFrame(
            {
                "step": [0, 0, 0, 10, 10, 10],
                "position": [1, 2, 3, 1, 2, 3],
                "acceptance": [0.1, None, None, 0.6, 0.5, 0.4],
                "accuracy": [0.1, 0.05, 0.0, 0.6, 0.3, 0.2],
            }
        )
    ),
    "acceptance_length_curve": lambda: charts.acceptance_length_curve(
        pd.DataFrame(
            {"step": [0, 1, 2], "loss": [None, 0.5, 0.3], "kl": [0.6, None, 0.2], "acceptance_length": [1.0, None, 1.8]}
        )
    ),
}


def builders() -> dict[str, object]:
    """The public functions of the modules of pages/widgets/charts/ that return a chart, by name."""
    modules = [
        m for _, m in inspect.getmembers(charts, inspect.ismodule) if m.__name__.startswith(f"{charts.__name__}.")
    ]
    assert {m.__name__.rsplit(".", 1)[1] for m in modules} >= {"look", "speedup", "acceptance", "rounds"}
    return {
        name: function
        for module in modules
        for name, function in inspect.getmembers(module, inspect.isfunction)
        if function.__module__ == module.__name__
        and not name.startswith("_")
        and re.search(r"alt\.\w*Chart", str(inspect.signature(function).return_annotation))
    }


def test_every_builder_is_covered():
    covered = {name.split(" ")[0] for name in CASES}
    assert set(builders()) - covered == set(), "add a case to CASES for each new chart builder"


def test_the_package_re_exports_every_builder():
    """`charts.NAME` is how the pages reach a builder (pages/widgets/charts/__init__.py re-exports them)."""
    assert {"speedup_curve", "block_gain_by_position", "token_chart"} <= set(builders())
    assert [name for name, function in builders().items() if getattr(charts, name, None) is not function] == []


@pytest.mark.parametrize("case", list(CASES))
def test_no_name_is_pasted_into_a_vega_expression(case):
    spec = CASES[case]().to_dict()  # validates the whole spec against Vega-Lite's schema
    assert pasted(spec) == [], f"{case}: names in expressions (pass them as data: a field or a predicate)"


@pytest.mark.parametrize(
    "case",
    [
        "speedup_curve by label",
        "schedule_curve",
        "theory_curves",
        "sweep_panels",
        "series_legend",
        "k_distribution",
        "training_curves",
        "training_curves of a head",
        "token_chart",
        "production_positions",
        "confirm_speedup",
    ],
)
def test_the_names_are_in_the_data(case):
    """The check above looks at the right thing: the names these charts show are in their data, whole."""
    spec = CASES[case]().to_dict()
    shown = data_strings(spec)
    expected = {
        "speedup_curve by label": {f"serve draft = {DRAFTS[0]}"},
        "schedule_curve": {NAMES["k"], *DRAFTS, f"{DRAFTS[1]}: off, k = 0", charts.SCHEDULE_OFF},
        "theory_curves": set(charts.THEORY_SERIES.values()),
        "sweep_panels": set(SERIES),
        "series_legend": set(SERIES),
        "k_distribution": {DRAFTS[0], NAMES["drafter"]},
        "training_curves": {charts.TRAINING_LOSS, charts.HELD_OUT_KL},
        "training_curves of a head": {charts.HEAD_LOSS, charts.HEAD_HELD_OUT},
        "token_chart": {"it's", " <b>"},
        "production_positions": {NAMES["k"], DRAFTS[0]},
        "confirm_speedup": {NAMES["k"], DRAFTS[0]},
    }[case]
    assert expected <= shown


def test_the_check_catches_a_name_pasted_into_an_expression():
    """What the check exists for: a series name in a calculate expression, a filter and a condition's test."""
    import altair as alt

    frame = pd.DataFrame({"x": [1, 2], "series": ["a", NAMES["k"]]})
    for chart in (
        alt.Chart(frame).mark_line().transform_calculate(label=f"datum.series + ' · {NAMES['k']}'"),
        alt.Chart(frame).mark_line().transform_filter(alt.datum.series == "a"),
        alt.Chart(frame)
        .mark_line()
        .encode(
            opacity=alt.condition((alt.datum.x > 1) & (alt.datum.series == NAMES["k"]), alt.value(1), alt.value(0.2))
        ),
    ):
        assert pasted(chart.to_dict())
