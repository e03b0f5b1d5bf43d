"""The database a command is pointed at (issue 35 item 8): a command that only reads one never creates it (a typo'd
--db is "no ... database at URL", exit 2, nothing written), and a database another process holds locked is said to
be locked, with the fix (retry), not read-only. On SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from app.cli import main
from storage import open_store
from storage.jobs import run_state
from storage.jobs.experiments import enqueue_experiment

READING = [
    ["list"],
    ["list", "--json"],
    ["export", "1"],
    ["export", "1", "--format", "deploy"],
    ["resume", "1"],
    ["confirm", "1"],
    ["validate", "1"],
    ["import-metrics", "scrape.txt", "--experiment", "1"],
]


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert out == "" and len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


def _nothing_there(url: str) -> bool:
    """No SQLite file; no DraftLab table in the PostgreSQL schema."""
    if url.startswith("sqlite"):
        return not Path(str(make_url(url).database)).exists()
    from sqlalchemy import create_engine

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        return not inspect(engine).get_table_names()
    finally:
        engine.dispose()


@pytest.mark.parametrize("command", READING, ids=lambda c: " ".join(c))
def test_a_command_that_reads_never_creates_a_database(db_url, command, capsys):
    assert _nothing_there(db_url)  # a SQLite path that is not there, a PostgreSQL schema without DraftLab's tables
    assert main([*command, "--db", db_url]) == 2
    line = _one_error_line(capsys)
    assert "no DraftLab database at" in line and "--db" in line and "`draftlab run`" in line
    assert _nothing_there(db_url)


def test_run_and_worker_still_start_a_new_database(db_url, capsys):
    assert main(["worker", "--until-idle", "--db", db_url]) == 0
    capsys.readouterr()
    assert not _nothing_there(db_url)
    assert main(["list", "--db", db_url]) == 0  # now there: an empty one reads as such
    assert "no experiments" in capsys.readouterr().out


def test_a_postgresql_database_the_server_does_not_have_is_named(postgres_url, capsys):
    url = make_url(postgres_url).set(database="draftlab_no_such_db").render_as_string(hide_password=False)
    assert main(["list", "--db", url]) == 2
    line = _one_error_line(capsys)
    assert "no DraftLab database at" in line and "draftlab_no_such_db" in line


def _hold_lock(url: str):
    """Another connection holding the database locked (SQLite: a write transaction; PostgreSQL: schema_info locked
    against writes); returns it (rollback and close it to let go)."""
    if url.startswith("sqlite"):
        lite = sqlite3.connect(str(make_url(url).database), isolation_level=None)
        lite.execute("BEGIN IMMEDIATE")
        return lite
    import psycopg

    holder = psycopg.connect(url)
    holder.execute("LOCK TABLE schema_info IN EXCLUSIVE MODE")
    return holder


def test_a_locked_database_is_named_locked_not_read_only(db_url, monkeypatch, capsys):
    import storage.db.store

    store = open_store(db_url)
    eid = enqueue_experiment(
        store,
        name="locked",
        target="t",
        draft="d",
        prompts="tiny",
        sampling={},
        sweep_values=[1],
        prompt_texts=["t1 t2"],
    )
    run_state.cancel_experiment(store, eid)
    store.dispose()
    monkeypatch.setattr(storage.db.store, "LOCK_WAIT_MS", 300)  # wait 0.3 s for a lock, not 30
    holder = _hold_lock(db_url)
    try:
        assert main(["resume", str(eid), "--db", db_url]) == 2
        line = _one_error_line(capsys)
    finally:
        holder.rollback()
        holder.close()
    assert "is locked" in line and "another process" in line and "retry" in line
    assert "does not accept writes" not in line and "writable" not in line
    assert main(["resume", str(eid), "--db", db_url]) == 0  # the lock gone, the same command goes through
    assert "requeued 2 runs" in capsys.readouterr().out
