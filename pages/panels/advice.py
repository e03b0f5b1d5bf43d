"""Advice worded for the browser. The verdict and the findings (storage/) are written once for the CLI and the
pages, and name a setting by its command-line flag ("rerun with more --repeats"); in the dashboard the same advice
names the form field first and the flag second: "more repeats (the New experiment form's Repeats field, or
--repeats on the command line)". Only flags of an experiment's settings and swept variables (engine/config/variables.py,
those with a form field) are rewritten; any other flag (a serving engine's) is left as written. The deploy panel's
notes name its own controls first (`panel_advice`)."""

from __future__ import annotations

import re

from engine.config.variables import SETTINGS, VARIABLES

_FLAG = re.compile(r"--([a-z][a-z-]*)(?: \((\d+)\))?")
# Command-line advice the deploy panel's engines' notes carry (storage/serving/deploy.py), and what the panel itself
# does.
PANEL_ACTIONS = {
    "(`draftlab export --format deploy --with-max-new-tokens` copies the test's)": (
        "(the \"Copy the test's max new tokens\" box above copies the test's; on the command line "
        "`draftlab export --format deploy --with-max-new-tokens`)"
    ),
    "(`--batch-size` / the panel's batch size picks another)": (
        '(the panel\'s "For batch size" picks another; on the command line `--batch-size`)'
    ),
}


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


def panel_advice(text: str) -> str:
    """A deploy note (storage/serving/deploy.py) with the panel's own control named before the command line's flag; the
    serving engines' flags are left as written (they are what to type there)."""
    for cli, browser in PANEL_ACTIONS.items():
        text = text.replace(cli, browser)
    return text
