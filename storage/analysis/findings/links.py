"""A finding's next step as a link: its prefill (the New-experiment form's fields, or another page's) as a relative
URL, the query parameters pages/widgets/prefill.py parses back into the form."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

NEW_PAGE = "new"  # pages/widgets/nav.py's URL path of the New-experiment page
DISTILL_PAGE = "train"  # pages/widgets/nav.py's Train-a-draft page: `focus_from` preselects the experiment to focus on


def prefill_query(prefill: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(page URL path, query parameters as strings) of a finding's prefill."""
    page = str(prefill.get("page") or NEW_PAGE)
    return page, {key: _param(value) for key, value in prefill.items() if key != "page" and value is not None}


def prefill_url(prefill: dict[str, Any]) -> str:
    """A relative URL (`new?target=...&sweep=k&values=1%2C2`) that opens the page with the form prefilled; relative,
    so it works under any base URL path."""
    page, params = prefill_query(prefill)
    return f"{page}?{urlencode(params)}" if params else page


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)
