"""Bad input to storage (the queue, training jobs, settings): one error type whose message names the problem and
the fix; the CLI and the pages print it as one `error:` line."""

from __future__ import annotations


class QueueError(ValueError):
    """Bad input to the queue: the message names the problem and the fix."""
