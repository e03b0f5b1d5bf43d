"""The run JSON's and the export's `server_predicted` (storage/serving/run_predictions.py), on SQLite and PostgreSQL:
every speculative run carries exactly what storage/serving/profiles.run_prediction gives it (the newest profile that
fits, or one line saying why none does and which command measures one), with the profile's costs
(tests/profile_data.py: t_k / t_0 = 1 + 0.3 k at concurrency 1) and the run's own acceptance in each figure; the
keys the run JSON had before are unchanged; the deploy settings are read once per distinct configuration, not once
per run; the profiles' version stamp moves when a profile ends."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.metrics.server_prediction import pooled_acceptance, tokens_per_step
from storage.records import queries as q
from storage.records.profile_version import profiles_version
from storage.records.prompt_positions import prompt_positions
from storage.serving import profiles
from storage.serving.export import SPECULATIVE_KEYS, export_json, run_document
from storage.serving.profiles import run_prediction
from storage.serving.run_predictions import experiment_predictions
from tests.meaning import missing
from tests.profile_data import filled_sweep, ratio, store_profile
from tests.test_storage import fill_experiment

# The run JSON's keys of a speculative run before server_predicted (storage/serving/export.run_document).
KEYS_BEFORE = [
    "run_id",
    "k",
    "status",
    "error",
    *SPECULATIVE_KEYS,
    "outputs_match_baseline",
    "sweep_variable",
    "sweep_value",
    "draft",
    "drafter",
    "baseline_run_id",
]


def _speculative(doc: dict) -> dict[int, dict]:
    return {r["run_id"]: r for r in doc["runs"]}


def test_every_run_carries_its_prediction_or_why_none(store):
    eid, ids, _ = fill_experiment(store, ks=(1, 2, 3), prompts=3)
    doc = run_document(store, eid, with_outputs=False)
    assert len(doc["runs"]) == 3
    for rid, entry in _speculative(doc).items():
        assert list(entry)[: len(KEYS_BEFORE)] == KEYS_BEFORE  # the keys before, in their order
        predicted = entry["server_predicted"]
        assert predicted["profile"] is None
        assert not missing(predicted["reason"], f"run {rid}", f"draftlab profile {eid} --run {rid}"), predicted
    exported = export_json(store, eid)
    assert exported["server_predicted"] == {str(rid): r["server_predicted"] for rid, r in _speculative(doc).items()}

    profile = store_profile(store, eid, ids[("speculative", 3)])
    doc = run_document(store, eid, with_outputs=False)
    json.dumps(doc, allow_nan=False)  # strict JSON
    for rid, entry in _speculative(doc).items():
        predicted = entry["server_predicted"]
        assert predicted == json.loads(json.dumps(run_prediction(store, eid, rid)))  # the same, seeded
        assert predicted["profile"]["profile_id"] == profile
        assert not missing(predicted["profile"]["label"], "vLLM 0.32.0", "test CPU", f"profile {profile}")
        _, reached, accepted = prompt_positions(store, rid)
        length = tokens_per_step(np.asarray(pooled_acceptance(reached, accepted))[None, :])[0]
        assert sorted(predicted["concurrency"]) == ["1", "4"]
        for c, by_k in predicted["concurrency"].items():
            assert sorted(map(int, by_k)) == list(range(1, entry["k"] + 1))  # up to the run's own positions
            for k, cell in by_k.items():
                cost = 1 + ratio(int(c)) * int(k)
                assert cell["step_seconds_ratio"] == pytest.approx(cost, rel=1e-6)
                assert cell["tokens_per_step"] == pytest.approx(length[int(k) - 1])
                assert cell["speedup"] == pytest.approx(length[int(k) - 1] / cost, rel=1e-6)
                lo, hi = cell["speedup_ci"]
                assert lo <= cell["speedup"] <= hi
                assert cell["interpolated"] is False
            served = predicted["schedule"][c]
            gains = [int(k) for k, cell in by_k.items() if cell["speedup_ci"][0] > 1]
            assert (served == 0) == (not gains), predicted["schedule"]
    exported = export_json(store, eid)
    json.dumps(exported, allow_nan=False)
    assert exported["server_predicted"] == {str(rid): r["server_predicted"] for rid, r in _speculative(doc).items()}


def test_the_fit_is_read_once_per_configuration_and_a_refused_run_says_why(store, monkeypatch):
    eid, ids, _ = fill_experiment(store, ks=(1, 2, 4), prompts=3, same_outputs_for=4)  # k 1 and 2 are not lossless
    store_profile(store, eid, ids[("speculative", 4)], ks=(1, 2))
    expected = {rid: run_prediction(store, eid, rid) for rid in ids.values() if rid != ids[("baseline", None)]}
    calls = []
    real = profiles.run_fit
    monkeypatch.setattr(profiles, "run_fit", lambda *a: calls.append(a[2]) or real(*a))
    got = experiment_predictions(store, eid)
    assert got == expected
    assert calls == [ids[("speculative", 4)]]  # the one lossless run; the others refused before any deploy settings
    for k in (1, 2):
        reason = got[ids[("speculative", k)]]["reason"]
        assert not missing(reason, f"run {ids[('speculative', k)]}", "not lossless"), reason
    fitted = got[ids[("speculative", 4)]]
    assert sorted(map(int, fitted["concurrency"]["1"])) == [1, 2]  # the profile's ks, not the run's 4 positions


@pytest.mark.parametrize("servable", [True, False])
def test_a_k_sweep_reads_its_fit_once_and_each_run_is_named_in_its_own_reason(store, monkeypatch, servable):
    eid, ids = filled_sweep(store, (1, 2, 3), drafter="prompt-lookup:3")
    speculative = [rid for (kind, _), rid in ids.items() if kind == "speculative"]
    if not servable:  # as run_fit says it of a drafter vLLM has no mapping for
        monkeypatch.setattr(profiles, "run_fit", lambda s, e, r: f"vLLM cannot serve run {r}'s drafter (none here)")
    expected = {rid: run_prediction(store, eid, rid) for rid in speculative}
    calls = []
    fit = profiles.run_fit
    monkeypatch.setattr(profiles, "run_fit", lambda *a: calls.append(a[2]) or fit(*a))
    got = experiment_predictions(store, eid)
    assert got == expected and len(calls) == 1
    for rid in speculative:
        assert got[rid]["profile"] is None and f"run {rid}" in got[rid]["reason"], got[rid]
        assert servable == ("no server cost profile fits" in got[rid]["reason"]), got[rid]
    runs = q.runs(store, eid)
    assert set(got) == set(runs.loc[runs["kind"] == "speculative", "run_id"].astype(int))


def test_the_profiles_version_moves_when_a_profile_ends(store):
    eid, ids, _ = fill_experiment(store, ks=(2,), prompts=3)
    before = profiles_version(store)
    assert before == (0, 0)
    from storage.records.confirms import start_confirm

    start_confirm(store, eid, configs="profile", concurrency=[1], repeats=2)  # running: nothing to predict from yet
    assert profiles_version(store) == before
    profile = store_profile(store, eid, ids[("speculative", 2)], ks=(1,))
    assert profiles_version(store) == (1, profile)
