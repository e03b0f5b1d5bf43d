"""A confirm queued from the dashboard: checked when queued (the CLI's words, nothing stored when refused), claimed
and run by a worker against a stand-in vLLM server (tests/fake_vllm.py, started exactly as vLLM is), its progress
reported while it runs, stored as `draftlab confirm` stores it, and swept as interrupted when its worker dies."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from app.worker.sweep import sweep
from storage.db.errors import QueueError
from storage.serving.confirm_jobs import claim_confirm, confirm_jobs, enqueue_confirm, get_confirm, report_confirm
from tests.meaning import missing

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])


@pytest.fixture()
def lab(tmp_path, model_dirs, capsys):
    """A tiny k 1,2 experiment run through the CLI: (its JSON, its store)."""
    from storage import open_store
    from tests.cli_runs import run_json

    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "1,2", "--repeats", "1", "--max-new-tokens", "6")
    store = open_store(db)
    yield doc, store
    store.dispose()


def test_a_queued_confirm_is_run_by_a_worker_and_stored_with_its_progress(lab, monkeypatch):
    from app.worker.worker import Worker
    from storage.analysis.confirm_report import confirms

    doc, store = lab
    eid = doc["experiment_id"]
    monkeypatch.setenv("DRAFTLAB_VLLM", FAKE)
    monkeypatch.setenv("FAKE_VLLM_STEP_SECONDS", "0.002")  # steps that cost time: a speedup within tokens per step
    cid = enqueue_confirm(store, eid, configs="all", concurrency=[1, 2], repeats=2, launched_by="local 127.0.0.1")
    assert get_confirm(store, cid)["status"] == "queued"
    seen = []
    with Worker(store, heartbeat_seconds=0.2, poll_seconds=0.05, log=seen.append) as worker:
        worker.work(until_idle=True)
    assert worker.confirmed == [cid]
    job = get_confirm(store, cid)
    assert job["status"] == "done" and job["error"] is None, seen
    # 2 configurations × 2 concurrencies × 2 passes × 2 servers × 4 prompts
    assert job["requests_total"] == 64 and job["requests_done"] == 64
    (stored,) = confirms(store, eid)
    assert stored["engine_version"] == "fake-0.1"
    assert [c["k"] for c in stored["configs"]] == [1, 2]
    for config in stored["configs"]:
        assert [m["concurrency"] for m in config["per_concurrency"]] == [1, 2]
        for m in config["per_concurrency"]:
            assert m["outputs_match_server_baseline"] == 1.0  # the stand-in is lossless by construction
            assert m["speedup_ci"] is not None and m["server_draft_acceptance_rate"] > 0
    assert [b["concurrency"] for b in stored["baseline"]["per_concurrency"]] == [1, 2]
    listed = confirm_jobs(store, eid)
    assert list(listed["confirm_id"]) == [cid] and int(listed["measurements"].iloc[0]) == 6  # 4 + 2 target-only


def test_a_confirm_is_refused_when_queued_with_the_reason_and_nothing_stored(lab):
    doc, store = lab
    eid = doc["experiment_id"]
    cases = [
        # tiny random models: speculation measurably slower, so the verdict serves the target alone (deploy's words)
        (dict(configs="chosen", concurrency=[1]), "serve the target alone, there is nothing to deploy"),
        (dict(configs="schedule", concurrency=[1]), "nothing to deploy"),
        (dict(configs="every", concurrency=[1]), "is not one of chosen, schedule, all"),
        (dict(configs="all", concurrency=[]), "no concurrency chosen"),
        (dict(configs="all", concurrency=[0]), "concurrency 0 is not a whole number from 1 to 4096"),
        (dict(configs="all", concurrency=[4, 4]), "repeats a value"),
        (dict(configs="all", concurrency=[1], repeats=0), "passes per server and concurrency 0"),
    ]
    for kwargs, words in cases:
        with pytest.raises(QueueError, match=words):
            enqueue_confirm(store, eid, **kwargs)
    with pytest.raises(QueueError, match="no experiment 999"):
        enqueue_confirm(store, 999, configs="all", concurrency=[1])
    assert confirm_jobs(store, eid).empty
    first = enqueue_confirm(store, eid, configs="all", concurrency=[1])
    with pytest.raises(QueueError, match=f"confirm {first} of experiment {eid} is queued"):
        enqueue_confirm(store, eid, configs="all", concurrency=[1])


def test_a_confirm_counts_against_the_launchers_cap(lab, monkeypatch):
    doc, store = lab
    monkeypatch.setenv("DRAFTLAB_LIMIT_QUEUED_RUNS", "2")
    from storage.jobs.experiments import enqueue_experiment

    enqueue_experiment(
        store, name="other", target="t", draft="d", prompts="p", sampling={}, sweep_values=(3,), launched_by="alice"
    )  # a baseline and a run: alice is at her cap already
    with pytest.raises(QueueError) as err:
        enqueue_confirm(store, doc["experiment_id"], configs="all", concurrency=[1], launched_by="alice")
    assert not missing(str(err.value), "alice", "has 2", "adds 1", "limit of 2"), err.value  # who, queued, new, cap
    cid = enqueue_confirm(store, doc["experiment_id"], configs="all", concurrency=[1], launched_by="bob")
    with pytest.raises(QueueError) as err:
        enqueue_experiment(
            store, name="more", target="t", draft="d", prompts="p", sampling={}, sweep_values=(3,), launched_by="bob"
        )
    assert not missing(str(err.value), "bob", "has 1", "adds 2"), err.value
    assert get_confirm(store, cid)["launched_by"] == "bob"


def test_a_confirm_whose_worker_died_is_swept_as_interrupted_and_progress_is_fenced(lab):
    from storage.jobs import liveness

    doc, store = lab
    cid = enqueue_confirm(store, doc["experiment_id"], configs="all", concurrency=[1])
    liveness.register_worker(store, "ghost", liveness.host_identity(), 999_999_999)  # a pid that does not exist
    assert claim_confirm(store, cid, "ghost") and not claim_confirm(store, cid, "other")
    assert report_confirm(store, cid, "ghost", phase="passes", requests_done=3)
    assert not report_confirm(store, cid, "someone else", requests_done=9)
    sweep(store, stale_seconds=3600)
    job = get_confirm(store, cid)
    assert job["status"] == "interrupted" and "its worker stopped" in job["error"] and job["requests_done"] == 3
    assert not report_confirm(store, cid, "ghost", requests_done=4)  # swept: no longer the ghost's


def test_the_queue_and_the_reads_beside_the_lab_on_sqlite_and_postgresql(store):
    """The same SQL on both databases: queue, claim, fenced progress, the listing's GROUP BY, the stale sweep's
    timestamps, and the join of a measurement with the lab's run at its batch size."""
    import json

    from sqlalchemy import text

    from app.serving.completions_load import PassRecord, RequestRecord
    from storage.jobs import liveness, run_state
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q
    from storage.records.confirms import add_measurement, beside_lab, finish_confirm, summarize

    eid = enqueue_experiment(
        store, name="pg", target="t", draft="d", prompts="p", sampling={}, sweep_values=(2,), prompt_texts=["a", "b"]
    )
    runs = q.runs(store, eid)
    for rid in runs["run_id"]:
        run_state.finish_run(store, int(rid), "done")
    spec = int(runs.loc[runs["kind"] == "speculative", "run_id"].iloc[0])
    with store.write() as conn:
        conn.execute(
            text("UPDATE runs SET speedup = 1.3, speedup_ci_lo = 1.2, speedup_ci_hi = 1.4 WHERE id = :r"), {"r": spec}
        )
    cid = enqueue_confirm(store, eid, configs="all", concurrency=[4, 1], repeats=2)
    assert get_confirm(store, cid)["concurrency"] == "1,4"
    liveness.register_worker(store, "w", liveness.host_identity(), 999_999_999)
    assert claim_confirm(store, cid, "w") and report_confirm(
        store, cid, "w", phase="passes", requests_done=2, requests_total=8
    )
    passes = [PassRecord(1, 1.0, [RequestRecord(0, 0.0, [0.5, 1.0], [1, 2], [1, 2, 3])])] * 2
    for c in (1, 4):
        add_measurement(
            store,
            cid,
            eid,
            label="chosen",
            k=2,
            run_id=spec,
            concurrency=c,
            passes=passes,
            speculative_config=json.dumps({"method": "draft_model", "num_speculative_tokens": 2}),
            figures=summarize(passes),
            speedup=(1.5, [1.4, 1.6]),
        )
    listed = confirm_jobs(store, eid)
    assert int(listed["measurements"].iloc[0]) == 2 and int(listed["requests_done"].iloc[0]) == 2
    beside = beside_lab(store, cid).set_index("concurrency")
    assert beside.loc[1, "lab_run_id"] == spec and beside.loc[1, "lab_speedup"] == 1.3
    assert beside.loc[4, "lab_speedup"] != beside.loc[4, "lab_speedup"]  # the lab never ran batch 4: NaN
    sweep(store, stale_seconds=3600)  # the worker's process is gone
    assert get_confirm(store, cid)["status"] == "interrupted"
    assert not finish_confirm(store, cid, engine_version="x", wall_seconds=1.0, errors=[], worker_id="w")


def _experiment_with_a_run(store) -> int:
    """An experiment with its prompts and a finished speculative run (enough to queue a confirm of it)."""
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q

    eid = enqueue_experiment(
        store, name="lease", target="t", draft="d", prompts="p", sampling={}, sweep_values=(2,), prompt_texts=["a", "b"]
    )
    for rid in q.runs(store, eid)["run_id"]:
        run_state.finish_run(store, int(rid), "done")
    return eid


def _age(store, cid: int, seconds: float, **columns) -> None:
    """Move a confirm's heartbeat (and created) `seconds` into the past; set other columns as given."""
    from datetime import timedelta

    from sqlalchemy import text

    from storage.db.schema import utcnow

    old = utcnow() - timedelta(seconds=seconds)
    sets = "".join(f", {k} = :{k}" for k in columns)
    with store.write() as conn:
        conn.execute(
            text(f"UPDATE server_confirms SET heartbeat = :old, created = :old{sets} WHERE id = :c"),
            {"old": old, "c": cid, **columns},
        )


def test_a_live_workers_heartbeat_keeps_its_confirm_through_a_long_server_start(store):
    """A confirm writes no progress while vLLM starts (minutes on a CPU): its worker's heartbeat keeps it, so no
    other sweep takes it for stale while the worker lives."""
    import os

    from storage.jobs import liveness

    cid = enqueue_confirm(store, _experiment_with_a_run(store), configs="all", concurrency=[1])
    liveness.register_worker(store, "alive", liveness.host_identity(), os.getpid())
    assert claim_confirm(store, cid, "alive")
    _age(store, cid, 120)
    liveness.heartbeat(store, "alive", None)
    sweep(store, stale_seconds=60)
    assert get_confirm(store, cid)["status"] == "running"


def test_a_cli_confirm_whose_process_is_gone_is_swept_as_interrupted(store):
    """`draftlab confirm`'s own confirm holds a lease too: its process on this host, its heartbeat. Swept when the
    process is gone (at once on this host), when its heartbeat is older than the stale window (another host), and
    a row from before heartbeats once it is that old; never while its process runs and beats."""
    import json

    from storage.jobs import liveness
    from storage.records.confirms import start_confirm
    from storage.serving.confirm_jobs import record_servers

    eid = _experiment_with_a_run(store)

    def confirm(**columns) -> int:
        cid = start_confirm(store, eid, configs="all", concurrency=[1], repeats=1)
        if columns:
            _age(store, cid, columns.pop("age", 0), **columns)
        return cid

    here = json.loads(liveness.confirm_processes())
    running = confirm()
    record_servers(store, running, [[999_999_998, None]])  # a server long gone: nothing to end
    dead_here = confirm(processes=json.dumps({**here, "pid": 999_999_999}))
    elsewhere_fresh = confirm(processes=json.dumps({**here, "host": "elsewhere"}))
    elsewhere_stale = confirm(age=120, processes=json.dumps({**here, "host": "elsewhere"}))
    before_heartbeats = confirm(age=120, processes=None)
    sweep(store, stale_seconds=60)
    status = {
        cid: get_confirm(store, cid)
        for cid in (running, dead_here, elsewhere_fresh, elsewhere_stale, before_heartbeats)
    }
    assert [status[c]["status"] for c in (running, elsewhere_fresh)] == ["running", "running"]
    assert json.loads(status[running]["processes"])["servers"] == [[999_999_998, None]]
    for cid in (dead_here, elsewhere_stale, before_heartbeats):
        assert status[cid]["status"] == "interrupted", cid
        assert "`draftlab confirm` process stopped" in status[cid]["error"]
        assert "were ended" not in status[cid]["error"]
