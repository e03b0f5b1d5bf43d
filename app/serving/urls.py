"""An http(s) address given on the command line (`confirm --server` / `--baseline-server`, `import-metrics
SOURCE`), checked before anything starts or is stored: one line naming the flag, the address and the fix."""

from __future__ import annotations

import urllib.parse

from engine.errors import DraftLabError


def http_url(text: str, flag: str, example: str = "http://gpu-box:8000") -> str:
    """`text` when it is an http(s) URL with a host (and a port that is a number from 0 to 65535), else a
    DraftLabError naming `flag` (urllib's ValueError for a broken address, e.g. 'http://[::1', never escapes)."""
    shown = repr(text[:80])
    fix = f"give the server's http(s) address, e.g. {example}"
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError as exc:
        raise DraftLabError(f"{flag} {shown} is not a valid URL ({exc}); {fix}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DraftLabError(f"{flag} {shown} is not an http(s) URL with a host; {fix}")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise DraftLabError(f"{flag} {shown} holds spaces or control characters; {fix}")
    return text
