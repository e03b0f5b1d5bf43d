"""The worker's database calls, retried: a write (or read) the database refuses for a passing reason (disk full,
read-only file, locked, server restarting) is retried with exponential backoff, one log line per outage, until
$DRAFTLAB_DB_RETRY_SECONDS (default 300) after the outage began; then DatabaseUnavailable. Torch-free: the CLI
reads its settings' wording here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from app.db_errors import DatabaseUnavailable, db_reason, locked, outage_kind, transient_db_error
from storage.db.settings import seconds_setting

DB_RETRY_ENV, DEFAULT_DB_RETRY_SECONDS = "DRAFTLAB_DB_RETRY_SECONDS", 300.0
MAX_BACKOFF_SECONDS = 5.0
DB_RETRY_HELP = (
    "A database write that fails (disk full, read-only file, server restarting) is retried with backoff "
    "for $DRAFTLAB_DB_RETRY_SECONDS seconds (default 300), the results held in memory, before the runs "
    "fail with the reason"
)


def db_retry_window(value: float | None = None) -> float:
    """How long a worker retries a failed database write: `value`, else $DRAFTLAB_DB_RETRY_SECONDS, else 300."""
    return seconds_setting(DB_RETRY_ENV, DEFAULT_DB_RETRY_SECONDS, value, allow_zero=True)


class DbRetry:
    """One worker's retried database calls and its current outage (shared by its main and heartbeat threads):
    `retry(fn, *args, write=True, **kwargs)`."""

    def __init__(self, retry_seconds: float, log: Callable[[str], None]):
        self.retry_seconds = retry_seconds
        self.log = log
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time of the current outage's first failed call
        self._gave_up = False  # this outage already passed the retry bound (logged once)

    def failed(self, exc: BaseException) -> float:
        """Note a refused write or connection; the first of an outage is logged. Returns the outage's start."""
        with self._lock:
            first = self._since is None
            since = time.monotonic() if self._since is None else self._since
            self._since = since
        if first:
            what = "is locked by another process's write transaction" if locked(exc) else "does not accept writes"
            self.log(
                f"the database {what} ({outage_kind(exc) or 'error'}: {db_reason(exc)}); "
                f"retrying with backoff for up to {self.retry_seconds:g}s, finished prompts held in memory "
                f"until it does"
            )
        return since

    def ok(self) -> None:
        """A write went through: end the outage, if any (logged)."""
        with self._lock:
            since, self._since, self._gave_up = self._since, None, False
        if since is not None:
            self.log(f"the database accepts writes again (after {time.monotonic() - since:.1f}s)")

    def give_up(self, exc: DatabaseUnavailable) -> None:
        """The outage passed the retry bound: say so once."""
        with self._lock:
            first, self._gave_up = not self._gave_up, True
        if first:
            self.log(f"giving up: {exc}")

    def retry(self, fn: Callable, *args, write: bool = True, **kwargs):
        """fn(*args, **kwargs), retried with exponential backoff (0.1 s doubling to 5 s) while the database refuses
        it (transient errors only), until retry_seconds after the start of the outage (so once a worker gave up,
        every call fails at once until a write gets through); then DatabaseUnavailable. fn runs whole
        transactions, so a retry never sees half of a failed one. `write`: a success ends the outage."""
        delay, deadline = 0.1, None
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - filtered just below
                if not transient_db_error(exc):
                    raise
                since = self.failed(exc)
                if deadline is None:  # fixed at the first failure: a heartbeat that gets through does not extend it
                    deadline = since + self.retry_seconds
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DatabaseUnavailable(
                        f"the database did not accept writes for {self.retry_seconds:g}s ({db_reason(exc)})"
                    ) from exc
                time.sleep(min(delay, left))
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
                continue
            if write:
                self.ok()
            return result
