"""What a database error means for the caller: worth retrying or not, and one short line naming it.

Torch-free (the CLI imports it before any model is loaded); the worker's retry loop (app/db_retry.py), the
CLI's `error:` lines and `draftlab ui` classify and word database failures here, and nowhere else.
"""
from __future__ import annotations

import re


class DatabaseUnavailable(Exception):
    """The database refused writes (or connections) for longer than the worker's retry bound."""


def transient_db_error(exc: BaseException) -> bool:
    """A database error worth retrying: the database refused the write or the connection (read-only, disk
    full, locked, server down or restarting), as opposed to a bug in a statement."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    return isinstance(exc, (OperationalError, InterfaceError)) or (
        isinstance(exc, DBAPIError) and bool(getattr(exc, "connection_invalidated", False)))


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

    from storage.store import safe_url

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
