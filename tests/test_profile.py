"""`draftlab profile` against the stand-in vLLM server (tests/fake_vllm.py, started exactly as vLLM is, whose
speculative step takes 1 + k / 2 target steps): each k's step cost stored per pass, the cost ratio the server was
built with measured back, every run of the experiment predicted from its own acceptance and those costs; which runs a
profile fits (the drafter's fingerprint: its shape, not its weights or its k); bad input and a dying server in one
line. (The real vLLM server: tests/test_profile_vllm.py.)"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from app.cli import main
from app.commands.profile import report
from engine.errors import DraftLabError
from engine.metrics.server_prediction import pooled_acceptance, tokens_per_step
from storage import open_store
from storage.records.prompt_positions import prompt_positions
from storage.records.server_costs import drafter_fingerprint, model_shape
from tests.fault_tools import FakeServers
from tests.meaning import missing

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])
STEP = 0.02  # seconds a target step of the stand-in takes; a speculative one (1 + k / 2) times as long


@pytest.fixture()
def lab(tmp_path, model_dirs, capsys, monkeypatch):
    """A tiny k 1,2 experiment on four prompts, the stand-in servers' pids and logs kept in tmp_path:
    (experiment id, {k: run id}, database URL)."""
    from tests.cli_runs import run_json

    servers = FakeServers(tmp_path / "pids")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(servers.folder))
    monkeypatch.setenv("FAKE_VLLM_STEP_SECONDS", str(STEP))
    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "1,2", "--repeats", "1", "--max-new-tokens", "16")
    yield doc["experiment_id"], {r["k"]: r["run_id"] for r in doc["runs"]}, db
    assert servers.alive() == [], "a server outlived the profile"


def _profile(db, eid, *options: str) -> list[str]:
    return ["profile", str(eid), "--vllm", FAKE, "--db", db, "--concurrency", "1", *options]


def test_a_profile_measures_each_k_and_predicts_every_run_from_its_acceptance(lab, capsys):
    eid, runs, db = lab
    assert main([*_profile(db, eid, "--ks", "1,2,3", "--repeats", "3", "--run", str(runs[2])), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    costs = {c["k"]: c for c in doc["costs"] if c["concurrency"] == 1}
    assert sorted(costs) == [0, 1, 2, 3]
    assert costs[0]["passes"] == 9 and all(costs[k]["passes"] == 3 for k in (1, 2, 3))  # k 0 beside every k
    for k in (1, 2, 3):  # the stand-in's own cost: t_k / t_0 = 1 + k / 2 (a busy machine adds a little to both)
        assert costs[k]["step_seconds"] / costs[0]["step_seconds"] == pytest.approx(1 + k / 2, rel=0.2)
        lo, hi = costs[k]["cost_ratio_ci"]
        assert lo <= costs[k]["cost_ratio"] <= hi and costs[k]["cost_ratio"] == pytest.approx(1 + k / 2, rel=0.2)
        assert 1 < costs[k]["tokens_per_step"] <= k + 1
    assert costs[0]["cost_ratio"] is None
    assert costs[0]["tokens_per_step"] == 1.0

    store = open_store(db)
    try:
        with store.read() as conn:
            row = conn.execute(
                text("SELECT configs, hardware, target, status, profile_run_id, profile_ks FROM server_confirms")
            ).one()
        assert row.configs == "profile" and row.status == "done" and row.target.endswith("target")
        assert row.profile_run_id == runs[2] and row.profile_ks == "1,2,3"  # as a queued profile names them
        assert row.hardware and ("CPU" in row.hardware or "×" in row.hardware)
        for k, run_id in runs.items():  # both runs fit (same target, same draft): each predicted from its own α
            predicted = doc["server_predicted"][str(run_id)]
            assert predicted["profile"]["profile_id"] == doc["profile_id"]
            assert predicted["profile"]["label"].startswith("predicted for vLLM ")
            assert f"profile {doc['profile_id']}" in predicted["profile"]["label"]
            _, reached, accepted = prompt_positions(store, run_id)
            expected_length = tokens_per_step(np.asarray(pooled_acceptance(reached, accepted))[None, :])[0]
            by_k = predicted["concurrency"]["1"]
            assert sorted(map(int, by_k)) == list(range(1, k + 1))  # up to the run's own positions
            for key, cell in by_k.items():
                kk = int(key)
                assert cell["tokens_per_step"] == pytest.approx(expected_length[kk - 1])
                ratio = costs[kk]["step_seconds"] / costs[0]["step_seconds"]
                assert cell["speedup"] == pytest.approx(expected_length[kk - 1] / ratio, rel=0.05)
                lo, hi = cell["speedup_ci"]
                assert lo <= cell["speedup"] <= hi
            assert predicted["schedule"]["1"] in (0, *range(1, k + 1))
    finally:
        store.dispose()
    lines = report(doc, 12.0).splitlines()
    assert lines[0].startswith(f"profile {doc['profile_id']} of experiment {eid}")
    cost_line = r"concurrency 1 k=2: step [\d.]+ ms over 3 passes, t_k/t_0 [\d.]+ \([\d.]+–[\d.]+\)"
    assert any(re.search(cost_line, x) for x in lines)
    assert any(re.search(rf"run {runs[2]} concurrency 1: k=1 [\d.]+× \([\d.]+–[\d.]+\), k=2", x) for x in lines)


def test_a_server_that_dies_mid_profile_is_one_line_and_the_other_ks_are_kept(lab, capsys, monkeypatch):
    eid, runs, db = lab
    monkeypatch.setenv("FAKE_VLLM_FAULT", "die:2:2")
    assert main(_profile(db, eid, "--ks", "1,2", "--repeats", "1")) == 1
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "k=2" in errors[0], errors
    store = open_store(db)
    try:
        with store.read() as conn:
            ks = conn.execute(text("SELECT DISTINCT k FROM server_measurements ORDER BY k")).scalars().all()
            status = conn.execute(text("SELECT status FROM server_confirms")).scalar()
        assert ks == [0, 1] and status == "failed"  # k 1 and its target-only passes kept, nothing of k 2
    finally:
        store.dispose()


@pytest.mark.parametrize(
    "options, words",
    [
        (["--ks", "0"], "--ks: "),
        (["--ks", "1,1"], "repeats a value"),
        (["--run", "999"], "run 999 is not a finished lossless speculative run"),
    ],
)
def test_bad_profile_input_is_one_line_before_any_server_starts(lab, capsys, options, words):
    eid, _, db = lab
    assert main(_profile(db, eid, *options)) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err


def test_a_profile_named_for_a_run_it_does_not_fit_is_refused_in_one_line(lab):
    from storage.serving.profiles import run_prediction

    eid, runs, db = lab
    store = open_store(db)
    try:
        with pytest.raises(DraftLabError, match=r"^profile 77 does not fit run \d+: .*`draftlab profile"):
            run_prediction(store, eid, runs[1], 77)
        unfit = run_prediction(store, eid, runs[1])
        assert unfit["profile"] is None and "no server cost profile fits" in unfit["reason"]
    finally:
        store.dispose()


def _model(tmp_path, name: str, **shape) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 97, **shape}))
    return str(folder)


def test_a_drafters_fingerprint_is_its_shape_and_settings_never_its_weights_or_k(tmp_path):
    one = _model(tmp_path, "one", hidden_size=64, num_hidden_layers=2)
    same_shape = _model(tmp_path, "distilled", hidden_size=64, num_hidden_layers=2)
    wider = _model(tmp_path, "wider", hidden_size=128, num_hidden_layers=2)
    spec = {"method": "draft_model", "num_speculative_tokens": 3}
    assert model_shape(one) == "model_type=llama hidden_size=64 num_hidden_layers=2 vocab_size=97"
    fingerprint = drafter_fingerprint({**spec, "model": one})
    assert drafter_fingerprint({**spec, "model": same_shape, "num_speculative_tokens": 1}) == fingerprint
    assert drafter_fingerprint(json.dumps({**spec, "model": one, "num_speculative_tokens_per_batch_size": {}})) == (
        fingerprint
    )
    assert drafter_fingerprint({**spec, "model": wider}) != fingerprint
    assert drafter_fingerprint({**spec, "model": one, "draft_sample_method": "probabilistic"}) != fingerprint
    ngram = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert drafter_fingerprint({**ngram, "num_speculative_tokens": 2}) == drafter_fingerprint(ngram)
    assert drafter_fingerprint({**ngram, "prompt_lookup_max": 5}) != drafter_fingerprint(ngram)
    assert model_shape("org/some-hub-draft") == "org/some-hub-draft"  # no folder: the id stands for itself


def test_deploy_takes_vllms_k_per_concurrency_from_the_server_where_a_profile_fits(lab, capsys, monkeypatch):
    from storage.serving.deploy import NoChosenRun, deploy_document

    monkeypatch.setenv("FAKE_VLLM_DRAFT_COST", "0.1")  # a cheap drafter: t_k / t_0 = 1 + k / 10, the lab's α gains
    eid, runs, db = lab
    store = open_store(db)
    try:
        before = deploy_document(store, eid, runs[2])  # a run named: its own settings, the lab's figures
        assert before["answer"]["from"] == "lab" and "server_predicted" not in before
        try:
            chosen = deploy_document(store, eid)
        except NoChosenRun:  # tiny models on a CPU: the lab's own loop is rarely faster than the target alone
            pass
        else:
            assert chosen["answer"]["from"] == "lab" and "no server cost profile fits" in chosen["answer"]["reason"]
    finally:
        store.dispose()
    assert main([*_profile(db, eid, "--ks", "1,2", "--repeats", "2"), "--concurrency", "1,2"]) == 0
    capsys.readouterr()
    store = open_store(db)
    try:
        after = deploy_document(store, eid, runs[2])
        assert after["engines"]["vllm"]["speculative_config"] == before["engines"]["vllm"]["speculative_config"]
        served = deploy_document(store, eid)
    finally:
        store.dispose()
    predicted = served["server_predicted"]
    assert served["chosen"] == "server" and served["run_id"] in runs.values()
    assert served["caveats"][0].startswith(f"Chosen from the server's side ({predicted['profile']['label']})")
    assert served["answer"] == {
        "from": "server",
        "label": predicted["profile"]["label"],
        "profile_id": predicted["profile"]["profile_id"],
    }
    spec = json.loads(served["engines"]["vllm"]["speculative_config"])
    schedule = {int(c): k for c, k in predicted["schedule"].items()}
    assert sorted(schedule) == [1, 2]
    note = next(n for n in served["engines"]["vllm"]["notes"] if predicted["profile"]["label"] in n)
    if any(schedule.values()):
        assert spec["num_speculative_tokens"] == max(schedule.values())
        assert ("num_speculative_tokens_per_batch_size" in spec) == (len(set(schedule.values())) > 1)
        assert "k per concurrency is the server's answer" in note
    else:  # no k's interval above 1: the lab's k stays, and the note says the server's answer is against it
        assert spec["num_speculative_tokens"] == served["configuration"]["k"]
        assert "serve the target alone" in note
    for c, k in schedule.items():
        assert (f"concurrency {c}: k={k} (" if k else f"concurrency {c}: off") in note


def test_a_concurrency_schedule_becomes_vllms_batch_size_ranges():
    from storage.serving.deploy import server_ranges

    assert server_ranges({1: 2, 4: 1, 16: 0}) == [[1, 3, 2], [4, 15, 1], [16, 16, 0]]
    assert server_ranges({2: 3, 8: 3, 32: 1}) == [[1, 31, 3], [32, 32, 1]]
    assert server_ranges({1: 2}) == [[1, 1, 2]]


def test_confirm_serves_the_servers_answer_as_its_schedule_or_its_one_k():
    from storage.db.errors import QueueError
    from storage.serving.confirm_jobs import _server_documents

    def document(spec: dict) -> dict:
        vllm = {"speculative_config": json.dumps(spec), "notes": []}
        answer = {"from": "server", "label": "predicted for vLLM 0.32 on CPU, profile 4", "profile_id": 4}
        return {"experiment_id": 3, "run_id": 7, "answer": answer, "engines": {"vllm": vllm}}

    scheduled = {"method": "draft_model", "num_speculative_tokens": 3}
    scheduled["num_speculative_tokens_per_batch_size"] = [[1, 3, 0], [4, 15, 3], [16, 16, 1]]
    ((label, doc),) = _server_documents(document(scheduled), "schedule")
    assert label == "schedule" and json.loads(doc["engines"]["vllm"]["speculative_config"]) == scheduled
    ((label, doc),) = _server_documents(document(scheduled), "chosen")  # one k: the first concurrency that drafts
    assert json.loads(doc["engines"]["vllm"]["speculative_config"]) == {
        "method": "draft_model",
        "num_speculative_tokens": 3,
    }
    one_k = {"method": "draft_model", "num_speculative_tokens": 2}
    assert json.loads(_server_documents(document(one_k), "chosen")[0][1]["engines"]["vllm"]["speculative_config"]) == (
        one_k
    )
    with pytest.raises(QueueError) as refused:
        _server_documents(document(one_k), "schedule")
    assert not missing(str(refused.value), "one k", "(k=2)", "`chosen`", "profile 4")


def test_a_profile_beside_a_batch_size_grid_stores_every_k(tmp_path, model_dirs, capsys, monkeypatch):
    from tests.cli_runs import run_json

    servers = FakeServers(tmp_path / "pids")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(servers.folder))
    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "1,2", "--batch-size", "1,2", "--repeats", "1")
    eid = doc["experiment_id"]
    run = next(r for r in doc["runs"] if r["k"] == 1)
    # k 2 is served beside two lab runs at k 2 (batch 1 and 2), none of them the profiled run
    status = main([*_profile(db, eid, "--ks", "1,2", "--repeats", "1", "--run", str(run["run_id"])), "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    assert sorted({c["k"] for c in json.loads(out)["costs"]}) == [0, 1, 2]
    assert servers.alive() == []
