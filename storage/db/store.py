"""Opening a database: URL resolution, SQLite pragmas, schema creation/upgrade, and none created where a command only
reads one (`existing`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sqlalchemy import Connection, CursorResult, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from storage.db.migrations import current_version, ensure_schema

DEFAULT_URL = "sqlite:///draftlab.db"
# How long a statement waits for a lock another connection holds before it fails as locked: SQLite's busy timeout,
# and PostgreSQL's lock_timeout where a command checks it can write (Store.check_writable).
LOCK_WAIT_MS = 30_000


class NoDatabase(LookupError):
    """A command that only reads an existing database (open_store(existing=True)) found none at the URL: no SQLite
    file there, no such PostgreSQL database, or one without DraftLab's tables. Nothing was created."""


def resolve_url(url: str | None = None) -> str:
    """--db, else $DRAFTLAB_DB, else sqlite:///draftlab.db; plain postgresql:// means psycopg 3."""
    url = url or os.environ.get("DRAFTLAB_DB") or DEFAULT_URL
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def safe_url(url: str | None = None) -> str:
    """The URL (resolved as open_store would) with its password hidden, for anything printed or shown."""
    url = resolve_url(url)
    try:
        parsed = make_url(url)
        return parsed.render_as_string(hide_password=True) if parsed.password else url  # sqlite paths stay verbatim
    except Exception:  # noqa: BLE001 - not a parseable URL: mask whatever sits between `user:` and `@`
        return re.sub(r"(://[^:/@]*:).*@", r"\1***@", url)  # greedy: a stray @ in the password stays hidden


@dataclass
class Store:
    engine: Engine
    url: str

    @property
    def safe_url(self) -> str:
        """The URL with its password hidden: use this, never `url`, in messages and pages."""
        return safe_url(self.url)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A Session committed on success, rolled back on error."""
        with sessionmaker(self.engine).begin() as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction: one consistent snapshot."""
        with self.engine.connect() as conn:
            with conn.begin():
                yield conn

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction. On SQLite it takes the write lock up front (BEGIN IMMEDIATE), so a
        read-then-write transaction cannot fail with SQLITE_BUSY when another writer got in between."""
        with self.engine.connect().execution_options(draftlab_immediate=True) as conn:
            with conn.begin():
                yield conn

    def check_writable(self) -> None:
        """Raise (the driver's error) unless this store accepts writes: a read-only SQLite file, a read-only
        PostgreSQL transaction or a role without UPDATE fails here rather than at a command's first write."""
        with self.write() as conn:
            if self.dialect == "postgresql":  # a table another session locked: fail as locked (55P03), not hang
                conn.execute(text(f"SET LOCAL lock_timeout = {int(LOCK_WAIT_MS)}"))
            conn.execute(text("UPDATE schema_info SET version = version WHERE 1 = 0"))

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"timeout": LOCK_WAIT_MS / 1000, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection, _record):
        # Let SQLAlchemy, not the driver, decide where transactions begin (so SELECTs and DDL are transactional).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if make_url(url).database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer, nor it them
        cursor.execute(f"PRAGMA busy_timeout={LOCK_WAIT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; WAL keeps commits atomic
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("draftlab_immediate") else "BEGIN")

    return engine


def open_store(url: str | None = None, create: bool = True, existing: bool = False) -> Store:
    """Open (and create or upgrade) the database at url (see resolve_url). `existing`: only a DraftLab database
    that is already there (the commands that read one): NoDatabase, and nothing created, when there is none."""
    url = resolve_url(url)
    sqlite = make_url(url).get_backend_name() == "sqlite"
    if existing and sqlite and (path := _sqlite_file(url)) is not None and not path.exists():
        raise NoDatabase(f"no DraftLab database at {safe_url(url)} (no file {path})")
    engine = _sqlite_engine(url) if sqlite else create_engine(url, pool_pre_ping=True)
    if existing:
        _check_existing(engine, url)
    if create:
        ensure_schema(engine)
    return Store(engine=engine, url=url)


def _sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL opens (a `file:` URI's path too), None for an in-memory database."""
    parsed = make_url(url)
    database = parsed.database or ""
    if str(parsed.query.get("uri", "")).lower() in ("true", "1") and database.startswith("file:"):
        if "memory" in str(parsed.query.get("mode", "")):
            return None
        database = urlparse(database).path
    return None if database in ("", ":memory:") else Path(database)


_NO_SUCH_DATABASE = re.compile(r'database ".+" does not exist')


def _check_existing(engine: Engine, url: str) -> None:
    """NoDatabase (the engine disposed) unless the database exists and holds DraftLab's tables: a PostgreSQL server
    without that database (SQLSTATE 3D000), or an empty database or file."""
    from sqlalchemy.exc import DBAPIError

    try:
        with engine.connect() as conn:
            found = current_version(conn)
    except DBAPIError as exc:  # invalid_catalog_name (3D000); at connect psycopg gives the server's words alone
        if getattr(exc.orig, "sqlstate", None) != "3D000" and not _NO_SUCH_DATABASE.search(str(exc.orig)):
            raise
        engine.dispose()
        raise NoDatabase(
            f"no DraftLab database at {safe_url(url)} (the server has no database {make_url(url).database!r})"
        ) from None
    if found is None:
        engine.dispose()
        raise NoDatabase(f"no DraftLab database at {safe_url(url)} (it holds none of DraftLab's tables)")


def new_id(result: CursorResult[Any]) -> int:
    """The primary key an INSERT of one row gave it (every table here has an integer one)."""
    key = result.inserted_primary_key
    if key is None:
        raise RuntimeError("the INSERT returned no primary key")
    return int(key[0])
