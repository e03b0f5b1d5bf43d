"""Validation on held-out prompts: the plan reruns the best configuration on the other split, the experiment is
linked to the one it validates, and the verdict flips when α drops beyond sampling error or the speedup
interval falls below the tune's (crafted records with known α and timings)."""

from __future__ import annotations

import pytest

from storage.analysis.validation import ValidationError, held_out_prompts, validation_plan, validation_result
from storage.jobs import run_state
from storage.jobs.experiments import enqueue_experiment, get_experiment
from tests.meaning import missing
from tests.test_storage import run_ids
from tests.test_timing_protocol import _base_prompt, _fill, _spec_prompt


def test_held_out_split_of_a_tune_set():
    assert held_out_prompts("code") == held_out_prompts("code:tune") == "code:validation"
    with pytest.raises(ValidationError, match="pass held-out prompts with --prompts"):
        held_out_prompts("code:validation")
    with pytest.raises(ValidationError, match="--prompts FILE"):
        held_out_prompts("/data/my prompts.jsonl")
    assert held_out_prompts("code+english:tune") == "code:validation+english:validation"
    with pytest.raises(ValidationError, match="pass held-out prompts with --prompts"):
        held_out_prompts("code+english:validation")
    with pytest.raises(ValidationError, match="--prompts FILE"):
        held_out_prompts("/data/a+b.jsonl")


def _experiment(store, accepts_by_k: dict, prompts="code:tune", verify=0.010, validates=None, ks=None):
    """An experiment whose k runs accept per round as given (same pattern on each of 6 prompts)."""
    ks = ks or sorted(accepts_by_k)
    eid = enqueue_experiment(
        store,
        name="e",
        target="tgt",
        draft="drf",
        prompts=prompts,
        sampling={"temperature": 0.0, "max_new_tokens": 64},
        sweep_values=ks,
        prompt_texts=[f"p{i}" for i in range(6)],
        validates=validates,
    )
    rows, base = {}, None
    for k, accepts in accepts_by_k.items():
        spec = [
            _spec_prompt(
                i, [a for a in accepts[i % len(accepts)]], k, draft_s=0.002 * k, verify_s=verify * (1 + 0.05 * (i % 3))
            )
            for i in range(6)
        ]
        rows[("speculative", k)] = spec
        base = base or [_base_prompt(i, s.new_tokens, 0.010) for i, s in enumerate(spec)]
    assert base is not None, "at least one k"
    rows[("baseline", None)] = base
    ids = _fill(store, eid, rows)
    for rid in ids.values():
        run_state.finish_run(store, rid, "done")
    return eid


TUNE = {1: [[1, 0, 1, 1, 0, 1] * 6], 2: [[2, 2, 1, 2, 0, 2, 2, 1] * 3]}  # 60 tokens each: both lossless


def test_plan_reruns_the_best_configuration_on_the_other_split(store):
    tune = _experiment(store, TUNE)
    plan = validation_plan(store, tune)
    assert plan["prompts"] == "code:validation" and plan["validates"] == tune
    assert plan["sweep_values"] == [2] and plan["k"] == 2 and plan["drafter"] == "model" and plan["draft"] == "drf"
    vid = enqueue_experiment(store, **plan, prompt_texts=["q0"])
    assert get_experiment(store, vid)["validates"] == tune
    with pytest.raises(ValidationError, match="itself a validation"):
        validation_plan(store, vid)
    with pytest.raises(ValidationError, match="the set the experiment was tuned on"):
        validation_plan(store, tune, prompts="code:tune")


def test_verdict_holds_then_flips_on_an_alpha_drop_and_on_a_slower_interval(store):
    tune = _experiment(store, TUNE)
    same = _experiment(store, {2: TUNE[2]}, prompts="code:validation", validates=tune)
    result = validation_result(store, same)
    assert result["holds"] is True and result["reason"].startswith("holds")
    # Held-out prompts on which the draft is right far less often: α 0.56 -> about 0.2.
    worse = _experiment(store, {2: [[0, 0, 1, 0, 2, 0, 0, 0] * 3]}, prompts="code:validation", validates=tune)
    result = validation_result(store, worse)
    assert result["holds"] is False and "beyond sampling error" in result["reason"]
    # Same acceptance, but every verify pass three times as slow: the speedup interval falls below the tune's.
    slower = _experiment(store, {2: TUNE[2]}, prompts="code:validation", validates=tune, verify=0.030)
    result = validation_result(store, slower)
    assert result["holds"] is False and "wholly below the tuning run's" in result["reason"]


def test_nothing_to_validate_is_one_clear_error(store):
    eid = enqueue_experiment(
        store, name="e", target="t", draft="d", prompts="code", sampling={}, sweep_values=[2], prompt_texts=["p"]
    )
    with pytest.raises(ValidationError, match="no finished best configuration"):
        validation_plan(store, eid)
    _ = run_ids


def test_draftlab_validate_reruns_the_best_on_held_out_prompts(tmp_path, model_dirs, capsys):
    import json

    from app.cli import main
    from storage import open_store
    from storage.records import queries as q

    db = f"sqlite:///{tmp_path / 'v.db'}"
    tune, held_out = tmp_path / "tune.txt", tmp_path / "held_out.txt"
    tune.write_text("t3 t4 t5\nt9 t10\nt20 t21 t22\n")
    held_out.write_text("t30 t31\nt7 t8 t9\n")
    common = [
        "--target",
        model_dirs["target"],
        "--draft",
        model_dirs["draft"],
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
        "--db",
        db,
        "--repeats",
        "1",
    ]
    assert main(["run", *common, "--prompts", str(tune), "--k", "1,2", "--json"]) == 0
    tune_id = json.loads(capsys.readouterr().out)["experiment_id"]
    assert main(["validate", str(tune_id), "--db", db]) == 2  # a file has no built-in held-out split
    assert "--prompts FILE" in capsys.readouterr().err
    assert main(["validate", str(tune_id), "--db", db, "--prompts", str(held_out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["validates"] == tune_id and doc["holds"] in (True, False) and doc["reason"]
    assert doc["configuration"]["k"] == doc["tune"]["k"] == doc["validation"]["k"]
    store = open_store(db)
    assert q.experiment(store, doc["experiment_id"])["validates"] == tune_id
    assert q.experiment(store, doc["experiment_id"])["prompts"] == str(held_out)


# --- what the verdict tested, in words; α with a prompt-level standard error -------------------------------------

HIGH, LOW = [2] * 12, [0] * 12  # k = 2: every draft accepted (24 of 24 verified) / the first rejected (0 of 12)


def test_alpha_has_a_prompt_level_standard_error(store):
    """Prompts alternate between a draft that is always right and one that is always wrong: tokens of one prompt
    are not independent draws, so the standard error is the spread between prompts, not √(α(1 − α)/N)."""
    import math

    import numpy as np

    from storage.analysis.validation import alpha_estimate

    eid = _experiment(store, {2: [HIGH, LOW]})
    rid = run_ids(store, eid)[("speculative", 2)]
    est = alpha_estimate(store, rid)
    a, n = np.array([24, 0] * 3, dtype=float), np.array([24, 12] * 3, dtype=float)
    alpha = a.sum() / n.sum()
    oracle = math.sqrt(len(a) / (len(a) - 1) * ((a - alpha * n) ** 2).sum()) / n.sum()  # the ratio's clustered SE
    assert (est.alpha, est.prompts, est.verified) == (pytest.approx(2 / 3), 6, 108)
    assert est.se == pytest.approx(oracle) and est.se > 2.5 * math.sqrt(alpha * (1 - alpha) / n.sum())
    same = _experiment(store, {2: [TUNE[2][0]]})  # every prompt alike: no spread between prompts
    assert alpha_estimate(store, run_ids(store, same)[("speculative", 2)]).se == pytest.approx(0, abs=1e-6)


def test_a_drop_within_prompt_level_sampling_error_is_said_so(store):
    """α 0.667 -> 0.500 over six prompts each: a token-level test calls it a drop (z ≈ 2.4), the prompt-level one
    does not (z ≈ 0.5), and the sentence says which test it ran."""
    from storage.analysis.validation import Z_ONE_SIDED

    tune = _experiment(store, {2: [HIGH, LOW]})
    held = _experiment(store, {2: [HIGH, LOW, LOW]}, prompts="code:validation", validates=tune)
    result = validation_result(store, held)
    alpha = result["alpha"]
    assert alpha["tune"] == pytest.approx(2 / 3) and alpha["validation"] == pytest.approx(0.5)
    assert 0 < alpha["z"] < Z_ONE_SIDED
    pooled = (72 + 48) / (108 + 96)
    token_z = (2 / 3 - 0.5) / (pooled * (1 - pooled) * (1 / 108 + 1 / 96)) ** 0.5
    assert token_z > 1.96  # what treating tokens as independent concluded
    assert (
        "α fell from 0.667 on code:tune to 0.500 on code:validation (-0.167), within sampling error (z = 0.5 ≤ "
        "1.64, one-sided test at 5 %, prompt-level standard errors)"
    ) in result["reason"]


def test_a_rise_is_reported_as_a_rise(store):
    tune = _experiment(store, {2: TUNE[2]})
    better = _experiment(store, {2: [[2, 2, 2, 2, 1, 2, 2, 2] * 3]}, prompts="code:validation", validates=tune)
    result = validation_result(store, better)
    assert result["holds"] is True
    assert "α rose from 0.800 on code:tune to 0.938 on code:validation (+0.137)" in result["reason"]
    assert "sampling error" not in result["reason"]  # the test looks for a drop; a rise is not "within" anything


def test_sets_are_named_by_their_names(store, tmp_path, monkeypatch):
    """A set named code:validation is never called "tune"; an uploaded file by its own name, not its cache path."""
    from engine.text.prompt_sets import set_name, upload_dir, upload_file_name

    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path / "uploads"))
    uploaded = str(upload_dir() / upload_file_name("my held-out.jsonl", b'{"prompt": "x"}\n'))
    assert set_name(uploaded) == "my_held-out.jsonl" and set_name("code") == "code:tune"
    assert set_name("code+english:validation") == "code:tune+english:validation"
    assert set_name("/data/0123456789ab-mine.txt") == "0123456789ab-mine.txt"  # a hash-like name outside uploads
    tune = _experiment(store, {2: TUNE[2]}, prompts="code:validation")
    plan = validation_plan(store, tune, prompts=uploaded)
    assert plan["name"] == "validate #1: k=2 model drf on my_held-out.jsonl" or plan["name"].endswith(
        "on my_held-out.jsonl"
    )
    held = _experiment(store, {2: TUNE[2]}, prompts=uploaded, validates=tune)
    reason = validation_result(store, held)["reason"]
    assert "on code:validation" in reason and "on my_held-out.jsonl" in reason
    assert " tune" not in reason.replace("tuning run", "") and str(tmp_path) not in reason


def test_a_done_validation_experiment_has_its_finding(store):
    from storage.analysis.findings import findings

    tune = _experiment(store, TUNE)
    same = _experiment(store, {2: TUNE[2]}, prompts="code:validation", validates=tune)
    found = [f for f in findings(store, same) if f["kind"] == "validation"]
    assert len(found) == 1 and found[0]["severity"] == "info" and found[0]["data"]["holds"] is True
    assert not missing(found[0]["title"], f"experiment #{tune} ", "holds", "code:validation"), found[0]["title"]
    worse = _experiment(store, {2: [[0, 0, 1, 0, 2, 0, 0, 0] * 3]}, prompts="code:validation", validates=tune)
    found = next(f for f in findings(store, worse) if f["kind"] == "validation")
    assert found["severity"] == "warning" and "beyond sampling error" in found["detail"]
    assert found["prefill"]["sweep"] == "k" and found["prefill"]["prompts"] == "code:validation"
    assert not [f for f in findings(store, tune) if f["kind"] == "validation"]  # a tuning experiment: none
