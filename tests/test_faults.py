"""Nothing lost, nothing stuck (issue 9): the database stops accepting writes under a running worker.

A write that fails is retried with backoff (one log line per outage), the prompt's results held in memory
until the database takes them; past the retry bound the runs end `failed` with the reason once writes work
again. The soak drains 30 small runs while the database goes away three times, on SQLite (writes refused)
and on a PostgreSQL server of our own that is stopped and started; at the end nothing is stuck `running`,
nothing is duplicated and no committed row is gone.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from app.db_errors import DatabaseUnavailable
from app.worker.worker import Worker
from storage import open_store
from storage.jobs.experiments import enqueue_experiment, get_experiment
from tests.fault_tools import CommitWatcher, OwnPostgres, SqliteWriteFault, audit

PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13", "t30 t31 t32", "t8 t9", "t14 t15 t16"]


def enqueue(store, models, ks=(1, 2), prompts=PROMPTS, max_new_tokens=8, name="fault"):
    return enqueue_experiment(
        store,
        name=name,
        target=models["target"],
        draft=models["draft"],
        prompts="inline",
        sampling={"temperature": 0.0, "max_new_tokens": max_new_tokens, "seed": 3},
        device="cpu",
        sweep_values=list(ks),
        prompt_texts=prompts,
    )


def outage_at_prompt(fault_on, fault_off, prompt_index: int, seconds: float):
    """A progress hook that switches the fault on when the first decode of `prompt_index` starts (inside
    the timed generation, so the prompt's commit is the first write to fail) and off `seconds` later."""
    fired = threading.Event()

    def hook(run, index, tokens, repeat):
        if index == prompt_index and not fired.is_set():
            fired.set()
            fault_on()
            threading.Timer(seconds, fault_off).start()

    hook.fired = fired  # type: ignore[attr-defined]  # what the test waits on
    return hook


def outage_lines(logs):
    return [line for line in logs if "does not accept writes" in line]


def test_a_short_outage_mid_run_is_retried_and_every_prompt_is_committed(tmp_path, model_dirs):
    path = tmp_path / "outage.db"
    store = open_store(f"sqlite:///{path}")
    eid = enqueue(store, model_dirs)
    logs = []
    with SqliteWriteFault(path) as fault:
        hook = outage_at_prompt(lambda: setattr(fault, "on", True), lambda: setattr(fault, "on", False), 2, 1.5)
        worker = Worker(
            store, heartbeat_seconds=0.2, progress_seconds=0.1, db_retry_seconds=30, log=logs.append, progress_hook=hook
        )
        with worker:
            worker.work(until_idle=True)  # used to die with OperationalError, its runs left `running`
    assert hook.fired.is_set()
    found = audit(store)
    assert found["done"] == found["runs"] == 3, found
    assert found["missing_prompts"] == 0 and found["duplicates"] == 0 and found["integrity"] == "ok"
    assert all(n == len(PROMPTS) for n in found["stored"].values())
    assert len(outage_lines(logs)) == 1, logs  # one line for the outage, not one per retry or heartbeat
    assert any("accepts writes again" in line for line in logs), logs
    assert not any("Traceback" in line for line in logs)
    assert get_experiment(store, eid)
    store.dispose()


def test_an_outage_past_the_retry_bound_fails_the_runs_with_the_reason_once_writes_work(tmp_path, model_dirs):
    path = tmp_path / "long.db"
    store = open_store(f"sqlite:///{path}")
    enqueue(store, model_dirs)
    logs = []
    with SqliteWriteFault(path) as fault:
        ended = threading.Event()
        hook = outage_at_prompt(
            lambda: setattr(fault, "on", True), lambda: (setattr(fault, "on", False), ended.set()), 2, 2.5
        )
        worker = Worker(
            store,
            heartbeat_seconds=0.2,
            progress_seconds=0.1,
            db_retry_seconds=1.0,
            log=logs.append,
            progress_hook=hook,
        )
        worker.start()
        try:
            try:
                worker.work(until_idle=True)
            except DatabaseUnavailable:
                pass  # --until-idle gives up too; the runs' end is written as soon as the database takes it
            assert ended.wait(10)
            time.sleep(0.5)  # the heartbeat notices the database is back
        finally:
            worker.stop()
    with store.read() as conn:
        rows = conn.execute(text("SELECT status, error, prompts_done FROM runs ORDER BY id")).all()
    assert {r.status for r in rows} == {"failed"}, rows
    for r in rows:
        assert "did not accept writes" in r.error and "resume" in r.error and "\n" not in r.error, r.error
        assert r.prompts_done == 2  # the prompts committed before the outage are kept
    found = audit(store)
    assert found["stuck"] == 0 and found["duplicates"] == 0 and found["integrity"] == "ok"
    assert not any("Traceback" in line for line in logs)
    store.dispose()


def test_cli_run_ends_with_one_error_line_when_the_database_stays_unwritable(tmp_path, model_dirs, capsys, monkeypatch):
    from app.cli import main

    path = tmp_path / "cli.db"
    url = f"sqlite:///{path}"
    open_store(url).dispose()
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS) + "\n")
    monkeypatch.setenv("DRAFTLAB_DB_RETRY_SECONDS", "1")
    import app.worker.worker as worker_module

    with SqliteWriteFault(path) as fault:
        hook = outage_at_prompt(lambda: setattr(fault, "on", True), lambda: setattr(fault, "on", False), 2, 30)
        real_init = worker_module.Worker.__init__

        def init(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            inner = self.progress_hook
            self.progress_hook = lambda *a: (hook(*a), inner and inner(*a))

        monkeypatch.setattr(worker_module.Worker, "__init__", init)
        code = main(
            [
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
                "8",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--db",
                url,
            ]
        )
        err = capsys.readouterr().err
    assert code == 1, err
    errors = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    assert "did not accept writes" in errors[0] and "draftlab resume" in errors[0], errors[0]


def test_cli_run_recovers_from_a_short_outage(tmp_path, model_dirs, capsys, monkeypatch):
    import app.worker.worker as worker_module
    from app.cli import main

    path = tmp_path / "cli.db"
    url = f"sqlite:///{path}"
    open_store(url).dispose()
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS) + "\n")
    with SqliteWriteFault(path) as fault:
        hook = outage_at_prompt(lambda: setattr(fault, "on", True), lambda: setattr(fault, "on", False), 2, 1.5)
        real_init = worker_module.Worker.__init__

        def init(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            inner = self.progress_hook
            self.progress_hook = lambda *a: (hook(*a), inner and inner(*a))

        monkeypatch.setattr(worker_module.Worker, "__init__", init)
        code = main(
            [
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
                "8",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--db",
                url,
            ]
        )
        err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err and not [line for line in err.splitlines() if line.startswith("error:")]
    found = audit(open_store(url))
    assert found["done"] == 3 and found["missing_prompts"] == 0 and found["duplicates"] == 0


# --- the soak -------------------------------------------------------------------------------------------------

EXPERIMENTS, SOAK_PROMPTS = 10, PROMPTS[:3]


def soak(store, model_dirs, fault_on, fault_off, outage_seconds=2.5):
    """One worker drains 10 experiments x (baseline + k=1,2) while the database goes away three times (the
    third time for longer than the worker's retry bound); returns (audit, rows lost, worker log)."""
    for i in range(EXPERIMENTS):
        enqueue(store, model_dirs, prompts=SOAK_PROMPTS, name=f"soak {i}")
    total = EXPERIMENTS * 3 * len(SOAK_PROMPTS)
    logs, outages = [], []
    worker = Worker(
        store, heartbeat_seconds=0.3, progress_seconds=0.1, poll_seconds=0.1, db_retry_seconds=30, log=logs.append
    )
    watcher = CommitWatcher(store).start()

    def inject():
        for n, fraction in enumerate((0.15, 0.45, 0.7)):
            while sum(watcher.seen.values()) < fraction * total:
                if done.is_set():
                    return
                time.sleep(0.02)
            if n == 2:
                worker.db_retry_seconds = 1.0  # this one outlasts the retry bound
            fault_on()
            outages.append(time.monotonic())
            time.sleep(outage_seconds)
            fault_off()
            time.sleep(0.3)
            worker.db_retry_seconds = 30

    done = threading.Event()
    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    deadline = time.monotonic() + 150
    worker.start()
    try:
        while time.monotonic() < deadline:
            try:
                worker.work(until_idle=True)  # a supervisor restarting `draftlab worker --until-idle`
            except DatabaseUnavailable:
                time.sleep(0.3)
                continue
            try:
                with store.read() as conn:
                    left = conn.execute(
                        text("SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')")
                    ).scalar()
            except Exception:  # noqa: BLE001 - PostgreSQL is down right now
                left = -1
            if left == 0 and not injector.is_alive():
                break
            time.sleep(0.2)
    finally:
        done.set()
        injector.join(30)
        worker.stop()
        watcher.stop()
    found = audit(store)
    return found, watcher.lost(found["stored"]), logs, outages


def check_soak(found, lost, logs, outages):
    assert len(outages) == 3, (outages, logs)
    assert found["runs"] == EXPERIMENTS * 3
    assert found["stuck"] == 0 and found["interrupted"] == 0 and found["other"] == 0, found
    assert found["done"] + found["failed_with_reason"] == found["runs"] and found["failed_without_reason"] == 0, found
    assert found["done"] >= found["runs"] - 6, found  # only the group caught past the bound may fail
    assert found["missing_prompts"] == 0 and found["duplicates"] == 0 and lost == 0, (found, lost)
    assert found["integrity"] == "ok"
    assert 1 <= len(outage_lines(logs)) <= 3, logs  # one line per outage at most
    assert not any("Traceback" in line for line in logs)


def test_soak_sqlite_writes_refused_three_times(tmp_path, model_dirs):
    path = tmp_path / "soak.db"
    store = open_store(f"sqlite:///{path}")
    with SqliteWriteFault(path) as fault:
        found, lost, logs, outages = soak(
            store, model_dirs, lambda: setattr(fault, "on", True), lambda: setattr(fault, "on", False)
        )
    check_soak(found, lost, logs, outages)
    store.dispose()


@pytest.fixture(scope="module")
def own_postgres():
    server = OwnPostgres()
    try:
        why = server.start_first()
        if why:  # a failure under scripts/test.sh (services required), else a skip; both say why
            from tests.conftest import missing_service

            missing_service(
                f"cannot start a PostgreSQL server of our own to stop and start (never the shared one): {why}"
            )
        yield server
    finally:
        server.close()


def test_soak_postgres_server_stopped_three_times(own_postgres, model_dirs):
    store = open_store(own_postgres.url)
    try:
        found, lost, logs, outages = soak(
            store, model_dirs, lambda: own_postgres.stop("fast"), lambda: own_postgres.start()
        )
    finally:
        store.dispose()
    check_soak(found, lost, logs, outages)
