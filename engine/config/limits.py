"""Bounds on the work one experiment may ask for: documented defaults, each settable by whoever runs DraftLab
through $DRAFTLAB_LIMIT_<NAME> (e.g. DRAFTLAB_LIMIT_PROMPTS=5000). The CLI, the dashboard's form and uploads, the
prompt-file loaders and the queue all read them here, so one input gets one answer everywhere.

    limit("prompts") -> 2000

Plain Python (no torch): storage and pages import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.errors import DraftLabError
from engine.numbers import ascii_int

ENV_PREFIX = "DRAFTLAB_LIMIT_"


@dataclass(frozen=True)
class Limit:
    name: str
    default: int
    meaning: str  # what is counted, for messages: "prompts per experiment"

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


LIMITS: dict[str, Limit] = {
    item.name: item
    for item in (
        Limit("prompts", 2000, "prompts per experiment (or per prompt file)"),
        Limit("prompt_file_mb", 20, "megabytes per prompt file or upload"),
        Limit("prompt_chars", 100_000, "characters per prompt"),
        Limit("metrics_mb", 10, "megabytes per metrics scrape (draftlab import-metrics)"),
        Limit("repeats", 100, "timed decodes per prompt and configuration (--repeats)"),
        Limit("max_new_tokens", 4096, "new tokens per prompt (--max-new-tokens)"),
        Limit("swept_values", 64, "swept values per experiment"),
        Limit("upload_days", 30, "days an uploaded prompt file is kept (unless an unfinished training job reads it)"),
        Limit(
            "queued_runs", 1000, "queued runs per launcher (experiments, training jobs and confirms not yet finished)"
        ),
    )
}


def limit(name: str) -> int:
    """The bound `name` in force: $DRAFTLAB_LIMIT_<NAME> when set (a whole number >= 1), else its default."""
    item = LIMITS[name]
    raw = os.environ.get(item.env, "").strip()
    if not raw:
        return item.default
    value = ascii_int(raw)
    if value is None or value < 1:
        raise DraftLabError(
            f"${item.env} must be a whole number >= 1 (got {raw[:40]!r}); unset it for the default "
            f"{item.default} {item.meaning}"
        )
    return value


def check_all() -> None:
    """Every $DRAFTLAB_LIMIT_<NAME> that is set holds a valid bound (a DraftLabError names the first that does
    not): checked once up front, so a typo in one is reported before anything is queued."""
    for name in LIMITS:
        limit(name)


def over(name: str, count: int, what: str) -> str:
    """The one-line refusal of `count` beyond the bound `name`: names the bound and how to raise it."""
    item = LIMITS[name]
    return (
        f"{what} has {count} {item.meaning.split(' (')[0]}, more than the limit of {limit(name)}: use fewer, "
        f"or raise it with {item.env}"
    )
