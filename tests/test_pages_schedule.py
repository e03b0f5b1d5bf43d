"""A batch × k grid on the dashboard (issue 20 item 4): the detail page's k schedule (the schedule's sentence as
the headline, a chart of speedup vs k with one line per batch size and the served k marked, k = 0 where
speculation loses, a table with intervals, ties, throughput and latency, vLLM's setting) with the single-sweep
charts never mixing batch sizes; and the New-experiment form's "at batch sizes" field (bounds from
engine/config/variables.py, the cost estimate per batch size, a batch larger than the prompt set refused in one line,
the link's `batch_sizes=`). Crafted speedups under Streamlit's AppTest; no model is loaded."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from sqlalchemy import text

from pages.widgets import charts
from storage import open_store
from storage.analysis import catalog
from storage.jobs import run_state
from storage.jobs.experiments import enqueue_experiment
from storage.records import queries as q
from tests.meaning import missing
from tests.test_pages import _fill, _launched, app, assert_clean, chart_data, downloads, metrics
from tests.test_pages import empty_db as empty_db  # fixtures, found by name
from tests.test_pages import model_dirs as model_dirs

# (batch size, k): (speedup, 95 % low, 95 % high); tests/test_schedule.py's grid: k = 2 at batch 1, k = 1 at
# batch 4 (tied with k = 2, cheaper), off at batch 16.
SPEEDS = {
    (1, 1): (1.20, 1.15, 1.25),
    (1, 2): (1.40, 1.32, 1.48),
    (1, 4): (1.30, 1.25, 1.35),
    (4, 1): (1.10, 1.05, 1.15),
    (4, 2): (1.12, 1.06, 1.18),
    (4, 4): (0.95, 0.90, 1.00),
    (16, 1): (0.92, 0.88, 0.96),
    (16, 2): (0.85, 0.80, 0.90),
    (16, 4): (0.70, 0.65, 0.75),
}
# Each batch size's baseline tokens/s, and its runs' serving figures (TTFT p50, ITL p95, latency p95) by k.
BASE_SPEED = {1: 50.0, 4: 160.0, 16: 400.0}


@pytest.fixture
def grid(empty_db):
    """A finished grid (batch sizes 1, 4, 16; k 1, 2, 4) with crafted speedups and serving figures. Returns
    (store, experiment id, {(batch size, k or None): run id})."""
    store = open_store(empty_db)
    eid = enqueue_experiment(
        store,
        name="grid <b>it's</b>",
        target="tgt",
        draft="drf",
        prompts="code:tune",
        sampling={"temperature": 0.0, "max_new_tokens": 64},
        sweep_values=[1, 2, 4],
        batch_sizes=[16, 1, 4],
        prompt_texts=[f"p{i}" for i in range(16)],
    )
    runs = q.runs(store, eid)
    ids = {}
    for r in runs.itertuples():
        run_state.finish_run(store, int(r.run_id), "done")
        ids[(int(r.batch_size), None if r.kind == "baseline" else int(r.k))] = int(r.run_id)
    with store.write() as conn:
        for (size, k), rid in ids.items():
            if k is None:
                conn.execute(
                    text(
                        "UPDATE runs SET tokens_per_second = :t, ttft_p50 = :f, itl_p95 = :i, "
                        "latency_p95 = :l WHERE id = :r"
                    ),
                    {"t": BASE_SPEED[size], "f": 0.01 * size, "i": 0.02, "l": 0.5 * size, "r": rid},
                )
                continue
            s, lo, hi = SPEEDS[(size, k)]
            conn.execute(
                text(
                    "UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi, "
                    "tokens_per_second = :t, ttft_p50 = :f, itl_p95 = :i, latency_p95 = :l WHERE id = :r"
                ),
                {
                    "s": s,
                    "lo": lo,
                    "hi": hi,
                    "t": BASE_SPEED[size] * s,
                    "f": 0.011 * size,
                    "i": 0.03 * k,
                    "l": 0.4 * size,
                    "r": rid,
                },
            )
    return store, eid, ids


def _plain(value: str) -> str:
    """Text as read: without the invisible word joiners md_text puts after ':' (no `:emoji:` codes) and its
    markdown escapes."""
    return value.replace("\u2060", "").replace("\\", "")


def _schedule_table(at):
    return next(d.value for d in at.dataframe if "speedup_interval" in d.value).set_index("batch_size")


def test_the_detail_page_of_a_grid_shows_its_k_schedule(grid):
    store, eid, ids = grid
    at = app("experiment", experiment=eid)
    assert_clean(at)
    # The headline is the schedule's sentence, every batch size's choice in it, not the single verdict.
    headline = next(_plain(i.value) for i in at.info if i.value.startswith("**k schedule:**"))
    assert "batch 1: k = 2" in headline and "batch 4: k = 1" in headline and "off from batch 16" in headline
    assert not any("**Verdict:**" in i.value for i in at.info)
    assert metrics(at)["k to serve (batch 1)"] == "2" and metrics(at)["Baseline tokens/s (batch 1)"] == "50.0"
    # The table: what each batch size serves, with its interval, ties, throughput and latency.
    table = _schedule_table(at)
    assert list(table.index) == [1, 4, 16]
    assert table["serve"].tolist() == ["2", "1", "off (k = 0)"]
    assert table["speedup_interval"].tolist() == ["1.40× (1.32–1.48)", "1.10× (1.05–1.15)", "0.92× (0.88–0.96)"]
    assert table["tied_with"].tolist() == ["4", "2 (best)", "1 (best), 2"]  # batch 4 serves the cheaper tied k
    assert table["baseline_tokens_per_second"].tolist() == [50.0, 160.0, 400.0]
    assert table.loc[1, "tokens_per_second"] == pytest.approx(50.0 * 1.40)  # the chosen run's
    assert table.loc[4, "itl_seconds_p95"] == pytest.approx(0.03 * 1)  # k = 1's, the one served at batch 4
    assert (
        table.loc[16, "tokens_per_second"] == 400.0 and table.loc[16, "request_latency_seconds_p95"] == 8.0
    )  # off: the baseline's
    assert any(
        "at batch 16 speculation costs 8 % (0.92× (0.88–0.96)" in _plain(m.value) for m in at.markdown
    )  # each batch size's sentence
    assert f"experiment{eid}_schedule.csv" in downloads(at)
    serving = app("experiment", experiment=eid, section="Serving")  # vLLM's setting: what to carry to a server
    assert json.loads(next(c.value for c in serving.code)) == [[1, 3, 2], [4, 15, 1], [16, 16, 0]]
    # The run picker (and the Round explorer's, Compare's) names each run's batch size: k = 1 is run three times.
    rejected = app("experiment", experiment=eid, section="Why drafts are rejected")
    options = rejected.selectbox(key="select_run").options
    assert f"run {ids[(16, 1)]} · k=1 · batch 16 (done)" in options and len(set(options)) == 9
    tables = [
        d
        for page in (
            at,
            serving,
            rejected,
            *(app("experiment", experiment=eid, section=section) for section in ("Predictions and cost", "Runs")),
        )
        for d in page.dataframe
    ]
    for shown in tables:  # every table of the page, the schedule's included, has a header per column
        config = json.loads(shown.proto.columns)
        assert all(config.get(name, {}).get("label") for name in shown.value.columns), list(shown.value.columns)


def test_the_grid_chart_draws_one_line_per_batch_size_and_marks_what_each_serves(grid):
    store, eid, ids = grid
    at = app("experiment", experiment=eid)
    assert_clean(at)
    drawn = [d for chart in chart_data(at) for d in chart]
    points = next(d for d in drawn if "batch" in d and "lo" in d)
    assert sorted(set(points["batch"])) == ["batch 1", "batch 16", "batch 4"]
    for size in (1, 4, 16):  # each batch size's line holds its own runs only
        line = points[points["batch"] == f"batch {size}"].sort_values("x")
        assert line[["x", "speedup", "lo", "hi"]].values.tolist() == [[k, *SPEEDS[(size, k)]] for k in (1, 2, 4)]
    served = next(d for d in drawn if "mark" in d).set_index("batch")
    assert served.loc["batch 1", ["x", "speedup"]].tolist() == [2, 1.40]
    assert served.loc["batch 4", ["x", "speedup"]].tolist() == [1, 1.10]
    assert served.loc["batch 16", ["x", "speedup", "mark"]].tolist() == [0, 1.0, charts.SCHEDULE_OFF]
    assert served.loc["batch 16", "label"] == "batch 16: off (k = 0)"
    why = served.loc["batch 16", "why"]
    assert not missing(why, "loses", "batch 16", "0.92× (0.88–0.96)"), why
    # The single sweep's speedup curve (every run against k) is not drawn; acceptance is one line per batch size.
    rejected = app("experiment", experiment=eid, section="Why drafts are rejected")
    drawn += [d for chart in chart_data(rejected) for d in chart]
    assert not any("series" in d and "measured" in set(d["series"]) for d in drawn)
    alpha = next(d for d in drawn if "alpha" in d and "batch" in d)
    assert alpha.groupby("batch")["k"].apply(sorted).to_dict() == {f"batch {b}": [1, 2, 4] for b in (1, 4, 16)}
    predicted = app("experiment", experiment=eid, section="Predictions and cost")
    predictions = next(d.value for d in predicted.dataframe if "refined_error" in d.value)
    assert sorted(predictions["batch_size"].tolist()) == sorted([1, 4, 16] * 3)


def _plain_sweep(store) -> int:
    """A finished k sweep at one batch size (not a grid), every speculative run at 1.3× (1.2–1.4)."""
    eid = enqueue_experiment(
        store,
        name="plain",
        target="tgt",
        draft="drf",
        prompts="code:tune",
        sampling={"max_new_tokens": 64},
        sweep_values=[1, 2],
        prompt_texts=["a", "b"],
    )
    for r in q.runs(store, eid).itertuples():
        run_state.finish_run(store, int(r.run_id), "done")
    with store.write() as conn:
        conn.execute(
            text(
                "UPDATE runs SET speedup = 1.3, speedup_ci_lo = 1.2, speedup_ci_hi = 1.4 "
                "WHERE experiment_id = :e AND kind = 'speculative'"
            ),
            {"e": eid},
        )
    return eid


def test_a_plain_sweep_keeps_its_verdict_and_single_curve(empty_db):
    eid = _plain_sweep(open_store(empty_db))
    at = app("experiment", experiment=eid)
    assert_clean(at)
    assert any("**Verdict:**" in i.value for i in at.info) and not any("schedule:**" in i.value for i in at.info)
    assert "k to serve" in metrics(at) and not any("speedup_interval" in d.value for d in at.dataframe)


# --- the New-experiment form --------------------------------------------------------------------------------


def test_the_form_launches_a_grid_and_counts_each_batch_size_in_its_estimate(empty_db, model_dirs):
    at = _fill(app("new"), model_dirs, sweep_values="1,2", max_new_tokens=8, prompt_set="code:validation", device="cpu")
    plain = next(c.value for c in at.caption if "Launch decodes" in c.value)
    at.text_input(key="grid_batch_sizes").set_value("4, 1").run()
    caption = next(c.value for c in at.caption if "Launch decodes" in c.value)
    assert "2 batch sizes" in caption and "2 batch sizes" not in plain
    assert f"at most {18 * 3 * 2 * 3 * 8:,} tokens" in caption  # prompts × arms × batch sizes × repeats × tokens
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    experiment = _launched(empty_db)
    assert q.grid_sizes(experiment) == [1, 4] and experiment["sweep_values"] == [1, 2]
    runs = q.runs(open_store(empty_db), experiment["experiment_id"])
    assert (
        sorted((int(r.batch_size), r.kind) for r in runs.itertuples() if r.kind == "baseline")
        == [(1, "baseline"), (4, "baseline")]
        and len(runs) == 6
    )
    assert "at batch sizes 1, 4" in at.success[-1].value


@pytest.mark.parametrize(
    "grid_text, words",
    [
        ("1,32", "batch size 32 needs at least 32 prompts but the prompt set has 18; use a batch size of 18 or less"),
        ("1,0", "at batch sizes: batch size value '0' is not a whole number from 1 to"),
        ("1,x", "at batch sizes"),
        ("4", "two or more batch sizes"),
        ("2,2", "twice"),
    ],
)
def test_the_form_refuses_a_bad_grid_in_one_line_and_queues_nothing(empty_db, model_dirs, grid_text, words):
    at = _fill(app("new"), model_dirs, sweep_values="1,2", prompt_set="code:validation")
    at.text_input(key="grid_batch_sizes").set_value(grid_text).run()
    at.button(key="launch").click().run()
    assert_clean(at)
    errors = [_plain(e.value) for e in at.error if "Not launched" in e.value]
    assert errors and words in errors[0], errors
    assert catalog.experiments(open_store(empty_db)).empty


def test_validate_checks_every_batch_size_against_the_prompt_count():
    from pages.new_experiment import validate
    from tests.test_pages_logic import VALID

    launch = validate(**VALID, grid_text="1,4,16", prompt_count=16)
    assert launch.errors == [] and launch.kwargs["batch_sizes"] == [1, 4, 16]
    assert launch.kwargs["sampling"]["batch_size"] == 1
    assert "batch_sizes" not in validate(**VALID).kwargs  # no list: no grid
    refused = validate(**VALID, batch_size=8, prompt_count=4)  # the fixed batch size too
    (error,) = refused.errors
    assert not missing(error, "batch size 8", "8 prompts", "has 4", "4 or less"), error  # and the fix
    assert validate(**{**VALID, "sweep_variable": "batch_size", "sweep_text": "1,8"}, prompt_count=4).errors
    # k auto predicts, then confirms, at each batch size; a batch-size sweep takes no grid (a stale value is unused)
    assert validate(**VALID, k_auto=4, grid_text="1,4").kwargs["batch_sizes"] == [1, 4]
    assert (
        "batch_sizes"
        not in validate(**{**VALID, "sweep_variable": "batch_size", "sweep_text": "1,2"}, grid_text="1,4").kwargs
    )


def test_a_link_fills_the_grid_field_or_says_why_not(empty_db):
    from pages.widgets.prefill import parse_prefill

    values, notes = parse_prefill({"batch_sizes": "16,1,4"}, ["code:tune"])
    assert values == {"grid_batch_sizes": "1,4,16"} and notes == []
    for raw in ("0,4", "4", "1,1", "a"):
        values, notes = parse_prefill({"batch_sizes": raw}, ["code:tune"])
        assert values == {} and len(notes) == 1 and notes[0].startswith("batch_sizes="), (raw, notes)
    values, notes = parse_prefill({"batch_sizes": "1,4", "sweep": "batch_size"}, ["code:tune"])
    assert "grid_batch_sizes" not in values and "ignored" in notes[0]
    at = app("new", batch_sizes="1,4", values="1,2")
    assert_clean(at)
    assert at.text_input(key="grid_batch_sizes").value == "1,4"


def test_compare_draws_a_grid_as_one_line_per_batch_size(grid, empty_db):
    store, eid, ids = grid
    plain = _plain_sweep(store)
    at = app("compare", experiments=f"{eid},{plain}")
    assert_clean(at)
    drawn = next(d for chart in chart_data(at) for d in chart if "experiment_name" in d and "speedup" in d)
    lines = drawn.groupby("experiment_name")["sweep_value"].apply(sorted).to_dict()
    assert lines == {
        **{f"#{eid} · grid <b>it's</b> · batch {b}": [1.0, 2.0, 4.0] for b in (1, 4, 16)},
        f"#{plain} · plain": [1.0, 2.0],
    }


def test_the_form_launches_k_auto_at_several_batch_sizes(empty_db, model_dirs):
    """k auto with batch sizes is a grid too (predicted, then confirmed, at each): a probe and a baseline per
    batch size are queued."""
    from pages.new_experiment import AUTO_K

    at = _fill(app("new"), model_dirs, max_new_tokens=8, prompt_set="code:validation")
    at.selectbox(key="sweep_variable").set_value(AUTO_K).run()
    at.number_input(key="k_auto").set_value(4)
    at.text_input(key="grid_batch_sizes").set_value("1,2").run()
    assert any("2 batch sizes" in c.value for c in at.caption if "Launch decodes" in c.value)
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    experiment = _launched(empty_db)
    assert (experiment["k_auto"], q.grid_sizes(experiment)) == (4, [1, 2])
    runs = q.runs(open_store(empty_db), experiment["experiment_id"])
    assert sorted(
        (int(r.batch_size), r.kind, None if r.kind == "baseline" else int(r.k)) for r in runs.itertuples()
    ) == [(1, "baseline", None), (1, "speculative", 4), (2, "baseline", None), (2, "speculative", 4)]


def test_a_k_auto_grid_draws_each_batch_size_predicted_curve_beside_its_measurements(empty_db):
    from storage.jobs.experiments import set_predicted_curve

    store = open_store(empty_db)
    eid = enqueue_experiment(
        store,
        name="auto grid",
        target="tgt",
        draft="drf",
        prompts="code:tune",
        sampling={"max_new_tokens": 64},
        sweep_values=[4],
        k_auto=4,
        batch_sizes=[1, 2],
        prompt_texts=[f"p{i}" for i in range(4)],
    )
    curves = {1: ({1: 1.2, 2: 1.4, 3: 1.35, 4: 1.3}, [2, 3]), 2: ({1: 1.05, 2: 1.1, 3: 1.0, 4: 0.95}, [2])}
    set_predicted_curve(store, eid, *curves[1], by_batch_size=curves)
    for r in q.runs(store, eid).itertuples():
        run_state.finish_run(store, int(r.run_id), "done")
    with store.write() as conn:
        conn.execute(
            text(
                "UPDATE runs SET speedup = 1.25, speedup_ci_lo = 1.2, speedup_ci_hi = 1.3 "
                "WHERE experiment_id = :e AND kind = 'speculative'"
            ),
            {"e": eid},
        )
    at = app("experiment", experiment=eid)
    assert_clean(at)
    drawn = [d for chart in chart_data(at) for d in chart]
    predicted = next(d for d in drawn if "predicted_speedup" in d and "batch" in d)
    assert {b: dict(zip(g["x"].astype(int), g["predicted_speedup"])) for b, g in predicted.groupby("batch")} == {
        "batch 1": curves[1][0],
        "batch 2": curves[2][0],
    }
    assert f"experiment{eid}_k_auto_curves.csv" in downloads(at)


def test_off_batch_sizes_share_one_caption():
    """Every off batch size's cross sits at (0, 1×); their captions, stacked, overlapped into an unreadable block
    (four off batch sizes on the README grid): one caption names them all."""
    from pages.panels.schedule_panel import served_frame

    steps = [
        {
            "batch_size": b,
            "k": 0,
            "off": True,
            "loses": b == 16,
            "gains": False,
            "run_id": None,
            "speedup": 0.9,
            "speedup_ci": [0.8, 1.05],
            "value": None,
        }
        for b in (2, 4, 16)
    ]
    frame = served_frame({"steps": steps}, pd.DataFrame({"run_id": [], "k": []}), "k")
    assert list(frame["caption"]) == ["off (k = 0): batch 2, batch 4, batch 16", "", ""]
    assert list(frame["label"]) == ["batch 2: off (k = 0)", "batch 4: off (k = 0)", "batch 16: off (k = 0)"]


def test_the_experiments_page_names_a_grids_batch_sizes(grid):
    store, eid, ids = grid
    at = app("experiments")
    assert_clean(at)
    listing = next(d.value for d in at.dataframe if "batch_sizes" in d.value)
    row = listing.set_index("experiment_id").loc[eid]
    assert list(row["batch_sizes"]) == [1, 4, 16]


def test_every_findings_follow_up_link_keeps_the_grid_and_the_draft_sampling(grid):
    """ "Try it" on a grid's finding (the tie among them) opened the form at batch 1 with "At batch sizes" empty; a
    follow-up measures where its experiment did: the grid's batch sizes, and its draft sampling."""
    from pages.widgets.prefill import parse_prefill
    from storage.analysis import findings as fd

    store, eid, _ = grid
    with store.write() as conn:
        conn.execute(text("UPDATE experiments SET draft_sampling = 'greedy' WHERE id = :e"), {"e": eid})
    found = [f for f in fd.findings(store, eid) if f["prefill"] and f["prefill"].get("page", "new") == "new"]
    assert found and "tie" in {f["kind"] for f in found}, [f["kind"] for f in found]
    for finding in found:
        page, params = fd.prefill_query(finding["prefill"])
        values, notes = parse_prefill(params, ["code:tune"])
        assert notes == [], (finding["kind"], notes)
        assert values["draft_sampling"] == "greedy", finding["kind"]
        assert "grid_batch_sizes" in values and "batch_size" not in values, (finding["kind"], params)
    at = app("new", **fd.prefill_query(next(f for f in found if f["kind"] == "tie")["prefill"])[1])
    assert_clean(at)
    assert at.text_input(key="grid_batch_sizes").value == "1,4,16"
    assert at.selectbox(key="draft_sampling").value == "greedy"
    assert at.number_input(key="batch_size").disabled  # the grid lists the batch sizes


def test_a_findings_link_of_one_batch_size_keeps_it():
    from pages.widgets.prefill import parse_prefill

    values, notes = parse_prefill({"batch_size": "4", "draft_sampling": "greedy"}, ["code:tune"])
    assert values == {"batch_size": 4, "draft_sampling": "greedy"} and notes == []
    values, notes = parse_prefill({"batch_size": "0", "draft_sampling": "argmax"}, ["code:tune"])
    assert values == {} and len(notes) == 2


def _headline(too_wide: bool) -> None:
    from pages.panels.schedule_panel import headline

    headline(
        {
            "text": "k schedule: batch 1: k = 2 (1.71× (1.59–1.85)); batch 4: off",
            "steps": [{"batch_size": 1, "too_wide": too_wide}, {"batch_size": 4, "too_wide": False}],
        }
    )


def test_the_schedule_headline_is_titled_by_its_own_name_and_yellow_only_when_too_wide():
    """A normal schedule was a yellow ⚠ box titled "Schedule: k schedule: …": now the verdict's blue box titled
    "k schedule:", and yellow only when a batch size is too wide to choose by, its title saying which."""
    from streamlit.testing.v1 import AppTest

    normal = AppTest.from_function(_headline, args=(False,)).run()
    assert not normal.warning and [_plain(i.value) for i in normal.info] == [
        "**k schedule:** batch 1: k = 2 (1.71× (1.59–1.85)); batch 4: off."
    ]
    wide = AppTest.from_function(_headline, args=(True,)).run()
    title = _plain(wide.warning[0].value).split(":**")[0]  # the bold title, which names the batch size
    assert not wide.info and title.startswith("**k schedule") and not missing(title, "too wide", "batch 1"), title
