"""Counts in words, one way everywhere: `1 repeat`, `3 repeats`, `1 GPU`, `2 GPUs` (never "1 repeats" or "run(s)").

Plain Python (no torch): the engine, storage, the pages and the CLI all print counts through it.
"""

from __future__ import annotations

IRREGULAR = {"child": "children", "index": "indices", "process": "processes"}


def noun(count: int | float, singular: str, plural_form: str | None = None) -> str:
    """`singular` for a count of exactly 1, else its plural (`plural_form`, an irregular one, or singular + s)."""
    if count == 1:
        return singular
    return plural_form or IRREGULAR.get(singular) or f"{singular}s"


def plural(count: int | float, singular: str, plural_form: str | None = None, thousands: bool = False) -> str:
    """`1 repeat`, `3 repeats`, `0 runs`; `thousands` writes 1,472 rather than 1472."""
    shown = f"{count:,}" if thousands else f"{count}"
    return f"{shown} {noun(count, singular, plural_form)}"
