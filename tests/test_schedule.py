"""A batch × k grid (issue 20, items 2 and 4): `--batch-size 1,4,16 --k 1,2,4` is one experiment whose k sweep runs
at each batch size with its own target-only baseline there; storage/analysis/schedule.py judges each batch size with the
one verdict rule and gives the k to serve (0 where speculation measurably loses) and vLLM's
num_speculative_tokens_per_batch_size. Crafted speedups on SQLite and PostgreSQL, the CLI's grid end to end."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from app.sweep import parse_sweep
from engine.errors import DraftLabError
from storage.analysis import catalog
from storage.analysis.schedule import schedule
from storage.analysis.verdict import verdict
from storage.db.errors import QueueError
from storage.jobs import experiments, run_state
from storage.records import queries as q
from storage.serving.export import run_document
from tests.meaning import missing

OPTIONS = {
    "k": "4",
    "temperature": "0",
    "top_k": "0",
    "top_p": "1",
    "batch_size": "1",
    "draft": "d",
    "drafter": "model",
    "draft_sampling": "probabilistic",
}


def _grid(store, sizes=(1, 4, 16), ks=(1, 2, 4), prompts=16, **kw):
    return experiments.enqueue_experiment(
        store,
        name="grid",
        target="tgt",
        draft="drf",
        prompts="code:tune",
        sampling={"temperature": 0.0, "max_new_tokens": 64},
        sweep_values=list(ks),
        batch_sizes=list(sizes),
        prompt_texts=[f"p{i}" for i in range(prompts)],
        **kw,
    )


def _measure(store, eid, speeds: dict) -> dict:
    """Finish every run; give the speculative run at (batch size, k) speedup and interval speeds[(B, k)]."""
    runs = q.runs(store, eid)
    ids = {}
    for r in runs.itertuples():
        run_state.finish_run(store, int(r.run_id), "done")
    with store.write() as conn:
        for r in runs[runs["kind"] == "speculative"].itertuples():
            key = (int(r.batch_size), int(r.k))
            ids[key] = int(r.run_id)
            s, lo, hi = speeds[key]
            conn.execute(
                text("UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi WHERE id = :rid"),
                {"s": s, "lo": lo, "hi": hi, "rid": r.run_id},
            )
    return ids


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


def test_a_grid_queues_the_sweep_at_each_batch_size_with_its_own_baseline(store):
    eid = _grid(store)
    runs = q.runs(store, eid)
    assert len(runs) == 3 * (1 + 3)
    baselines = runs[runs["kind"] == "baseline"].set_index("run_id")["batch_size"].to_dict()
    assert sorted(baselines.values()) == [1, 4, 16]
    for r in runs[runs["kind"] == "speculative"].itertuples():
        assert baselines[int(r.baseline_run_id)] == int(r.batch_size)  # paired at its own batch size
    assert sorted((int(r.batch_size), int(r.k)) for r in runs[runs["kind"] == "speculative"].itertuples()) == [
        (b, k) for b in (1, 4, 16) for k in (1, 2, 4)
    ]
    exp = q.experiment(store, eid)
    assert q.grid_sizes(exp) == [1, 4, 16] and exp["sweep_variable"] == "k" and exp["batch_size"] == 1
    # Not a grid: no batch sizes, no schedule.
    plain = experiments.enqueue_experiment(
        store, name="one", target="t", draft="d", prompts="code:tune", sampling={}, sweep_values=[1, 2]
    )
    assert q.grid_sizes(q.experiment(store, plain)) is None and schedule(store, plain) is None


def test_the_schedule_judges_each_batch_size_and_switches_speculation_off_where_it_loses(store):
    eid = _grid(store)
    ids = _measure(store, eid, SPEEDS)
    s = schedule(store, eid)
    assert [(step.batch_size, step.k) for step in s.steps] == [(1, 2), (4, 1), (16, 0)]
    one, four, sixteen = s.steps
    assert one.gains and not one.loses and one.verdict.best.run_id == ids[(1, 2)]
    # At batch 4, k=2 is best, tied with k=1: the cheaper tied k is served.
    assert four.verdict.best.run_id == ids[(4, 2)] and four.verdict.chosen.run_id == ids[(4, 1)] and four.gains
    assert sixteen.loses and sixteen.value is None and sixteen.verdict.best.run_id == ids[(16, 1)]
    assert sixteen.text == (
        "at batch 16 speculation costs 8 % (0.92× (0.88–0.96) at the best k, 1): switch it off (k = 0) at batch 16"
    )
    assert s.ranges == [[1, 3, 2], [4, 15, 1], [16, 16, 0]] and s.off_from == 16
    assert s.text.endswith("Switch speculation off from batch 16")
    assert "batch 1: k = 2 (1.40× (1.32–1.48))" in s.text
    # The experiment's one verdict (listing, deploy base) is the smallest batch size's, and says so.
    v = verdict(store, eid)
    assert v.best.run_id == ids[(1, 2)] and v.text.startswith("at batch 1: best k 2")
    row = catalog.experiments(store).set_index("experiment_id").loc[eid]
    assert (row.best_value, row.best_speedup, row.n_tied) == (2, 1.40, len(v.tied)) == (2, 1.40, 1)  # k=4 ties
    doc = run_document(store, eid, with_outputs=False)
    assert doc["batch_sizes"] == [1, 4, 16] and doc["schedule"]["num_speculative_tokens_per_batch_size"] == [
        [1, 3, 2],
        [4, 15, 1],
        [16, 16, 0],
    ]
    assert [(e["batch_size"], e["k"]) for e in doc["k_schedule"]] == [(1, 2), (4, 1), (16, 0)]
    assert list(doc["k_schedule"][0]) == ["batch_size", "k", "speedup", "speedup_ci", "tied_with"]
    assert doc["k_schedule"][2]["speedup"] is None and doc["k_schedule"][2]["text"].startswith("at batch 16")
    json.dumps(doc)


def test_where_no_k_is_measurably_faster_the_target_alone_is_served(store):
    """The target alone (1×, no draft) is one more candidate, the cheapest: tied with a best whose interval includes
    1, it is served; a cheaper k tied with the best but not itself measurably faster is never served."""
    eid = _grid(store, sizes=(2, 8), ks=(1, 3))
    ids = _measure(
        store,
        eid,
        {(2, 1): (1.1, 0.98, 1.2), (2, 3): (1.3, 1.2, 1.4), (8, 1): (1.01, 0.95, 1.07), (8, 3): (0.97, 0.90, 1.04)},
    )
    s = schedule(store, eid)
    assert [(step.batch_size, step.k, step.gains, step.loses, step.off) for step in s.steps] == [
        (2, 3, True, False, False),
        (8, 0, False, False, True),
    ]
    two, eight = s.steps
    # At batch 2 the cheaper tied k = 1 reaches 1×: k = 3, measurably faster, is served, and the verdict at batch 2
    # chooses the same (one rule: storage/analysis/verdict.py's `serve`).
    assert two.verdict.chosen.run_id == two.served.run_id == ids[(2, 3)] and two.verdict.k == two.k == 3
    assert not missing(two.text, "k = 1", "tied", "not measurably faster"), two.text
    assert eight.served is None and eight.value is None and "serve the target alone there" in eight.text
    assert s.ranges == [[1, 7, 3], [8, 8, 0]] and s.off_from == 8
    assert not missing(s.text, "batch 8: off", "not measurably faster", "1.01× (0.95–1.07)"), s.text
    assert s.as_dict()["steps"][1]["off"] is True and s.as_dict()["steps"][1]["run_id"] is None


def test_one_k_everywhere_merges_into_one_range(store):
    eid = _grid(store, sizes=(2, 8), ks=(1, 3))
    _measure(
        store,
        eid,
        {(2, 1): (1.3, 1.2, 1.4), (2, 3): (1.1, 1.0, 1.2), (8, 1): (1.2, 1.1, 1.3), (8, 3): (0.97, 0.90, 1.04)},
    )
    assert schedule(store, eid).ranges == [[1, 8, 1]]  # the first range starts at 1 (vLLM's rule)


def test_a_pending_batch_size_is_left_out_of_the_ranges(store):
    eid = _grid(store, sizes=(1, 4), ks=(1, 2))
    runs = q.runs(store, eid)
    for r in runs[runs["batch_size"] == 1].itertuples():
        run_state.finish_run(store, int(r.run_id), "done")
    with store.write() as conn:
        conn.execute(
            text(
                "UPDATE runs SET speedup = 1.3, speedup_ci_lo = 1.2, speedup_ci_hi = 1.4 "
                "WHERE experiment_id = :e AND kind = 'speculative' AND batch_size = 1"
            ),
            {"e": eid},
        )
    s = schedule(store, eid)
    assert [(step.batch_size, step.k) for step in s.steps] == [(1, 1), (4, None)]
    assert s.ranges == [[1, 1, 1]] and not missing(s.steps[1].text, "batch 4", "no finished run"), s.steps[1].text


def test_bad_grids_are_refused_before_anything_is_stored(store):
    before = len(catalog.experiments(store))
    for sizes, message in (
        ([0, 4], "whole numbers"),
        ([4, 4], "twice"),
        ([1, 2.5], "whole numbers"),
        ([1, 257], "whole numbers"),
    ):
        with pytest.raises(QueueError, match=message):
            _grid(store, sizes=sizes)
    with pytest.raises(QueueError, match="needs at least 16 prompts"):
        _grid(store, sizes=(1, 16), prompts=8)
    with pytest.raises(QueueError, match="not both"):
        experiments.enqueue_experiment(
            store,
            name="g",
            target="t",
            draft="d",
            prompts="p",
            sampling={},
            sweep_variable="batch_size",
            sweep_values=[1, 2],
            batch_sizes=[1, 2],
        )
    assert len(catalog.experiments(store)) == before


def test_the_cli_parses_a_grid_and_refuses_a_third_list():
    sweep = parse_sweep({**OPTIONS, "k": "1,2,4", "batch_size": "16,1,4"})
    assert (sweep.variable, sweep.values, sweep.batch_sizes, sweep.sizes) == ("k", [1, 2, 4], [1, 4, 16], [1, 4, 16])
    alone = parse_sweep({**OPTIONS, "batch_size": "1,4"})  # batch size alone is a batch-size sweep, not a grid
    assert (alone.variable, alone.batch_sizes) == ("batch_size", None)
    with pytest.raises(DraftLabError, match="one variable at a time"):
        parse_sweep({**OPTIONS, "k": "1,2", "top_p": "0.9,1", "batch_size": "1,4"})
    with pytest.raises(DraftLabError, match="one variable at a time"):
        parse_sweep({**OPTIONS, "k": "1,2", "top_p": "0.9,1"})


def test_cli_runs_a_grid_end_to_end(tmp_path, model_dirs, capsys):
    """`--batch-size 1,2 --k 1,2`: one experiment, a baseline per batch size, every output equal to its baseline's
    (greedy), the schedule in the JSON and in the table."""
    from app.report import format_table
    from tests.cli_runs import run_json

    doc, _ = run_json(
        tmp_path, model_dirs, capsys, "--k", "1,2", "--batch-size", "1,2", "--max-new-tokens", "8", "--repeats", "1"
    )
    assert doc["batch_sizes"] == [1, 2] and len(doc["baselines"]) == 2 and len(doc["runs"]) == 4
    assert sorted((r["batch_size"], r["k"]) for r in doc["runs"]) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(r["outputs_match_baseline"] is True and r["status"] == "done" for r in doc["runs"])
    base_of = {b["run_id"]: b["batch_size"] for b in doc["baselines"]}
    assert all(base_of[r["baseline_run_id"]] == r["batch_size"] for r in doc["runs"])
    assert [step["batch_size"] for step in doc["schedule"]["steps"]] == [1, 2]
    table = format_table(doc)
    assert "baseline at batch 2:" in table and doc["schedule"]["text"] in table


def test_deploy_carries_the_schedule_to_vllm_and_says_what_other_engines_cannot(store):
    from storage.serving.deploy import deploy_document

    eid = _grid(store)
    ids = _measure(store, eid, SPEEDS)
    doc = deploy_document(store, eid)
    assert doc["run_id"] == ids[(1, 2)] and doc["configuration"]["k"] == 2  # batch 1's choice
    spec = json.loads(doc["engines"]["vllm"]["speculative_config"])
    assert spec["num_speculative_tokens"] == 2
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 3, 2], [4, 15, 1], [16, 16, 0]]
    assert "num_speculative_tokens_per_batch_size" in doc["engines"]["vllm"]["command"]
    for engine in ("sglang", "llama_cpp"):
        assert any(n.startswith("Not expressible") and "batch 16: off" in n for n in doc["engines"][engine]["notes"])
    assert any("one request at a time" in n for n in doc["engines"]["transformers"]["notes"])
    assert doc["schedule"]["off_from"] == 16 and any(c.startswith("A grid: k schedule") for c in doc["caveats"])
    # A named run deploys that run alone, no schedule.
    named = deploy_document(store, eid, run_id=ids[(4, 1)])
    assert (
        "schedule" not in named
        and "num_speculative_tokens_per_batch_size" not in named["engines"]["vllm"]["speculative_config"]
    )


def test_deploy_refuses_a_grid_where_speculation_loses_everywhere(store):
    from storage.serving.deploy import DeployError, deploy_document

    eid = _grid(store, sizes=(1, 4), ks=(1, 2))
    _measure(
        store,
        eid,
        {(1, 1): (0.9, 0.85, 0.95), (1, 2): (0.8, 0.7, 0.9), (4, 1): (0.7, 0.6, 0.8), (4, 2): (0.6, 0.5, 0.7)},
    )
    with pytest.raises(DeployError) as err:
        deploy_document(store, eid)
    assert not missing(str(err.value), "not measurably faster", "(1, 4)", "target alone"), err.value


def test_a_grid_with_one_k_everywhere_needs_no_schedule_key(store):
    from storage.serving.deploy import deploy_document

    eid = _grid(store, sizes=(1, 4), ks=(1, 2))
    _measure(
        store,
        eid,
        {(1, 1): (1.1, 1.05, 1.15), (1, 2): (1.4, 1.3, 1.5), (4, 1): (1.0, 0.95, 1.05), (4, 2): (1.2, 1.15, 1.25)},
    )
    spec = json.loads(deploy_document(store, eid)["engines"]["vllm"]["speculative_config"])
    assert spec["num_speculative_tokens"] == 2 and "num_speculative_tokens_per_batch_size" not in spec


def test_findings_say_where_to_switch_speculation_off_and_which_batch_sizes_are_undecided(store):
    from storage.analysis.findings import findings, prefill_url

    eid = _grid(store)
    _measure(store, eid, SPEEDS)
    found = [f for f in findings(store, eid) if f["kind"] == "schedule"]
    assert [f["title"] for f in found] == ["Switch speculation off from batch 16"]
    detail = found[0]["detail"]
    assert detail.startswith("At batch 16 speculation costs 8 % (0.92× (0.88–0.96) at the best k, 1)")
    assert not missing(detail, "serve k = 2 at 1.40× (1.32–1.48)", "serve k = 1 at 1.10×"), detail  # where it pays
    assert found[0]["prefill"]["batch_sizes"] == "4,7,10,13,16" and found[0]["data"]["off_from"] == 16
    assert "batch_sizes=4%2C7%2C10%2C13%2C16" in prefill_url(found[0]["prefill"])
    # Batch 8 neither gains nor loses: a warning naming it, with more repeats.
    eid = _grid(store, sizes=(2, 8), ks=(1, 3))
    _measure(
        store,
        eid,
        {(2, 1): (1.3, 1.2, 1.4), (2, 3): (1.1, 1.0, 1.2), (8, 1): (1.01, 0.95, 1.07), (8, 3): (0.97, 0.90, 1.04)},
    )
    found = {f["title"]: f for f in findings(store, eid) if f["kind"] == "schedule"}
    assert set(found) == {"Switch speculation off from batch 8", "No measurable gain at batch 8"}
    assert found["No measurable gain at batch 8"]["severity"] == "warning"
    assert found["No measurable gain at batch 8"]["prefill"]["batch_sizes"] == "8"
    # Not a grid: no schedule finding.
    plain = experiments.enqueue_experiment(
        store, name="one", target="t", draft="d", prompts="code:tune", sampling={}, sweep_values=[1, 2]
    )
    assert not [f for f in findings(store, plain) if f["kind"] == "schedule"]


def test_the_other_findings_look_at_the_smallest_batch_size_of_a_grid(store):
    from storage.analysis.findings import findings

    eid = _grid(store, sizes=(1, 4), ks=(1, 2))
    _measure(
        store,
        eid,
        {
            (1, 1): (1.30, 1.25, 1.35),
            (1, 2): (1.28, 1.20, 1.36),
            (4, 1): (0.90, 0.85, 0.95),
            (4, 2): (0.80, 0.75, 0.85),
        },
    )
    tie = [f for f in findings(store, eid) if f["kind"] == "tie"]
    # k=1 and k=2 are tied at batch 1; batch 4's runs never enter the batch-1 tie.
    assert len(tie) == 1 and tie[0]["data"]["best"] == 1 and tie[0]["data"]["tied_with"] == [2]
    assert "0.90" not in tie[0]["detail"] and "0.80" not in tie[0]["detail"]


def test_a_grid_runs_through_the_worker_and_reports_every_row_of_a_batch(store, model_dirs):
    """The worker times each batch size's arms together; progress reaches the hook for every prompt of a batch (the
    CLI's bar counted only a batch's first row before), and every run ends done, paired at its batch size."""
    from tests.test_worker import RecordingWorker

    prompts = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13", "t30 t31 t32 t33"]
    eid = experiments.enqueue_experiment(
        store,
        name="grid",
        target=model_dirs["target"],
        draft=model_dirs["draft"],
        prompts="inline",
        sampling={"temperature": 0.0, "max_new_tokens": 6},
        device="cpu",
        sweep_values=[1, 2],
        batch_sizes=[1, 2],
        prompt_texts=prompts,
    )
    seen: dict[int, set] = {}
    worker = RecordingWorker(
        store, progress_hook=lambda run, index, tokens, repeat=0: seen.setdefault(run["id"], set()).add(index)
    )
    with worker:
        worker.work(until_idle=True)
    runs = q.runs(store, eid)
    assert (runs["status"] == "done").all(), runs["error"].tolist()
    assert all(seen[int(rid)] == {0, 1, 2, 3} for rid in runs["run_id"]), seen
    assert [step.k is not None for step in schedule(store, eid).steps] == [True, True]


def test_validation_reruns_the_choice_at_the_batch_size_it_was_measured_at(store):
    from storage.analysis.validation import validation_plan
    from storage.jobs.experiments import get_experiment

    eid = _grid(store, sizes=(4, 8), ks=(1, 2), draft_sampling="greedy")
    ids = _measure(
        store,
        eid,
        {(4, 1): (1.1, 1.05, 1.15), (4, 2): (1.4, 1.3, 1.5), (8, 1): (1.0, 0.95, 1.05), (8, 2): (1.2, 1.15, 1.25)},
    )
    plan = validation_plan(store, eid)
    assert (plan["k"], plan["sampling"]["batch_size"], plan["draft_sampling"]) == (2, 4, "greedy")
    vid = experiments.enqueue_experiment(store, **plan, prompt_texts=[f"q{i}" for i in range(4)])
    runs = q.runs(store, vid)
    assert set(runs["batch_size"]) == {4} and get_experiment(store, vid)["draft_sampling"] == "greedy"
    assert ids[(4, 2)] in q.runs(store, eid)["run_id"].tolist()


def test_the_listing_and_draftlab_list_name_a_grids_batch_sizes(store, capsys):
    from app.cli import main

    eid = _grid(store, sizes=(1, 4), ks=(1, 2))
    listing = catalog.experiments(store).set_index("experiment_id")
    assert listing.loc[eid, "batch_sizes"] == [1, 4]
    plain = experiments.enqueue_experiment(
        store, name="one", target="t", draft="d", prompts="code:tune", sampling={}, sweep_values=[1, 2]
    )
    assert catalog.experiments(store).set_index("experiment_id").loc[plain, "batch_sizes"] is None
    assert main(["list", "--db", store.url]) == 0
    out = capsys.readouterr().out
    assert f"experiment {eid}  grid" in out and "k=[1, 2] at batch sizes [1, 4]" in out
    assert "k=2 @4" in out and "baseline @1" in out


def test_one_answer_the_verdict_schedule_findings_and_every_deploy_tab_serve_the_same_k(store):
    """Issue 27's case: at batch 1 k = 3 (1.17×, 1.07–1.29) is best and k = 1 (1.05×, 0.95–1.16) is tied but not
    measurably faster than the target alone. The verdict, the schedule, the tie finding, and the deploy document with
    every engine's tab serve k = 3 at batch 1 and say which batch size their one k is for; batch 2's entry is asked
    for by name."""
    from storage.analysis import findings as fd
    from storage.analysis.verdict import verdict
    from storage.serving.deploy import DeployError, deploy_document

    eid = _grid(store, sizes=(1, 2), ks=(1, 3), prompts=4)
    ids = _measure(
        store,
        eid,
        {
            (1, 1): (1.05, 0.95, 1.16),
            (1, 3): (1.17, 1.07, 1.29),
            (2, 1): (1.12, 1.06, 1.18),
            (2, 3): (1.15, 1.08, 1.22),
        },
    )
    v, s = verdict(store, eid), schedule(store, eid)
    assert v.chosen.run_id == s.at(1).served.run_id == ids[(1, 3)] and v.k == s.at(1).k == 3
    assert v.cheaper is None and "take the cheaper" not in v.text
    tie = next(f for f in fd.findings(store, eid) if f["kind"] == "tie")
    assert tie["data"]["cheaper"] is None and "Take the cheaper" not in tie["next"]
    doc = deploy_document(store, eid)
    assert (doc["run_id"], doc["batch_size"], doc["configuration"]["k"]) == (ids[(1, 3)], 1, 3)
    assert not any("may not pay" in c for c in doc["caveats"])
    assert "--speculative-num-steps 3" in doc["engines"]["sglang"]["command"]
    assert "--draft-max 3" in doc["engines"]["llama_cpp"]["command"]
    assert doc["engines"]["transformers"]["assistant_generation_config"]["num_assistant_tokens"] == 3
    assert any("schedule's entry for batch 1" in n for n in doc["engines"]["sglang"]["notes"])
    assert any("schedule's batch 1 entry" in n for n in doc["engines"]["transformers"]["notes"])
    two = deploy_document(store, eid, batch_size=2)  # batch 2: k = 1 is tied, measurably faster and cheaper
    assert (two["run_id"], two["batch_size"], two["configuration"]["k"]) == (ids[(2, 1)], 2, 1)
    assert two["verdict"]["chosen_run_id"] == s.at(2).served.run_id == ids[(2, 1)]
    assert any("schedule's entry for batch 2" in n for n in two["engines"]["llama_cpp"]["notes"])
    with pytest.raises(DeployError, match=r"no batch size 4\b.*\b1, 2$"):  # the size asked, the sizes measured
        deploy_document(store, eid, batch_size=4)
