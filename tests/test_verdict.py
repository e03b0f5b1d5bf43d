"""The one verdict (storage/analysis/verdict.py): which run is best, which are tied with it, the cheaper tied choice,
and every reader of it (deploy, validation, findings, the listing, the CLI) agreeing on it. Crafted runs whose speedups
and intervals are set directly, SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from engine.config.variables import variable
from storage.analysis import catalog
from storage.analysis import findings as fd
from storage.analysis.validation import validation_plan
from storage.analysis.verdict import verdict, verdict_dict
from storage.jobs import experiments, run_state
from storage.records import queries as q
from storage.serving.deploy import DeployError, deploy_document
from tests.meaning import missing


def _experiment(store, sweep_variable="k", values=(1, 2, 4), **kw):
    return experiments.enqueue_experiment(
        store,
        name="v",
        target="tgt",
        draft="drf",
        prompts="code:tune",
        sampling={"temperature": 0.0, "max_new_tokens": 64},
        sweep_variable=sweep_variable,
        sweep_values=list(values),
        prompt_texts=["p0", "p1"],
        **kw,
    )


def _measured(store, eid, speedups: dict, warned=(), status="done", **columns) -> dict:
    """Finish every run and give the speculative ones (keyed by their swept value) speedup and interval."""
    experiment = q.experiment(store, eid)
    assert experiment is not None
    swept = variable(experiment["sweep_variable"])
    runs = q.runs(store, eid)
    ids = {}
    for r in runs.itertuples():
        if r.kind == "baseline" or status == "done":  # else the speculative runs stay queued
            run_state.finish_run(store, int(r.run_id), "done")
    with store.write() as conn:
        for _, r in runs[runs["kind"] == "speculative"].iterrows():
            value = swept.run_value(r)
            ids[value] = int(r.run_id)
            s, lo, hi = speedups[value]
            conn.execute(
                text(
                    "UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi, "
                    "timing_warning = :w WHERE id = :rid"
                ),
                {"s": s, "lo": lo, "hi": hi, "w": "drifted" if value in warned else None, "rid": r.run_id},
            )
            for column, by_value in columns.items():
                conn.execute(
                    text(f"UPDATE runs SET {column} = :v WHERE id = :rid"), {"v": by_value[value], "rid": r.run_id}
                )
    return ids


def test_the_cheaper_tied_k_is_chosen_and_said(store):
    eid = _experiment(store)
    ids = _measured(store, eid, {1: (1.25, 1.18, 1.33), 2: (1.31, 1.22, 1.40), 4: (1.10, 1.05, 1.15)})
    v = verdict(store, eid)
    assert (v.best.value, v.best.run_id) == (2, ids[2]) and [c.value for c in v.tied] == [1]
    assert (v.chosen.value, v.chosen.run_id, v.cheaper.value) == (1, ids[1], 1) and not v.too_wide
    assert not missing(v.text, "best k 2 at 1.31× (1.22–1.40)", "tied with 1", "cheaper tied k = 1"), v.text
    d = verdict_dict(store, eid)
    assert (d["best"], d["best_run_id"], d["chosen"], d["chosen_run_id"], d["cheaper"], d["tied_with"]) == (
        2,
        ids[2],
        1,
        ids[1],
        1,
        [1],
    )
    json.dumps(d)  # plain JSON
    # A tie with a dearer k only: the best itself is deployed.
    eid = _experiment(store)
    _measured(store, eid, {1: (1.05, 1.00, 1.10), 2: (1.31, 1.22, 1.40), 4: (1.25, 1.18, 1.33)})
    v = verdict(store, eid)
    assert [c.value for c in v.tied] == [4] and v.chosen is v.best and v.cheaper is None
    assert "cheaper" not in v.text


def test_a_sampling_sweep_has_no_cheaper_value(store):
    eid = _experiment(store, "temperature", (0.0, 0.7))
    _measured(store, eid, {0.0: (1.20, 1.10, 1.30), 0.7: (1.25, 1.15, 1.35)})
    v = verdict(store, eid)
    assert (v.best.value, [c.value for c in v.tied], v.chosen.value) == (0.7, [0.0], 0.7)


def test_a_drafter_sweep_deploys_by_name_and_prefers_no_draft_model_when_tied(store, db_url, capsys):
    """The issue's reproduction: `--drafter model,prompt-lookup:3` then `export --format deploy` said "no best run
    yet" (the verdict returned a label, deploy compared it with sweep_value)."""
    from app.cli import main

    eid = _experiment(store, "drafter", ("model", "prompt-lookup:3"), k=2)
    ids = _measured(store, eid, {"model": (1.40, 1.30, 1.50), "prompt-lookup:3": (1.35, 1.28, 1.44)})
    v = verdict(store, eid)
    assert (v.best.value, v.chosen.value) == ("model", "prompt-lookup:3")
    assert not missing(v.text, "cheaper tied drafter = prompt-lookup:3", "no draft model"), v.text  # and why
    assert main(["export", str(eid), "--format", "deploy", "--db", db_url]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["run_id"], doc["chosen"]) == (ids["prompt-lookup:3"], "cheaper tied")
    assert doc["configuration"]["drafter"] == "prompt-lookup:3" and doc["configuration"]["k"] == 2
    assert json.loads(doc["engines"]["vllm"]["speculative_config"])["method"] == "ngram"
    assert any(not missing(c, "tied", "drafter = model") for c in doc["caveats"]), doc["caveats"]
    # Not tied: the measured best, named by its label, is deployed.
    eid = _experiment(store, "drafter", ("model", "prompt-lookup:3"), k=2)
    ids = _measured(store, eid, {"model": (1.60, 1.55, 1.65), "prompt-lookup:3": (1.35, 1.28, 1.44)})
    doc = deploy_document(store, eid)
    assert (doc["run_id"], doc["chosen"], doc["configuration"]["drafter"]) == (ids["model"], "best", "model")
    assert doc["caveats"] == []


def test_a_draft_sweep_prefers_the_smaller_tied_draft_when_sizes_are_known(store):
    eid = _experiment(store, "draft", ("big-draft", "small-draft"))
    speed = {"big-draft": (1.40, 1.30, 1.50), "small-draft": (1.35, 1.28, 1.44)}
    ids = _measured(store, eid, speed, draft_parameters={"big-draft": 500_000_000, "small-draft": 100_000_000})
    v = verdict(store, eid)
    assert (v.best.run_id, v.chosen.run_id, v.chosen.value) == (ids["big-draft"], ids["small-draft"], "small-draft")
    plan = validation_plan(store, eid)  # validation reruns what deploy carries
    assert plan["draft"] == "small-draft"
    eid = _experiment(store, "draft", ("big-draft", "small-draft"))
    _measured(store, eid, speed)  # sizes unknown: no cheaper one
    assert verdict(store, eid).chosen.value == "big-draft"


def test_a_timing_warned_or_unfinished_run_is_never_chosen_by_any_reader(store):
    eid = _experiment(store, values=(1, 2))
    ids = _measured(store, eid, {1: (1.20, 1.15, 1.25), 2: (3.00, 2.90, 3.10)}, warned=(2,))
    v = verdict(store, eid)
    assert (v.best.value, v.tied, v.chosen.value) == (1, (), 1)
    assert deploy_document(store, eid)["run_id"] == ids[1]
    assert validation_plan(store, eid)["k"] == 1  # validation used to take the fastest run, warned or not
    listing = catalog.experiments(store).set_index("experiment_id").loc[eid]
    assert (listing.best_value, listing.best_speedup, listing.n_tied) == (1, 1.20, 0)
    eid = _experiment(store, values=(1, 2))
    _measured(store, eid, {1: (1.20, 1.15, 1.25), 2: (1.30, 1.25, 1.35)}, status="queued")
    v = verdict(store, eid)
    assert v.best is None and v.chosen is None and v.pending == 2 and v.text == "no finished run to choose from yet"
    with pytest.raises(DeployError, match="no best run yet"):
        deploy_document(store, eid)


def test_the_listing_and_the_verdict_agree(store):
    for speeds in (
        {1: (1.25, 1.18, 1.33), 2: (1.31, 1.22, 1.40), 4: (1.10, 1.05, 1.15)},
        {1: (1.31, 1.22, 1.40), 2: (1.31, 1.25, 1.37), 4: (1.40, 1.39, 1.41)},
        {1: (1.0, 0.5, 1.5), 2: (1.1, 0.6, 1.6), 4: (1.2, 0.7, 1.7)},
    ):
        eid = _experiment(store)
        _measured(store, eid, speeds)
        v = verdict(store, eid)
        row = catalog.experiments(store).set_index("experiment_id").loc[eid]
        assert (row.best_value, row.best_speedup, row.n_tied) == (v.best.value, v.best.speedup, len(v.tied))


def test_deploy_states_ties_and_a_too_wide_interval_and_never_copies_the_test_length_unless_asked(store):
    eid = _experiment(store)
    ids = _measured(store, eid, {1: (1.25, 1.02, 1.60), 2: (1.31, 1.03, 1.70), 4: (1.28, 1.01, 1.65)})
    doc = deploy_document(store, eid)
    assert (doc["run_id"], doc["chosen"], doc["configuration"]["k"]) == (ids[1], "cheaper tied", 1)
    caveats = " ".join(doc["caveats"])
    assert "k = 1 (1.25×, 1.02–1.60) is statistically tied with the best, k = 2" in caveats
    assert "Also tied with the best: k = 4" in caveats and "too wide to choose by" in caveats
    assert doc["verdict"]["too_wide"] and doc["verdict"]["chosen"] == 1
    assert doc["configuration"]["max_new_tokens"] is None and doc["measured"]["max_new_tokens"] == 64
    for engine in ("vllm", "sglang"):
        assert "max_tokens" not in doc["engines"][engine]["request"]
    assert "max_new_tokens" not in doc["engines"]["transformers"]["generate_kwargs"]
    assert any(not missing(n, "No length", "64") for n in doc["engines"]["vllm"]["notes"]), doc["engines"]["vllm"]
    asked = deploy_document(store, eid, with_max_new_tokens=True)
    assert asked["configuration"]["max_new_tokens"] == 64
    assert (
        asked["engines"]["vllm"]["request"]["max_tokens"] == asked["engines"]["sglang"]["request"]["max_tokens"] == 64
    )
    assert asked["engines"]["transformers"]["generate_kwargs"]["max_new_tokens"] == 64
    named = deploy_document(store, eid, ids[4])
    assert named["chosen"] == "given" and not missing(named["caveats"][0], f"Run {ids[4]} ", "named", "k = 1")


def test_cli_export_takes_with_max_new_tokens_for_deploy_only(store, db_url, capsys):
    from app.cli import main

    eid = _experiment(store, values=(2,))
    _measured(store, eid, {2: (1.31, 1.22, 1.40)})
    assert main(["export", str(eid), "--format", "deploy", "--with-max-new-tokens", "--db", db_url]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["engines"]["vllm"]["request"]["max_tokens"] == 64
    assert main(["export", str(eid), "--format", "json", "--with-max-new-tokens", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not missing(err, "--with-max-new-tokens", "--format deploy"), err


def test_findings_take_the_cheaper_tied_choice_and_the_focus_run_is_the_verdicts(store):
    eid = _experiment(store, "drafter", ("model", "prompt-lookup:3"), k=2)
    ids = _measured(store, eid, {"model": (1.40, 1.30, 1.50), "prompt-lookup:3": (1.35, 1.28, 1.44)})
    tie = next(f for f in fd.findings(store, eid) if f["kind"] == "tie")
    assert tie["data"]["cheaper"] == "prompt-lookup:3" and tie["data"]["best"] == "model"
    assert not missing(tie["next"], "cheaper drafter = prompt-lookup:3", "no draft model"), tie["next"]
    assert "drafter = model at 1.40×" in tie["detail"]
    from storage.analysis.findings.base import _Context
    from storage.analysis.findings.rejections import _focus_run

    ctx = _Context(store, q.experiment(store, eid), q.runs(store, eid), verdict(store, eid))
    row, why = _focus_run(ctx)
    assert (int(row.run_id), why) == (ids["model"], "the best run")  # the label used to miss (sweep_value compared)


def test_the_listing_names_a_draft_sweeps_best_by_its_label(store):
    """A drafter sweep's best run is listed by its name (best_label), not the index its sweep_value stores; the
    Experiments and Compare tables show best_label."""
    from pages.compare import EXPERIMENT_COLUMNS as COMPARE
    from pages.experiments import COLUMNS as LISTING
    from storage.analysis import catalog
    from storage.jobs import experiments as ex

    eid = ex.enqueue_experiment(
        store,
        name="drafters",
        target="t",
        draft="d",
        prompts="inline",
        sampling={"max_new_tokens": 8},
        sweep_variable="drafter",
        sweep_values=["model", "prompt-lookup:3"],
        prompt_texts=["p0"],
    )
    with store.write() as conn:
        conn.execute(
            text(
                "UPDATE runs SET status = 'done', speedup = 1.5, speedup_ci_lo = 1.4, speedup_ci_hi = 1.6 "
                "WHERE experiment_id = :e AND sweep_label = 'prompt-lookup:3'"
            ),
            {"e": eid},
        )
        conn.execute(text("UPDATE runs SET status = 'done' WHERE experiment_id = :e AND kind = 'baseline'"), {"e": eid})
    row = catalog.experiments(store).set_index("experiment_id").loc[eid]
    assert row["best_label"] == "prompt-lookup:3" and row["best_value"] == 1
    assert "best_label" in LISTING and "best_label" in COMPARE and "best_value" not in LISTING + COMPARE


def test_a_greedy_run_whose_outputs_differ_fails_as_not_lossless_and_is_never_judged_or_deployed(store):
    """The worker closes a greedy run whose stored token ids differ from its baseline's as failed, naming the first
    differing prompt and token; the verdict never chooses it (though its speedup is the highest) and deploy refuses
    it by name."""
    import random

    from app.worker.worker import Worker
    from benchmarks.bench_queries import record, synthetic_baseline, synthetic_prompt

    eid = _experiment(store, values=(1, 2))
    runs = q.runs(store, eid)
    base_id = int(runs[runs["kind"] == "baseline"]["run_id"].iloc[0])
    ids = {int(r.k): int(r.run_id) for r in runs[runs["kind"] == "speculative"].itertuples()}
    worker = Worker(store, worker_id="w-lossless", log=lambda message: None)
    assert sorted(run_state.claim_group(store, eid, worker.id)) == sorted([base_id, *ids.values()])
    rng = random.Random(0)
    baseline = [synthetic_baseline(rng, i, 12) for i in range(2)]
    for rid in (base_id, *ids.values()):
        run_state.start_run(store, rid, 2, "cpu")
    for i, base in enumerate(baseline):
        record(store, base_id, "baseline", base)
        for k, rid in ids.items():
            spec = synthetic_prompt(rng, i, k, rounds=3)
            spec.output_ids = list(base.output_ids)
            if k == 2 and i == 1:
                spec.output_ids[5] += 1  # prompt 1 parts from the baseline at new token 5
            record(store, rid, "speculative", spec)
    assert run_state.not_lossless(store, ids[1]) is None and run_state.not_lossless(store, base_id) is None
    for rid in (base_id, *ids.values()):
        worker._finish(rid, "done", None, None, None, f"run {rid}")
    after = q.runs(store, eid).set_index("run_id")
    assert after.loc[ids[2], "status"] == "failed"
    assert not missing(after.loc[ids[2], "error"], "not lossless", "prompt 1", "token 5"), after.loc[ids[2], "error"]
    assert (after.loc[ids[1], "status"], after.loc[base_id, "status"]) == ("done", "done")
    with store.write() as conn:  # k = 2 measured fastest: it must still never be judged
        for k, speed in ((1, (1.2, 1.1, 1.3)), (2, (1.9, 1.8, 2.0))):
            conn.execute(
                text("UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi WHERE id = :r"),
                {"s": speed[0], "lo": speed[1], "hi": speed[2], "r": ids[k]},
            )
    v = verdict(store, eid)
    assert [c.run_id for c in v.candidates] == [ids[1]] and v.chosen.run_id == ids[1]
    assert deploy_document(store, eid)["run_id"] == ids[1]
    with pytest.raises(DeployError, match=r"not lossless\b.*prompt 1\b.*token 5\b"):
        deploy_document(store, eid, ids[2])
