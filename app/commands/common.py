"""What every `draftlab` command shares: the parser class whose errors are one line, the exit statuses, the one
`error: …` line, and opening the database (--db) with its failures reported in that line.

Bad input ends in exactly one `error: …` line on stderr and exit status 2; a failed run exits 1. Torch-free: the
parser is built (and `--help` answered) before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from app.db_errors import LOCKED_FIX, db_error_reason, locked

EXIT_BAD_INPUT, EXIT_RUN_FAILED = 2, 1

DB_FIX = "check --db / $DRAFTLAB_DB"

CHAT_TEMPLATE_HELP = (
    "how conversation prompts become text: auto (the target tokenizer's chat template, with the "
    "generation prompt), none (the turns' texts joined by blank lines), or a Jinja template FILE; "
    "plain prompts are never templated (default auto)"
)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, never wrapped inside a hyphenated word: a model name (demo-draft-othervocab) stays whole."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose bad input is one `error:` line (exit 2) instead of the usage block."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise SystemExit(fail(f"{message} (see `{self.prog} --help`)"))


def fail(message: str, status: int = EXIT_BAD_INPUT) -> int:
    """Print the one `error: …` line on stderr; return `status` (the command's exit status)."""
    print(f"error: {message}", file=sys.stderr)
    return status


def open_store_or_fail(db: str | None, write: bool = False, create: bool = False):
    """The Store for `db` (--db, else $DRAFTLAB_DB, else the default), or EXIT_BAD_INPUT after one `error:` line
    on stderr naming the database (password hidden) and the fix. `write=True` also makes sure the database
    accepts writes (a read-only SQLite file opens fine and fails only at the first write). `create`: a command
    that may start a new database (run, worker); the others only read an existing one and never create it (a
    typo'd --db is "no database at ...").

    Use: `store = open_store_or_fail(args.db); if isinstance(store, int): return store`.
    """
    from storage import open_store
    from storage.db.store import NoDatabase, resolve_url

    url = resolve_url(db)
    try:
        store = open_store(url, existing=not create)
    except NoDatabase as exc:
        return fail(f"{exc}; {DB_FIX}: only `draftlab run`, `worker` and `ui` create a database")
    except Exception as exc:  # noqa: BLE001 - bad URL, missing driver, unreachable server, unwritable file, newer schema
        return database_failed(url, exc, "cannot open the database {db}")
    if write:
        try:
            store.check_writable()
        except Exception as exc:  # noqa: BLE001
            store.dispose()
            return database_failed(
                url,
                exc,
                "the database {db} does not accept writes",
                f"{DB_FIX} (a writable database) or make this one writable",
            )
    return store


def database_failed(url: str, exc: BaseException, failed: str, fix: str = DB_FIX) -> int:
    """One `error:` line for a database error: `failed` (its {db} the database, password hidden), the reason and
    `fix`; a lock another connection holds is said as such, with its fix (wait and retry), whatever failed."""
    from storage.db.store import safe_url

    reason = db_error_reason(exc, url)
    if locked(exc):
        return fail(f"the database {safe_url(url)} is locked ({reason}): {LOCKED_FIX}")
    return fail(f"{failed.format(db=safe_url(url))} ({reason}); {fix}")


def database_errors_reported(command, args) -> int:
    """Run `command(args)`; a database failure after opening (the server went away, the file turned read-only)
    ends in one `error:` line and exit status 2, not a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    from storage.db.store import resolve_url

    try:
        return command(args)
    except SQLAlchemyError as exc:
        return database_failed(resolve_url(args.db), exc, "the database {db} failed")


def stale_window_or_fail():
    """$DRAFTLAB_STALE_SECONDS as seconds, or EXIT_BAD_INPUT after one `error:` line."""
    from storage.db.errors import QueueError
    from storage.db.settings import stale_window

    try:
        return stale_window()
    except QueueError as exc:
        return fail(str(exc))


def store_command(args, command) -> int:
    """Run `command(args, store)` on the writable database; its refusals (DraftLabError, ProductionError) end in one
    `error:` line."""
    from engine.errors import DraftLabError
    from storage.records.production import ProductionError

    store = open_store_or_fail(args.db, write=True)
    if isinstance(store, int):
        return store
    try:
        return command(args, store)
    except (DraftLabError, ProductionError) as exc:
        return fail(str(exc))
    finally:
        store.dispose()


def experiment_missing(store, experiment_id: int) -> int | None:
    """EXIT_BAD_INPUT after one `error:` line when `experiment_id` names no stored experiment, else None: an explicit
    check, so that a KeyError raised later is the bug it is, never reported as a missing experiment."""
    from storage.records import queries as q

    if q.experiment(store, experiment_id) is None:
        return fail(f"no experiment {experiment_id} in {store.safe_url}; `draftlab list` shows the ids")
    return None
