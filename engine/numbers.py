"""Numbers as users type them: ASCII digits only, finite, one spelling of what the CLI, the form, URL prefill and
drafter specs accept. Python's int() and float() also take '٣', '３', '1_0', 'nan' and 'inf'; these do not.

    ascii_int("4") -> 4        ascii_int("４") -> None
    ascii_float(".5") -> 0.5   ascii_float("nan") -> None

Plain Python (no torch): storage and pages import it.
"""

from __future__ import annotations

import math
import re

# The largest whole number every database column that holds one takes (PostgreSQL's INTEGER; SQLite's are 64-bit):
# seeds and ids beyond it are refused as input, the same on both databases.
DB_INT_MAX = 2**31 - 1

ASCII_SPACE = " \t\r\n\f\v"  # str.strip() alone also removes non-ASCII spaces (U+00A0, U+3000)
_INT = re.compile(r"[+-]?[0-9]{1,19}")
_FLOAT = re.compile(r"[+-]?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][+-]?[0-9]{1,3})?")


def ascii_int(text) -> int | None:
    """An integer written with ASCII digits (a sign and surrounding ASCII spaces allowed), else None."""
    text = str(text).strip(ASCII_SPACE)
    return int(text) if _INT.fullmatch(text) else None


def ascii_float(text) -> float | None:
    """A finite decimal number written with ASCII characters (1, 0.5, .5, 1e-3), else None."""
    text = str(text).strip(ASCII_SPACE)
    if not _FLOAT.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None
