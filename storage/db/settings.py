"""Duration settings read from the environment: the stale window (when a worker counts as gone) and the
parser every such setting shares (a bad value is a QueueError naming the variable and an example)."""

from __future__ import annotations

import os

from storage.db.errors import QueueError

# The stale window: a run whose worker has not heartbeated for this long is taken for dead (by workers,
# `draftlab resume` and `draftlab list`). A worker on this host whose process is gone is dead at once.
STALE_ENV, DEFAULT_STALE_SECONDS = "DRAFTLAB_STALE_SECONDS", 60.0
STALE_HELP = (
    f"a run whose worker has not heartbeated for ${STALE_ENV} seconds (default {DEFAULT_STALE_SECONDS:g}), "
    f"or whose worker process is gone on this host, counts as interrupted"
)


def seconds_setting(env: str, default: float, value: float | None = None, allow_zero: bool = False) -> float:
    """A duration setting: `value` if given, else $env, else `default`; a bad $env is a QueueError naming it."""
    if value is not None:
        return float(value)
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not (seconds >= 0 if allow_zero else seconds > 0) or seconds == float("inf"):
        raise QueueError(
            f"${env} must be a number of seconds {'>=' if allow_zero else '>'} 0 (got {raw!r}); e.g. {env}={default:g}"
        )
    return seconds


def stale_window(value: float | None = None) -> float:
    """The stale window in seconds: `value` if given, else $DRAFTLAB_STALE_SECONDS, else 60."""
    return seconds_setting(STALE_ENV, DEFAULT_STALE_SECONDS, value)
