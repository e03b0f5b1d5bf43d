"""The one exception type user-facing code turns into a single `error:` line."""


class DraftLabError(Exception):
    """Bad input or environment: the message names the problem and the fix, on one line."""


class RunCancelled(Exception):
    """Raised from a progress callback to stop a run between rounds."""
