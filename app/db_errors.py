"""What a database error means for the caller: worth retrying or not, and one short line naming it.

Torch-free (the CLI imports it before any model is loaded); the worker's retry loop (app/runtime/db_retry.py), the
CLI's `error:` lines and `draftlab ui` classify and word database failures here, and nowhere else.
"""

from __future__ import annotations

import re


class DatabaseUnavailable(Exception):
    """The database refused writes (or connections) for longer than the worker's retry bound."""


# An outage, not a bug in a statement: worth retrying whatever exception class the driver raised it as (psycopg
# raises a read-only database as InternalError, SQLAlchemy wraps each as the DB-API class it maps to). PostgreSQL
# by SQLSTATE (https://www.postgresql.org/docs/current/errcodes-appendix.html), SQLite by its primary result code.
TRANSIENT_SQLSTATES = {
    "25006": "read-only transaction (default_transaction_read_only, a standby, a hot-standby promotion pending)",
    "57P01": "admin shutdown (the server is stopping, or pg_terminate_backend ended the session)",
    "57P02": "crash shutdown",
    "57P03": "cannot connect now (the server is starting or recovering)",
    "57P05": "idle session timeout",
    "40001": "serialization failure",
    "40P01": "deadlock detected",
    "55P03": "lock not available",
}
TRANSIENT_SQLSTATE_CLASSES = {
    "08": "connection exception",
    "53": "insufficient resources (disk full, out of memory, too many connections)",
    "58": "system error (I/O)",
}
# SQLite primary result codes: BUSY, LOCKED ('database is locked'), READONLY ('attempt to write a readonly
# database'), IOERR ('disk I/O error'), FULL ('database or disk is full'), CANTOPEN, PROTOCOL.
TRANSIENT_SQLITE_CODES = {
    5: "SQLITE_BUSY",
    6: "SQLITE_LOCKED",
    8: "SQLITE_READONLY",
    10: "SQLITE_IOERR",
    13: "SQLITE_FULL",
    14: "SQLITE_CANTOPEN",
    15: "SQLITE_PROTOCOL",
}
_SQLITE_MESSAGES = (
    "database is locked",
    "database table is locked",
    "readonly database",
    "disk i/o error",
    "database or disk is full",
    "unable to open database file",
)


# A lock another connection holds, not a database that refuses writes: SQLite's BUSY / LOCKED ("database is
# locked": another process is inside a write transaction), PostgreSQL's lock_not_available (lock_timeout passed).
LOCKED_SQLITE_CODES = {5, 6}
LOCKED_SQLSTATES = {"55P03"}
_LOCKED_MESSAGES = ("database is locked", "database table is locked")
LOCKED_FIX = (
    "another process holds a write transaction on it (a worker, `draftlab run`, an open sqlite3 shell); "
    "retry when it is done, or stop that process"
)


def locked(exc: BaseException) -> bool:
    """Whether a database error is a lock another connection holds (retry once it lets go), not a read-only or
    broken database."""
    if sqlstate(exc) in LOCKED_SQLSTATES:
        return True
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in LOCKED_SQLITE_CODES
    return type(orig).__module__ == "sqlite3" and any(m in str(orig).lower() for m in _LOCKED_MESSAGES)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error (psycopg 3's `sqlstate`, psycopg2's `pgcode`), wrapped or not."""
    for err in (getattr(exc, "orig", None), exc):
        code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if isinstance(code, str) and len(code) == 5:
            return code
    return None


def outage_kind(exc: BaseException) -> str | None:
    """What kind of database outage `exc` is (a few words, for logs), or None when it is not one: a bug in a
    statement, a constraint, bad data. Classified by SQLSTATE and the driver's error code before the exception
    class, so a read-only PostgreSQL (InternalError) is an outage like a stopped one (OperationalError)."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    code = sqlstate(exc)
    if code is not None:
        kind = TRANSIENT_SQLSTATES.get(code) or TRANSIENT_SQLSTATE_CLASSES.get(code[:2])
        if kind is not None:
            return f"{kind} [{code}]"
    orig = getattr(exc, "orig", None) or exc
    sqlite_code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int) and (sqlite_code & 0xFF) in TRANSIENT_SQLITE_CODES:
        return TRANSIENT_SQLITE_CODES[sqlite_code & 0xFF]
    if type(orig).__module__ == "sqlite3" and any(m in str(orig).lower() for m in _SQLITE_MESSAGES):
        return "SQLite: " + str(orig).strip()[:60]
    if isinstance(exc, DBAPIError) and getattr(exc, "connection_invalidated", False):
        return "connection lost"
    if isinstance(exc, (OperationalError, InterfaceError)):  # the DB-API's own class for "the database failed"
        return "operational error" + (f" [{code}]" if code else "")
    return None


def transient_db_error(exc: BaseException) -> bool:
    """A database error worth retrying: an outage (outage_kind) — the database refused the write or the
    connection (read-only, shut down, unreachable, serialization conflict, locked, disk full) — as opposed to a bug
    in a statement."""
    return outage_kind(exc) is not None


def db_reason(exc: BaseException) -> str:
    """`DriverError: first line` of a database error, short (the worker's log lines)."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0][:160]
    return f"{type(orig).__name__}: {first}" if first else type(orig).__name__


def db_error_reason(exc: BaseException, url: str | None = None) -> str:
    """`Type: first line` of a database error (the driver's own error when SQLAlchemy wraps one), at most 200
    characters, with the password of `url` hidden (the CLI's and `draftlab ui`'s `error:` lines)."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0][:200]
    reason = f"{type(orig).__name__}: {first}" if first else type(orig).__name__
    return scrub(reason, url) if url else reason


def scrub(text: str, url: str) -> str:
    """`text` with the database URL's password hidden (a full URL becomes its safe form)."""
    from sqlalchemy.engine import make_url

    from storage.db.store import safe_url

    text = text.replace(url, safe_url(url))
    try:
        decoded = make_url(url).password
    except Exception:  # noqa: BLE001 - unparseable: safe_url above already masked what it could
        decoded = None
    raw = re.search(r"://[^:/@]*:(.*)@", url)
    for secret in {str(decoded or ""), raw.group(1) if raw else ""}:
        if len(secret) >= 4:  # a shorter one would mangle every message it happens to occur in
            text = text.replace(secret, "***")
    return text
