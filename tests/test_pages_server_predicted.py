"""The "In the server (predicted)" panel's and Compare's pieces without a browser
(pages/panels/server_predicted_panel.py, pages/compare.py): the table puts each concurrency and k of a
`server_predicted` document beside the lab's run of that k at a batch size equal to the concurrency (same draft and
drafter; in another sweep only the run itself); the chart builds a valid Vega-Lite spec with one line per
concurrency; the one line without a profile names the command only where a profile would answer; the run shown first
is the deepest; Compare's cell is the smallest concurrency at the run's own k. (In Chromium:
tests/test_browser_server_predicted.py.)"""

from __future__ import annotations

import pandas as pd
import pytest

from pages.compare import server_cells, server_text
from pages.panels.server_predicted_panel import default_run, no_prediction, prediction_frame
from pages.widgets import charts
from tests.meaning import missing


def _cell(speedup: float, lo: float, hi: float, interpolated: bool = False) -> dict:
    return {
        "speedup": speedup,
        "speedup_ci": [lo, hi],
        "tokens_per_step": 1.5,
        "step_seconds_ratio": 1.2,
        "interpolated": interpolated,
    }


DOC = {  # a run at k 2 predicted at concurrency 4 and 16 (16 sorts after 4, not before)
    "profile": {"profile_id": 3, "label": "predicted for vLLM 0.32.0 on CPU, profile 3", "largest_k": 4},
    "run_id": 12,
    "concurrency": {
        "16": {"1": _cell(0.9, 0.8, 0.97), "2": _cell(0.8, 0.7, 0.9)},
        "4": {"1": _cell(1.3, 1.2, 1.4), "2": _cell(1.4, 1.25, 1.5, interpolated=True)},
    },
    "schedule": {"4": 2, "16": 0},
}
RUNS = pd.DataFrame(
    [  # run_id, kind, status, k, batch_size, draft, drafter, speedup, lo, hi
        (10, "baseline", "done", None, 4, None, None, None, None, None),
        (11, "speculative", "done", 1, 4, "d", "model", 1.5, 1.4, 1.6),
        (12, "speculative", "done", 2, 4, "d", "model", 1.7, 1.5, 1.9),
        (13, "speculative", "done", 1, 4, "other", "model", 9.0, 8.0, 10.0),  # another draft: never beside
        (14, "speculative", "failed", 1, 16, "d", "model", 3.0, 2.0, 4.0),  # not finished: never beside
        (15, "speculative", "done", 2, 16, "d", "model", 0.95, 0.9, 1.0),
    ],
    columns=[
        "run_id",
        "kind",
        "status",
        "k",
        "batch_size",
        "draft",
        "drafter",
        "speedup",
        "speedup_ci_lo",
        "speedup_ci_hi",
    ],
)


def test_each_prediction_stands_beside_the_lab_run_of_its_k_and_batch_size():
    frame = prediction_frame(DOC, RUNS, 12)
    assert list(zip(frame["concurrency"], frame["k"])) == [(4, 1), (4, 2), (16, 1), (16, 2)]
    assert frame["predicted_speedup"].tolist() == [1.3, 1.4, 0.9, 0.8]
    assert frame[["predicted_lo", "predicted_hi"]].values.tolist()[1] == [1.25, 1.5]
    assert frame["serve"].tolist() == [False, True, False, False]  # k 2 at 4; nothing at 16
    assert frame["interpolated"].tolist() == [False, True, False, False]
    assert frame["lab_run_id"].tolist() == [11, 12, pd.NA, 15]
    assert frame["lab_speedup"].tolist()[:2] == [1.5, 1.7] and pd.isna(frame["lab_speedup"].iloc[2])
    # a temperature sweep's other runs measured other settings: only the run itself stands beside its prediction
    other = prediction_frame(DOC, RUNS, 12, sweep_variable="temperature")
    assert other["lab_run_id"].tolist() == [pd.NA, 12, pd.NA, pd.NA]


def test_the_chart_is_valid_vega_lite_with_one_line_per_concurrency():
    frame = prediction_frame(DOC, RUNS, 12)
    spec = charts.server_predicted_curve(frame).to_dict()  # validates against Vega-Lite's schema
    rows = next(rows for rows in spec["datasets"].values() if "series" in rows[0])  # not the 1× rule's
    assert sorted({r["series"] for r in rows}) == ["concurrency 16", "concurrency 4"]
    assert {(r["k"], round(r["x"] - r["k"], 3)) for r in rows} == {(1, -0.03), (2, -0.03), (1, 0.03), (2, 0.03)}
    one_k = prediction_frame({**DOC, "concurrency": {"4": {"1": _cell(1.3, 1.2, 1.4)}}, "schedule": {"4": 1}}, RUNS, 12)
    datasets = charts.server_predicted_curve(one_k).to_dict()["datasets"].values()
    assert [len(rows) for rows in datasets if "series" in rows[0]] == [1]


@pytest.mark.parametrize(
    "reason, command",
    [
        (
            "no server cost profile fits run 12 (target t, drafter ngram); `draftlab profile 3 --run 12` measures one",
            True,
        ),
        ("profile 4 measured no concurrency with the target alone and a k beside it", True),
        (
            "run 12 is not lossless (its greedy outputs differ from its baseline's); pick a run whose outputs match",
            False,
        ),
        ("run 12 stored no draft tokens (a target-only run, or none recorded yet)", False),
    ],
)
def test_the_line_without_a_profile_names_the_command_only_where_a_profile_answers(reason, command):
    line = no_prediction(3, 12, reason)
    assert line.startswith("No server prediction for run 12: ")
    assert bool(not missing(line, "`draftlab profile 3 --run 12`")) == command, line
    assert line.count("`draftlab profile") <= 1, line


def test_the_run_shown_first_is_the_deepest_the_verdicts_among_them():
    deep = {"profile": {"profile_id": 1}, "concurrency": {"1": {"1": {}, "2": {}, "3": {}}}}
    shallow = {"profile": {"profile_id": 1}, "concurrency": {"1": {"1": {}}}}
    docs = {5: shallow, 6: deep, 7: deep, 8: {"profile": None, "reason": "x"}}
    assert default_run(docs, {}) == 6
    assert default_run(docs, {"chosen_run_id": 7}) == 7
    assert default_run(docs, {"chosen_run_id": 5, "best_run_id": 7}) == 7  # the choice is shallower
    assert default_run({8: docs[8]}, {"chosen_run_id": 8}) is None


def test_compare_shows_the_smallest_concurrency_at_the_runs_own_k():
    cells = server_cells(DOC, 2)
    assert (cells["server_concurrency"], cells["server_k"], cells["server_speedup"]) == (4, 2, 1.4)
    assert server_text(cells) == "1.40× (1.25–1.50) at k=2, concurrency 4"
    assert server_cells(DOC, 7)["server_k"] == 2  # past the profile's ks: the deepest predicted
    none = server_cells({"profile": None, "reason": "no server cost profile fits run 12"}, 2)
    assert server_text(none) == "—" and none["server_profile"] == "none: no server cost profile fits run 12"
