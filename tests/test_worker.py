"""The worker and the persisting CLI with tiny saved models: stored figures == engine metrics, one model load
per experiment, failures recorded while the queue goes on, cancel between rounds, SIGKILL then resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.worker.worker import Worker
from engine.metrics.metrics_oracle import outputs_match, speculative_metrics, target_step_seconds
from engine.models.loading import load_pair
from storage import open_store
from storage.analysis import catalog
from storage.db.errors import QueueError
from storage.db.settings import STALE_HELP, stale_window
from storage.jobs import liveness, run_state
from storage.jobs.experiments import enqueue_experiment
from storage.records import queries as q
from storage.serving.export import run_document
from tests.hold import held_env

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13", "t30 t31 t32 t33 t34"]


class RecordingWorker(Worker):
    """A worker that also keeps the engine's PromptResults, to hold the stored figures against them."""

    def __init__(self, *args, **kwargs):
        self.loads = []
        kwargs.setdefault("loader", lambda *a: (self.loads.append(a), load_pair(*a))[1])
        kwargs.setdefault("heartbeat_seconds", 0.5)
        kwargs.setdefault("log", lambda message: None)
        super().__init__(*args, **kwargs)
        self.results: dict[int, list] = {}
        self.repeats: dict[int, list] = {}

    def record(self, conn, run, result, repeats, slots, typer):
        self.results.setdefault(run["id"], []).append(result)
        self.repeats.setdefault(run["id"], []).append((repeats, slots))
        super().record(conn, run, result, repeats, slots, typer)


def enqueue(store, models, ks=(1, 3), prompts=PROMPTS, max_new_tokens=16, temperature=0.0, **kw):
    return enqueue_experiment(
        store,
        name=kw.pop("name", "tiny"),
        target=kw.pop("target", models["target"]),
        draft=kw.pop("draft", models["draft"]),
        prompts=kw.pop("prompts_spec", "inline"),
        sampling={"temperature": temperature, "max_new_tokens": max_new_tokens, "seed": 3},
        device="cpu",
        sweep_values=list(ks),
        prompt_texts=prompts,
        **kw,
    )


def kinds(store, experiment_id):
    return {
        (r.kind, None if r.kind == "baseline" else int(r.k)): int(r.run_id)
        for r in q.runs(store, experiment_id).itertuples()
    }


def test_worker_runs_an_experiment_and_stores_the_engine_figures(store, model_dirs):
    eid = enqueue(store, model_dirs, ks=(1, 3))
    worker = RecordingWorker(store)
    with worker:
        executed = worker.work(until_idle=True)
    ids = kinds(store, eid)
    assert executed[0] == ids[("baseline", None)]  # the baseline runs before the speculative runs
    assert len(worker.loads) == 1  # one model load for the whole experiment
    runs = q.runs(store, eid).set_index("run_id")
    assert (runs["status"] == "done").all() and (runs["progress"] == 1.0).all()
    assert (runs["peak_memory_mb"] > 0).all() and (runs["prompts_done"] == len(PROMPTS)).all()
    baseline = worker.results[ids[("baseline", None)]]
    assert runs.loc[ids[("baseline", None)], "target_step_seconds"] == pytest.approx(
        target_step_seconds(baseline), rel=1e-12
    )
    for k in (1, 3):
        rid = ids[("speculative", k)]
        expected = speculative_metrics(worker.results[rid], baseline)
        row = runs.loc[rid]
        for key in ("new_tokens", "rounds", "proposed", "accepted", "rejected"):
            assert row[key] == expected[key], key
        for key in (
            "tokens_per_second",
            "alpha",
            "draft_acceptance_rate",
            "tokens_per_round",
            "expected_alpha",
            "kl",
            "draft_step_seconds",
            "c",
            "speedup",
            "predicted_speedup",
        ):
            assert row[key] == pytest.approx(expected[key], rel=1e-12), key
        assert row.outputs_match_baseline is True and outputs_match(worker.results[rid], baseline)
        texts = q.prompt_output(store, rid, 0)["text"].tolist()
        assert " ".join(texts) == worker.results[rid][0].text
    assert catalog.experiments(store).set_index("experiment_id").loc[eid, "status"] == "done"


def test_failures_are_recorded_and_the_queue_goes_on(tmp_path, model_dirs, monkeypatch):
    store = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    bad_file = tmp_path / "broken.jsonl"
    bad_file.write_text('{"prompt": "t5 t6"}\n{not json}\n')
    missing = enqueue(store, model_dirs, ks=(2,), target=str(tmp_path / "no-such-model"), name="missing")
    mismatch = enqueue(store, model_dirs, ks=(2,), draft=model_dirs["alien"], name="mismatch")
    bad_prompts = enqueue(store, model_dirs, ks=(2,), prompts=None, prompts_spec=str(bad_file), name="bad prompts")
    oom = enqueue(store, model_dirs, ks=(1, 2), prompts=PROMPTS[:1], name="oom")
    good = enqueue(store, model_dirs, ks=(2,), prompts=PROMPTS[:2], name="good")

    import app.worker.timing as timing_module

    real_speculative_decoder = timing_module.speculative_decoder

    def speculative_decoder(pair, cfg, k, typer=None, drafter="model"):
        decoder = real_speculative_decoder(pair, cfg, k, typer, drafter=drafter)
        if k == 1:

            def out_of_memory(*args, **kwargs):
                raise __import__("torch").cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

            decoder.generate_batch = out_of_memory
        return decoder

    monkeypatch.setattr(timing_module, "speculative_decoder", speculative_decoder)
    with RecordingWorker(store) as worker:
        worker.work(until_idle=True)

    def statuses(eid):
        return {r.run_id: (r.status, r.error) for r in q.runs(store, eid).itertuples()}

    for eid, pattern in ((missing, "not found"), (mismatch, "tokenizers disagree"), (bad_prompts, "broken.jsonl")):
        for status, error in statuses(eid).values():  # every run of the experiment, not just the first
            assert status == "failed" and pattern in error, (status, error)
            assert "\n" not in error
    oom_runs = q.runs(store, oom).set_index("k", drop=False)
    assert oom_runs.loc[1, "status"] == "failed" and "CUDA out of memory" in oom_runs.loc[1, "error"]
    assert (oom_runs[oom_runs["k"] != 1]["status"] == "done").all()
    assert all(status == "done" for status, _ in statuses(good).values())
    detail = run_state.get_run(store, int(oom_runs.loc[1, "run_id"]))["error_detail"]
    assert "OutOfMemoryError" in detail


def test_cancel_stops_between_rounds_and_resume_finishes_without_duplicates(tmp_path, model_dirs):
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    eid = enqueue(store, model_dirs, ks=(2,))
    ids = kinds(store, eid)
    rid = ids[("speculative", 2)]

    def cancel_during_prompt_2(run, prompt_index, tokens, repeat):
        if run["id"] == rid and prompt_index == 2:
            run_state.cancel_run(store, rid)

    with RecordingWorker(store, progress_seconds=0.0, progress_hook=cancel_during_prompt_2) as worker:
        worker.work(until_idle=True)
    run = run_state.get_run(store, rid)
    assert run["status"] == "cancelled" and run["prompts_done"] == 2
    assert q.per_prompt(store, rid)["prompt_index"].tolist() == [0, 1]  # finished prompts kept, none half-written

    assert run_state.resume_run(store, rid)
    with RecordingWorker(store) as worker:
        worker.work(until_idle=True)
    assert run_state.get_run(store, rid)["status"] == "done"
    assert worker.results[rid][0].prompt_index == 2  # resumed at the first unfinished prompt
    with store.read() as conn:
        rounds = conn.execute(
            text("SELECT COUNT(*), COUNT(DISTINCT prompt_index * 100000 + round_index) FROM rounds WHERE run_id = :r"),
            {"r": rid},
        ).one()
    assert rounds[0] == rounds[1] == q.run_summary(store, rid)["rounds"].iloc[0]
    assert q.run_summary(store, rid)["outputs_match_baseline"].iloc[0] is True


def test_sigkill_mid_run_keeps_rows_and_resume_completes(db_url, model_dirs, wait_for):
    store = open_store(db_url)
    prompts = [f"t{i} t{i + 1} t{i + 2}" for i in range(3, 11)]
    eid = enqueue(store, model_dirs, ks=(2,), prompts=prompts, max_new_tokens=20)
    rid = kinds(store, eid)[("speculative", 2)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.worker.worker_process", "--db", db_url, "--until-idle", "--heartbeat", "0.2"],
        cwd=ROOT,
        env=held_env(2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:  # the worker holds before prompt 2 (tests/hold): the SIGKILL finds the run mid-way by construction
        wait_for(
            lambda: (run_state.get_run(store, rid) or {}).get("prompts_done", 0) >= 2 or proc.poll() is not None,
            timeout=120,
            what="the worker to commit two prompts of the speculative run",
        )
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    kept = q.per_prompt(store, rid)
    assert len(kept) >= 2 and run_state.get_run(store, rid)["status"] == "running"

    time.sleep(1.0)  # let its heartbeat go stale
    worker = RecordingWorker(store, stale_seconds=0.8)
    base = kinds(store, eid)[("baseline", None)]
    assert sorted(worker.start()) == [base, rid]  # the baseline is timed alongside, prompt by prompt
    try:
        run = run_state.get_run(store, rid)
        assert run["status"] == "interrupted"
        assert run_state.get_run(store, base)["prompts_done"] == run["prompts_done"]  # one transaction per prompt
        assert q.per_prompt(store, rid)["wall_seconds"].tolist()[: len(kept)] == kept["wall_seconds"].tolist()
        assert run_state.resume_experiment(store, eid) == 2
        worker.work(until_idle=True)
    finally:
        worker.stop()
    assert worker.results[rid][0].prompt_index == len(kept)  # resumed at the first unfinished prompt
    final = q.per_prompt(store, rid)
    assert final["prompt_index"].tolist() == list(range(len(prompts)))
    assert final["wall_seconds"].tolist()[: len(kept)] == kept["wall_seconds"].tolist()  # committed rows untouched
    summary = q.run_summary(store, rid).iloc[0]
    assert summary.status == "done" and summary.outputs_match_baseline is True
    with store.read() as conn:
        total, distinct = conn.execute(
            text(
                "SELECT COUNT(*), COUNT(DISTINCT CAST(prompt_index AS VARCHAR(10)) || ':' "
                "|| CAST(round_index AS VARCHAR(10)) "
                "|| ':' || CAST(position AS VARCHAR(10))) FROM draft_tokens WHERE run_id = :r"
            ),
            {"r": rid},
        ).one()
    assert total == distinct == summary.proposed
    store.dispose()


def test_cli_run_persists_and_its_json_is_the_stored_figures(tmp_path, model_dirs, capsys):
    from app.cli import main

    db = f"sqlite:///{tmp_path / 'cli.db'}"
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS[:2]) + "\n")
    argv = [
        "run",
        "--target",
        model_dirs["target"],
        "--draft",
        model_dirs["draft"],
        "--prompts",
        str(prompt_file),
        "--k",
        "1,2",
        "--max-new-tokens",
        "12",
        "--device",
        "cpu",
        "--db",
        db,
        "--json",
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    store = open_store(db)
    eid = doc["experiment_id"]
    assert doc == json.loads(json.dumps(run_document(store, eid)))
    runs = q.runs(store, eid).set_index("run_id")
    assert doc["baseline"]["tokens_per_second"] == runs.loc[doc["baseline"]["run_id"], "tokens_per_second"]
    assert len(doc["baseline"]["outputs"]) == 2
    for entry in doc["runs"]:
        row = runs.loc[entry["run_id"]]
        for key in ("rounds", "accepted", "alpha", "tokens_per_round", "c", "speedup", "predicted_speedup"):
            assert entry[key] == row[key], key
        assert (
            entry["per_position_acceptance"] == q.acceptance_by_position(store, entry["run_id"])["conditional"].tolist()
        )
        assert entry["outputs_match_baseline"] is True
    assert [e["k"] for e in doc["runs"]] == [1, 2]

    assert main(["list", "--db", db]) == 0
    listing = capsys.readouterr().out
    assert f"experiment {eid}" in listing and "k=2" in listing
    assert main(["export", str(eid), "--format", "csv", "--out", str(tmp_path / "out"), "--db", db]) == 0
    runs_csv, tokens_csv, timings_csv = capsys.readouterr().out.split()
    assert sum(1 for _ in open(timings_csv)) - 1 == 3 * 2 * 3  # 3 runs x 2 prompts x 3 repeats (the default)
    assert Path(runs_csv).read_text().startswith("run_id,kind,k,")
    assert sum(1 for _ in open(tokens_csv)) - 1 == int(runs["proposed"].sum())
    assert main(["export", str(eid), "--format", "json", "--db", db]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert len(exported["runs"]) == 3 and len(exported["draft_tokens"]) == int(runs["proposed"].sum())

    # Bad input: exit 2, one error line, nothing stored.
    before = len(catalog.experiments(store))
    assert main([*argv[:2], str(tmp_path / "nope"), *argv[3:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert len(catalog.experiments(store)) == before


def test_sigterm_marks_the_run_interrupted_and_cli_resume_requeues_it(tmp_path, model_dirs, wait_for, capsys):
    from app.cli import main

    db = f"sqlite:///{tmp_path / 'term.db'}"
    store = open_store(db)
    prompts = [f"t{i} t{i + 1}" for i in range(3, 9)]
    eid = enqueue(store, model_dirs, ks=(2,), prompts=prompts, max_new_tokens=20)
    rid = kinds(store, eid)[("speculative", 2)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--db", db],
        cwd=ROOT,
        env=held_env(1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # the worker holds before prompt 1 (tests/hold): the SIGTERM finds the run mid-way by construction
        wait_for(
            lambda: (run_state.get_run(store, rid) or {}).get("prompts_done", 0) >= 1 or proc.poll() is not None,
            timeout=120,
            what="the worker to commit a prompt",
        )
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    run = run_state.get_run(store, rid)
    assert run["status"] == "interrupted" and run["prompts_done"] >= 1  # at once, no stale heartbeat needed
    assert liveness.live_workers(store) == 0
    assert main(["resume", str(eid), "--db", db]) == 0
    assert "requeued 2 run" in capsys.readouterr().out  # the baseline was timed alongside it
    with RecordingWorker(store) as worker:
        worker.work(until_idle=True)
    assert q.run_summary(store, rid)["status"].iloc[0] == "done"
    assert q.per_prompt(store, rid)["prompt_index"].tolist() == list(range(len(prompts)))


# --- a dead owner is noticed at once (issue 9) -----------------------------------------------------------------


def _cli_run(db, model_dirs, prompt_file, *extra):
    """`draftlab run` held before its prompt 1 (tests/hold): a signal after prompt 0 finds it mid-way."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "run",
            "--target",
            model_dirs["target"],
            "--draft",
            model_dirs["draft"],
            "--prompts",
            str(prompt_file),
            "--k",
            "1,2",
            "--max-new-tokens",
            "24",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--db",
            db,
            *extra,
        ],
        cwd=ROOT,
        env=held_env(1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _first_prompt_committed(store, proc):
    def check():
        if proc.poll() is not None:
            return True
        with store.read() as conn:
            return conn.execute(text("SELECT COUNT(*) FROM prompt_results")).scalar() >= 3

    return check


def test_sigkill_of_draftlab_run_then_one_resume_and_a_worker_finish_it(db_url, model_dirs, wait_for, tmp_path, capsys):
    from app.cli import main

    store = open_store(db_url)
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(f"t{i} t{i + 1} t{i + 2}" for i in range(3, 13)) + "\n")
    proc = _cli_run(db_url, model_dirs, prompt_file)
    try:
        wait_for(_first_prompt_committed(store, proc), timeout=120, what="`draftlab run` to commit a prompt")
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    eid = int(catalog.experiments(store)["experiment_id"].iloc[0])
    kept = {rid: q.per_prompt(store, rid)["wall_seconds"].tolist() for rid in kinds(store, eid).values()}
    # No 60 s wait: the owner's process is gone on this host, so `list` and `resume` see it at once.
    assert main(["list", "--db", db_url]) == 0
    listing = capsys.readouterr().out
    statuses = [line.split()[3] for line in listing.splitlines() if line.lstrip().startswith("run ")]
    assert statuses == ["interrupted"] * 3, listing
    assert main(["resume", str(eid), "--db", db_url]) == 0
    assert "requeued 3 runs" in capsys.readouterr().out  # every run of the experiment, in one step
    assert main(["worker", "--until-idle", "--db", db_url]) == 0
    capsys.readouterr()
    runs = q.runs(store, eid)
    assert (runs["status"] == "done").all(), runs[["run_id", "status", "error"]]
    for rid, walls in kept.items():
        final = q.per_prompt(store, rid)
        assert final["prompt_index"].tolist() == list(range(10))
        assert final["wall_seconds"].tolist()[: len(walls)] == walls  # committed rows untouched
    with store.read() as conn:
        for table, key in (
            ("rounds", "run_id, prompt_index, round_index"),
            ("timings", "run_id, prompt_index, repeat"),
            ("prompt_results", "run_id, prompt_index"),
        ):
            dup = conn.execute(
                text(f"SELECT COUNT(*) FROM (SELECT {key} FROM {table} GROUP BY {key} HAVING COUNT(*) > 1) d")
            ).scalar()
            assert dup == 0, table
        assert conn.execute(text("SELECT COUNT(*) FROM timings")).scalar() == 3 * 10
    store.dispose()


def test_sigterm_to_draftlab_run_interrupts_like_ctrl_c(db_url, model_dirs, wait_for, tmp_path):
    if db_url.startswith("postgresql"):  # a password (trust auth ignores it) that must never be printed
        db_url = db_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret-pw@")
    store = open_store(db_url)
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(f"t{i} t{i + 1}" for i in range(3, 13)) + "\n")
    proc = _cli_run(db_url, model_dirs, prompt_file)
    try:
        wait_for(_first_prompt_committed(store, proc), timeout=120, what="`draftlab run` to commit a prompt")
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err and "s3cret-pw" not in err, err[-2000:]
    errors = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "draftlab resume" in errors[0] and store.safe_url in errors[0], errors
    with store.read() as conn:
        statuses = conn.execute(text("SELECT status FROM runs")).scalars().all()
        workers = conn.execute(text("SELECT COUNT(*) FROM workers")).scalar()
    assert statuses == ["interrupted"] * 3 and workers == 0  # at once: no heartbeat has to go stale
    store.dispose()


def test_mark_stale_sweeps_a_dead_process_on_this_host_at_once(store):
    eid = enqueue(store, {"target": "t", "draft": "d"}, ks=(1,))
    ids = kinds(store, eid)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = liveness.host_identity()  # this host name (and PID namespace)
    liveness.register_worker(store, "dead-here", host, dead.pid)
    liveness.register_worker(store, "dead-elsewhere", "some-other-host", dead.pid)
    liveness.register_worker(store, "alive-here", host, os.getpid())
    assert run_state.claim_group(store, eid, "dead-here")
    other_eid = enqueue(store, {"target": "t", "draft": "d"}, ks=(1,))
    other = kinds(store, other_eid)
    assert run_state.claim_group(store, other_eid, "dead-elsewhere")  # can't tell: heartbeat decides
    third = kinds(store, enqueue(store, {"target": "t", "draft": "d"}, ks=(1,), reserved_for="dead-here"))
    mine_eid = enqueue(store, {"target": "t", "draft": "d"}, ks=(1,))
    mine = kinds(store, mine_eid)
    assert run_state.claim_group(store, mine_eid, "alive-here")
    swept = liveness.mark_stale(store, stale_seconds=3600)
    assert sorted(swept) == sorted([*ids.values(), *third.values()])
    assert run_state.get_run(store, other[("baseline", None)])["status"] == "running"
    assert run_state.get_run(store, mine[("baseline", None)])["status"] == "running"
    assert "gone" in run_state.get_run(store, ids[("baseline", None)])["error"]
    with store.read() as conn:
        assert set(conn.execute(text("SELECT id FROM workers")).scalars()) == {"dead-elsewhere", "alive-here"}
    assert liveness.mark_stale(store, stale_seconds=3600) == []  # nothing left: no write at all


def test_the_stale_window_is_one_setting(monkeypatch, store, capsys):
    from app.cli import build_parser

    monkeypatch.setenv("DRAFTLAB_STALE_SECONDS", "7.5")
    assert stale_window() == 7.5
    assert Worker(store).stale_seconds == 7.5
    monkeypatch.setenv("DRAFTLAB_STALE_SECONDS", "soon")
    with pytest.raises(QueueError, match="DRAFTLAB_STALE_SECONDS"):
        stale_window()
    monkeypatch.delenv("DRAFTLAB_STALE_SECONDS")
    assert stale_window() == 60.0
    from app.commands import listing, resume
    from app.commands import worker as worker_command

    for command in (worker_command, listing, resume):  # one setting, described in the same words everywhere
        assert command.STALE_HELP is STALE_HELP, command.NAME
    for command in ("worker", "resume", "list"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"] if command != "resume" else [command, "1", "--help"])
        assert "DRAFTLAB_STALE_SECONDS" in capsys.readouterr().out.replace("\n", " "), command
