"""A server cost profile queued from the dashboard ("Server cost profile" on the experiment detail page): checked when
queued (one line each, nothing stored when refused), claimed and run by a worker against the stand-in vLLM server
(tests/fake_vllm.py, started exactly as vLLM is) through `draftlab profile`'s configurations, stored with its run and
ks on the row, and read back as a cost table on SQLite and PostgreSQL. (The panel in Chromium:
tests/test_browser_profile.py.)"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from storage.db.errors import QueueError
from storage.serving.confirm_jobs import PROFILE, confirm_jobs, enqueue_confirm, get_confirm, profile_ks, profile_runs
from tests.fault_tools import FakeServers
from tests.meaning import missing

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])


@pytest.fixture()
def lab(tmp_path, model_dirs, capsys, monkeypatch):
    """A tiny k 1,2 experiment run through the CLI, the stand-in servers' pids kept in tmp_path:
    (experiment id, {k: run id}, its store)."""
    from storage import open_store
    from tests.cli_runs import run_json

    servers = FakeServers(tmp_path / "pids")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(servers.folder))
    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "1,2", "--repeats", "1", "--max-new-tokens", "8")
    store = open_store(db)
    yield doc["experiment_id"], {r["k"]: r["run_id"] for r in doc["runs"]}, store
    store.dispose()
    assert servers.alive() == [], "a server outlived the profile"


def test_a_queued_profile_is_run_by_a_worker_as_draftlab_profile_runs_it(lab, monkeypatch):
    from app.serving.profile import profile_configs
    from app.worker.worker import Worker
    from storage.records.server_costs import drafter_fingerprint, profile_drafters
    from storage.serving.profiles import profile_table, run_prediction

    eid, runs, store = lab
    monkeypatch.setenv("DRAFTLAB_VLLM", FAKE)
    monkeypatch.setenv("FAKE_VLLM_STEP_SECONDS", "0.004")  # steps that cost time: a step cost to measure
    pid = enqueue_confirm(
        store, eid, configs=PROFILE, run_id=runs[2], ks="3, 1,2", concurrency=[1, 2], repeats=2, launched_by="bob"
    )
    queued = get_confirm(store, pid)
    assert (queued["status"], queued["configs"], queued["profile_run_id"], queued["profile_ks"]) == (
        "queued",
        "profile",
        runs[2],
        "1,2,3",
    )
    seen: list[str] = []
    with Worker(store, heartbeat_seconds=0.2, poll_seconds=0.05, log=seen.append) as worker:
        worker.work(until_idle=True)
    assert worker.confirmed == [pid]
    job = get_confirm(store, pid)
    assert job["status"] == "done" and job["error"] is None, seen
    # 3 ks × 2 concurrencies × 2 passes × 2 servers × 4 prompts
    assert job["requests_total"] == 96 and job["requests_done"] == 96
    assert job["engine_version"] == "fake-0.1" and job["hardware"] and job["target"]
    with store.read() as conn:
        served = conn.execute(
            text("SELECT DISTINCT speculative_config FROM server_measurements WHERE confirm_id = :c AND k > 0"),
            {"c": pid},
        ).scalars()
        served_configs = sorted(served, key=lambda s: json.loads(s)["num_speculative_tokens"])
    cli = profile_configs(store, eid, runs[2], [1, 2, 3])  # what `draftlab profile --run R --ks 1,2,3` serves
    assert served_configs == [c.speculative_config for c in cli]
    (fingerprint,) = profile_drafters(store, pid)
    assert fingerprint == drafter_fingerprint(cli[0].speculative_config)
    costs = {(c["concurrency"], c["k"]): c for c in profile_table(store, pid, fingerprint)}
    assert sorted(costs) == [(c, k) for c in (1, 2) for k in (0, 1, 2, 3)]
    for (c, k), row in costs.items():
        assert row["passes"] == (6 if k == 0 else 2), (c, k)  # the target alone beside every k
        if k == 0:
            assert row["cost_ratio"] is None and row["tokens_per_step"] == 1.0
        else:
            lo, hi = row["cost_ratio_ci"]
            assert lo <= row["cost_ratio"] <= hi and 1 < row["tokens_per_step"] <= k + 1, (c, k, row)
    listed = confirm_jobs(store, eid)
    assert list(listed["confirm_id"]) == [pid] and int(listed["measurements"].iloc[0]) == 8  # 6 + 2 target-only
    assert listed["profile_ks"].iloc[0] == "1,2,3" and int(listed["profile_run_id"].iloc[0]) == runs[2]
    for run_id in runs.values():  # every run of the experiment fits it (same target, same draft's shape)
        assert run_prediction(store, eid, run_id)["profile"]["profile_id"] == pid


def test_a_queued_profile_whose_run_is_gone_fails_in_one_line(lab, monkeypatch):
    from app.worker.worker import Worker

    eid, runs, store = lab
    monkeypatch.setenv("DRAFTLAB_VLLM", FAKE)
    pid = enqueue_confirm(store, eid, configs=PROFILE, run_id=runs[1], ks=[1], concurrency=[1], repeats=1)
    with store.write() as conn:  # the run is no longer lossless when the worker gets to it
        conn.execute(text("UPDATE runs SET status = 'failed' WHERE id = :r"), {"r": runs[1]})
    with Worker(store, heartbeat_seconds=0.2, poll_seconds=0.05, log=lambda _line: None) as worker:
        worker.work(until_idle=True)
    job = get_confirm(store, pid)
    assert job["status"] == "failed" and len(job["error"].splitlines()) == 1, job["error"]
    assert not missing(job["error"], f"run {runs[1]}", "--run"), job["error"]


def test_a_profile_is_refused_when_queued_in_one_line_and_nothing_stored(lab):
    eid, runs, store = lab
    cases = [
        (dict(ks="0"), ("ks", "'0'", "1 to 64")),
        (dict(ks="1,x"), ("'x'", "1 to 64", "1,2,3,4")),
        (dict(ks="²"), ("'²'",)),  # a digit to str.isdigit, not to int()
        (dict(ks="65"), ("'65'", "1 to 64")),
        (dict(ks="2,2"), ("repeats a value",)),
        (dict(ks=""), ("''",)),
        (dict(ks=[]), ("no k chosen",)),
        (dict(run_id=999), ("run 999", f"{runs[1]}, {runs[2]}")),  # names the runs it may serve
        (dict(run_id=runs[2], concurrency=[]), ("no concurrency chosen",)),
        (dict(run_id=runs[2], repeats=0), ("passes per server and concurrency 0",)),
    ]
    for kwargs, words in cases:
        with pytest.raises(QueueError) as err:
            enqueue_confirm(store, eid, configs=PROFILE, **{"concurrency": [1], **kwargs})
        message = str(err.value)
        assert "\n" not in message and not missing(message, *words), (kwargs, message)
    with pytest.raises(QueueError) as err:  # a confirm serves what the lab chose: no run or ks of its own
        enqueue_confirm(store, eid, configs="all", concurrency=[1], ks="1,2")
    assert not missing(str(err.value), "profile", "'all'"), err.value
    with pytest.raises(QueueError) as err:
        enqueue_confirm(store, 999, configs=PROFILE, concurrency=[1])
    assert not missing(str(err.value), "no experiment 999"), err.value
    assert confirm_jobs(store, eid).empty
    first = enqueue_confirm(store, eid, configs=PROFILE, concurrency=[1])  # the default run and ks
    assert get_confirm(store, first)["profile_run_id"] == profile_runs(store, eid)[0]
    assert get_confirm(store, first)["profile_ks"] == "1,2,3,4"
    with pytest.raises(QueueError) as err:  # one confirm or profile of an experiment at a time
        enqueue_confirm(store, eid, configs="all", concurrency=[1])
    assert not missing(str(err.value), f"confirm {first}", "queued"), err.value


def test_a_drafter_vllm_cannot_serve_is_refused_in_one_line(lab, monkeypatch):
    """vLLM cannot serve the drafter: the deploy mapping's note, in one line, before anything is queued."""
    eid, runs, store = lab

    def unservable(store, experiment_id, run_id=None):
        return {
            "run_id": run_id or runs[1],
            "configuration": {"target": "t"},
            "measured": {"max_new_tokens": 8},
            "engines": {"vllm": {"speculative_config": None, "notes": ["vLLM has no such drafter (a test's)"]}},
        }

    monkeypatch.setattr("storage.serving.deploy.deploy_document", unservable)
    with pytest.raises(QueueError) as err:
        enqueue_confirm(store, eid, configs=PROFILE, concurrency=[1])
    assert not missing(str(err.value), "vLLM cannot serve", "no such drafter"), err.value
    assert confirm_jobs(store, eid).empty


def test_profile_ks_are_whole_numbers_each_once_sorted():
    assert profile_ks("4, 1,2") == [1, 2, 4] and profile_ks([3]) == [3] and profile_ks((1, 64)) == [1, 64]
    for bad in ("1.5", "-1", "1,,2", [True], [0], [1.0]):
        with pytest.raises(QueueError):
            profile_ks(bad)


def test_queued_profiles_and_their_costs_on_sqlite_and_postgresql(store):
    """The same SQL on both databases: a profile queued with its run and ks, the listing's GROUP BY with them, the
    drafter fingerprints it stored and its cost table."""
    from app.serving.completions_load import PassRecord, RequestRecord
    from storage.jobs import liveness, run_state
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q
    from storage.records.confirms import add_measurement, describe_confirm, finish_confirm, summarize
    from storage.records.server_costs import drafter_fingerprint, profile_drafters
    from storage.serving.confirm_jobs import claim_confirm
    from storage.serving.profiles import profile_table

    eid = enqueue_experiment(
        store, name="pg", target="t", draft="d", prompts="p", sampling={}, sweep_values=(2,), prompt_texts=["a", "b"]
    )
    runs = q.runs(store, eid)
    for rid in runs["run_id"]:
        run_state.finish_run(store, int(rid), "done")
    spec = int(runs.loc[runs["kind"] == "speculative", "run_id"].iloc[0])
    assert profile_runs(store, eid) == [spec]
    pid = enqueue_confirm(store, eid, configs=PROFILE, run_id=spec, ks=[2, 1], concurrency=[4, 1], repeats=2)
    job = get_confirm(store, pid)
    assert (job["profile_run_id"], job["profile_ks"], job["concurrency"]) == (spec, "1,2", "1,4")
    liveness.register_worker(store, "w", liveness.host_identity(), 999_999_999)
    assert claim_confirm(store, pid, "w")
    describe_confirm(store, pid, hardware="1 × test CPU", target="t")

    def passes(step: float, per_step: int) -> list:
        """Two passes of one request: 8 steps after its first chunk, each `step` seconds, `per_step` tokens each."""
        return [
            PassRecord(
                1,
                1.0,
                [RequestRecord(0, 0.0, [step * j for j in range(9)], [1] + [per_step] * 8, [1] * (1 + 8 * per_step))],
                decode_steps=8,
            )
            for _ in range(2)
        ]

    config = {"method": "draft_model", "model": "d"}
    for c in (1, 4):
        for k in (0, 1, 2):
            made = passes(0.01 * (1 + k / 2) * (1 + c / 10), 1 + k if k else 1)
            add_measurement(
                store,
                pid,
                eid,
                label="target-only" if k == 0 else f"run {spec} at k={k}",
                k=k,
                run_id=None,
                speculative_config=json.dumps({**config, "num_speculative_tokens": k}) if k else None,
                concurrency=c,
                passes=made,
                figures=summarize(made),
            )
    assert finish_confirm(store, pid, engine_version="0.32.0", wall_seconds=3.0, errors=[], worker_id="w")
    listed = confirm_jobs(store, eid)
    assert listed["profile_ks"].tolist() == ["1,2"] and int(listed["profile_run_id"].iloc[0]) == spec
    assert int(listed["measurements"].iloc[0]) == 6
    (fingerprint,) = profile_drafters(store, pid)
    assert fingerprint == drafter_fingerprint(json.dumps({**config, "num_speculative_tokens": 1}))
    table = {(r["concurrency"], r["k"]): r for r in profile_table(store, pid, fingerprint)}
    assert sorted(table) == [(c, k) for c in (1, 4) for k in (0, 1, 2)]
    for (c, k), row in table.items():
        assert row["step_seconds"] == pytest.approx(0.01 * (1 + k / 2) * (1 + c / 10))
        assert row["tokens_per_step"] == pytest.approx(1 + k if k else 1)
        if k:
            assert row["cost_ratio"] == pytest.approx(1 + k / 2) and row["cost_ratio_ci"] == pytest.approx(
                [1 + k / 2] * 2
            )
    assert profile_drafters(store, 999) == []


def test_a_version_19_database_gains_the_profile_columns(tmp_path):
    """The v20 step adds the queued profile's run and ks to server_confirms (a database that had none)."""
    from storage import open_store

    url = f"sqlite:///{tmp_path / 'v19.db'}"
    store = open_store(url)
    with store.write() as conn:
        conn.execute(text("ALTER TABLE server_confirms DROP COLUMN profile_run_id"))
        conn.execute(text("ALTER TABLE server_confirms DROP COLUMN profile_ks"))
        conn.execute(text("UPDATE schema_info SET version = 19"))
    store.dispose()
    store = open_store(url)
    try:
        with store.read() as conn:
            columns = {row[1] for row in conn.execute(text("PRAGMA table_info(server_confirms)"))}
            version = conn.execute(text("SELECT version FROM schema_info")).scalar()
        assert {"profile_run_id", "profile_ks"} <= columns and version == 20
    finally:
        store.dispose()
