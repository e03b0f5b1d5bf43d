"""argparse types for the CLI's numbers: ASCII digits only, finite, within the bounds of their one description
(engine/config/variables.py's VARIABLES and SETTINGS, engine/config/limits.py's caps) or of the database columns that
hold them (engine/numbers.DB_INT_MAX). A bad value ends in argparse's one `error:` line, exit 2, before anything is
loaded or stored. Each type carries `accepts(value)`, what tests/test_fuzz_inputs.py holds every parsed value to.

Plain Python (no torch, no database).
"""

from __future__ import annotations

import argparse


def described(setting):
    """An argparse type reading one value of a setting described in engine/config/variables.py (ASCII digits, its
    bounds and limit): a bad value is one `error:` line, before anything is loaded or stored."""

    def parse(text):
        from engine.errors import DraftLabError

        try:
            return setting.parse(text)
        except DraftLabError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__, parse.accepts = setting.name, setting.in_range
    return parse


def whole(low: int, high: int | None = None, what: str = "a whole number", fix: str = ""):
    """An argparse type: a whole number written in ASCII digits, from `low` to `high` (default: the largest every
    database column holds, engine/numbers.DB_INT_MAX)."""
    from engine.numbers import DB_INT_MAX, ascii_int

    top = DB_INT_MAX if high is None else high

    def parse(text):
        value = ascii_int(text)
        if value is None or not low <= value <= top:
            raise argparse.ArgumentTypeError(f"{str(text)[:40]!r} is not {what} from {low} to {top}{fix}")
        return value

    parse.__name__ = what
    parse.accepts = lambda value: isinstance(value, int) and low <= value <= top  # type: ignore[attr-defined]
    return parse


def positive_number(text):
    """An argparse type: a finite number > 0 written in ASCII (3e-4)."""
    from engine.numbers import ascii_float

    value = ascii_float(text)
    if value is None or value <= 0:
        raise argparse.ArgumentTypeError(f"{str(text)[:40]!r} is not a positive number; use e.g. 3e-4")
    return value


positive_number.accepts = lambda value: isinstance(value, float) and 0 < value < float("inf")  # type: ignore[attr-defined]


# Ids: a stored id is at most engine/numbers.DB_INT_MAX (the INTEGER column); a larger one, a sign or a non-ASCII
# digit is refused in one line on every database (SQLite raised OverflowError past 2**63).
ID = whole(1, what="an id (a whole number)", fix="; `draftlab list` shows the ids")
