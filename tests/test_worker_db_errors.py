"""Every database outage is retried, whatever exception class the driver raises it as (issue 21, item 2).

app/db_errors.py classifies by SQLSTATE (PostgreSQL) and result code (SQLite) before the exception class: a
PostgreSQL database turned read-only arrives as InternalError (ReadOnlySqlTransaction, 25006), which the worker
let through and died of (exit 2). Each class is provoked for real here — on a throw-away PostgreSQL database this
test creates (never `test` itself; dropped afterwards) and on SQLite files — and then a worker rides out a
read-only PostgreSQL mid-run (`ALTER DATABASE … SET default_transaction_read_only = on` plus ended sessions).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from app.db_errors import outage_kind, sqlstate, transient_db_error

# --- a throw-away PostgreSQL database -------------------------------------------------------------------------


class ScratchDatabase:
    """CREATE DATABASE draftlab_outage_<hex> on the test server; read_only() flips default_transaction_read_only
    and ends every session on it (so each new one sees the setting); drop() removes it (WITH FORCE)."""

    def __init__(self, server: str):
        import psycopg

        self.admin = server.replace("postgresql+psycopg://", "postgresql://")
        self.name = f"draftlab_outage_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.url = (
            make_url(self.admin)
            .set(drivername="postgresql+psycopg", database=self.name)
            .render_as_string(hide_password=False)
        )

    def _admin(self, *statements, params=None):
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement, params)

    def end_sessions(self) -> None:
        self._admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %(db)s AND pid <> pg_backend_pid()",
            params={"db": self.name},
        )

    def read_only(self, on: bool) -> None:
        self._admin(f'ALTER DATABASE "{self.name}" SET default_transaction_read_only = {"on" if on else "off"}')
        self.end_sessions()

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@pytest.fixture
def scratch(postgres_server):
    db = ScratchDatabase(postgres_server)
    try:
        yield db
    finally:
        db.drop()


def _execute(engine, statement: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(statement))


def _raised(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the error under test
        return exc
    pytest.fail("no error was raised")


# --- one real error of each class, classified ---------------------------------------------------------------


def test_postgres_read_only_is_an_outage_though_it_arrives_as_internal_error(scratch):
    engine = create_engine(scratch.url)
    try:
        scratch.read_only(True)
        exc = _raised(lambda: _execute(engine, "CREATE TABLE t (x int)"))
        assert type(exc).__name__ == "InternalError" and sqlstate(exc) == "25006", exc  # what the probe saw
        assert transient_db_error(exc) and "read-only" in outage_kind(exc)
    finally:
        engine.dispose()
        scratch.read_only(False)


def test_postgres_admin_shutdown_of_a_session_is_an_outage(scratch):
    engine = create_engine(scratch.url, pool_size=1)
    try:
        conn = engine.connect()
        conn.execute(text("SELECT 1"))
        scratch.end_sessions()  # pg_terminate_backend: the server says 57P01 and closes the session
        exc = _raised(lambda: conn.execute(text("SELECT 1")))
        assert isinstance(exc, DBAPIError) and sqlstate(exc) in ("57P01", None), exc
        assert transient_db_error(exc), exc
        conn.close()
    finally:
        engine.dispose()


def test_postgres_connection_failure_is_an_outage(postgres_server):
    url = make_url(postgres_server).set(drivername="postgresql+psycopg", port=1)
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        exc = _raised(lambda: engine.connect())
    finally:
        engine.dispose()
    assert transient_db_error(exc) and type(exc).__name__ == "OperationalError", exc


def test_postgres_serialization_failure_and_deadlock_are_outages(scratch):
    engine = create_engine(scratch.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (id int PRIMARY KEY, v int)"))
            conn.execute(text("INSERT INTO t VALUES (1, 0), (2, 0)"))
        # 40001: two SERIALIZABLE transactions that each read what the other writes (write skew)
        a, b = engine.connect(), engine.connect()
        for conn in (a, b):
            conn.execute(text("BEGIN ISOLATION LEVEL SERIALIZABLE"))
            conn.execute(text("SELECT sum(v) FROM t")).scalar()
        a.execute(text("UPDATE t SET v = v + 1 WHERE id = 1"))
        b.execute(text("UPDATE t SET v = v + 1 WHERE id = 2"))
        a.execute(text("COMMIT"))
        exc = _raised(lambda: b.execute(text("COMMIT")))
        assert sqlstate(exc) == "40001" and transient_db_error(exc) and "serialization" in outage_kind(exc), exc
        for conn in (a, b):
            conn.rollback()
            conn.close()
        # 40P01: two transactions locking the two rows in opposite orders
        a, b = engine.connect(), engine.connect()
        a.execute(text("BEGIN"))
        b.execute(text("BEGIN"))
        a.execute(text("SELECT * FROM t WHERE id = 1 FOR UPDATE"))
        b.execute(text("SELECT * FROM t WHERE id = 2 FOR UPDATE"))
        errors = []

        def lock(conn, row):
            try:
                conn.execute(text(f"SELECT * FROM t WHERE id = {row} FOR UPDATE"))
            except Exception as exc:  # noqa: BLE001 - the deadlock victim
                errors.append(exc)
                conn.rollback()

        thread = threading.Thread(target=lock, args=(a, 2))
        thread.start()
        time.sleep(0.3)  # a waits for b's row
        lock(b, 1)
        thread.join(30)
        assert len(errors) == 1, errors
        assert sqlstate(errors[0]) == "40P01" and transient_db_error(errors[0]) and "deadlock" in outage_kind(errors[0])
        for conn in (a, b):
            conn.rollback()
            conn.close()
    finally:
        engine.dispose()


def test_postgres_statement_bugs_are_not_outages(scratch):
    engine = create_engine(scratch.url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (id int PRIMARY KEY)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
        for statement, state in [
            ("INSERT INTO t VALUES (1)", "23505"),
            ("SELEKT 1", "42601"),
            ("SELECT 1 / 0", "22012"),
            ("SELECT 2147483647 + 1", "22003"),
        ]:
            exc = _raised(lambda statement=statement: _execute(engine, statement))
            assert sqlstate(exc) == state and not transient_db_error(exc), (statement, exc)
    finally:
        engine.dispose()


def test_sqlite_locked_read_only_and_disk_io_errors_are_outages(tmp_path):
    path = tmp_path / "x.db"
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x int)"))
        holder = engine.connect()
        holder.exec_driver_sql("BEGIN IMMEDIATE")  # another writer holds the lock
        locked = _raised(lambda: _execute(engine, "INSERT INTO t VALUES (1)"))
        holder.rollback()
        holder.close()
        assert "database is locked" in str(locked) and outage_kind(locked) == "SQLITE_BUSY", locked
        read_only = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
        refused = _raised(lambda: _execute(read_only, "INSERT INTO t VALUES (1)"))
        read_only.dispose()
        assert "readonly database" in str(refused) and outage_kind(refused) == "SQLITE_READONLY", refused
        constraint = _raised(lambda: _execute(engine, "INSERT INTO nowhere VALUES (1)"))
        assert "no such table" in str(constraint)  # (SQLite's OperationalError for a bug: retried, as before)
    finally:
        engine.dispose()
    # a real write error: the file may not grow past RLIMIT_FSIZE (SIGXFSZ ignored) -> SQLITE_IOERR_WRITE
    script = (
        "import resource, signal, sys\n"
        "from sqlalchemy import create_engine, text\n"
        "from app.db_errors import outage_kind\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"engine = create_engine('sqlite:///{tmp_path / 'small.db'}')\n"
        "with engine.begin() as c: c.execute(text('CREATE TABLE t (x blob)'))\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
        "try:\n"
        "    with engine.begin() as c: c.execute(text('INSERT INTO t VALUES (zeroblob(1000000))'))\n"
        "except Exception as exc:\n"
        "    print(str(exc.orig), '|', outage_kind(exc))\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.strip() == "disk I/O error | SQLITE_IOERR", done.stdout + done.stderr


# --- a worker rides out a read-only PostgreSQL -----------------------------------------------------------------


def test_a_worker_rides_out_a_postgres_database_turned_read_only(scratch, model_dirs):
    from app.worker.worker import Worker
    from storage import open_store
    from tests.fault_tools import audit
    from tests.test_faults import PROMPTS, enqueue, outage_at_prompt, outage_lines

    store = open_store(scratch.url)
    enqueue(store, model_dirs)
    logs = []
    back = threading.Event()
    hook = outage_at_prompt(lambda: scratch.read_only(True), lambda: (scratch.read_only(False), back.set()), 2, 2.0)
    worker = Worker(
        store, heartbeat_seconds=0.2, progress_seconds=0.1, db_retry_seconds=60, log=logs.append, progress_hook=hook
    )
    try:
        with worker:
            worker.work(until_idle=True)  # died with InternalError (ReadOnlySqlTransaction) before
        assert hook.fired.is_set() and back.is_set()
        found = audit(store)
        assert found["done"] == found["runs"] == 3, (found, logs)
        assert found["missing_prompts"] == 0 and found["duplicates"] == 0 and found["integrity"] == "ok"
        assert all(n == len(PROMPTS) for n in found["stored"].values())
        assert outage_lines(logs), logs  # the outage was seen and logged, then ridden out
        assert any("accepts writes again" in line for line in logs), logs
    finally:
        store.dispose()
