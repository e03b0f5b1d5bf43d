"""Advice worded for the browser. The verdict and the findings (storage/) are written once for the CLI and the
pages, and name a setting by its command-line flag ("rerun with more --repeats"); in the dashboard the same advice
names the form field first and the flag second: "more repeats (the New experiment form's Repeats field, or
--repeats on the command line)". Only flags of an experiment's settings and swept variables (engine/variables.py,
those with a form field) are rewritten; any other flag (a serving engine's) is left as written."""
from __future__ import annotations

import re

from engine.variables import SETTINGS, VARIABLES

_FLAG = re.compile(r"--([a-z][a-z-]*)(?: \((\d+)\))?")


def _field(name: str) -> str | None:
    described = SETTINGS.get(name) or VARIABLES.get(name)
    return described.title if described is not None and described.title else None


def browser_advice(text: str) -> str:
    """`text` with each experiment flag (`--repeats`, `--repeats (6)`) given as the New experiment form's field
    first and the flag second."""
    def reworded(match: re.Match) -> str:
        flag, value = match.group(1), match.group(2)
        title = _field(flag.replace("-", "_"))
        if title is None:
            return match.group(0)
        said = f"{value}: " if value else ""
        cli = f"--{flag} {value}" if value else f"--{flag}"
        return f"{title.lower()} ({said}the New experiment form's {title} field, or {cli} on the command line)"

    return _FLAG.sub(reworded, text)
