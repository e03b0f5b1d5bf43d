"""The page registry: every page's key (also its URL path), title and icon, and the `st.Page` a link points at.

The routing (app/main.py, the entry script) builds one `st.Page` per key from the page modules and registers them
here every run; a page links to another by key (`page(key)`) without importing it: pages link to each other both
ways, so importing the target would make the page modules one import cycle. Each key's `st.Page` is the same in
every session (same render, title, icon and path), so one registry serves the whole process.
"""

from __future__ import annotations

import streamlit as st

# key -> (title, icon); the key is also the URL path.
PAGES = {
    "new": ("New experiment", ":material/add_circle:"),
    "experiments": ("Experiments", ":material/list:"),
    "experiment": ("Experiment detail", ":material/monitoring:"),
    "rounds": ("Round explorer", ":material/token:"),
    "compare": ("Compare", ":material/compare_arrows:"),
    "train": ("Train a draft", ":material/model_training:"),
    "theory": ("Theory", ":material/functions:"),
}
DEFAULT = "experiments"
ROOT = "start"  # the hidden root page's reserved path (Streamlit serves it at "/")

_routed: dict[str, st.Page] = {}  # key -> the st.Page the routing registered


def register(pages: dict[str, st.Page]) -> None:
    """Called by the routing with the pages it hands st.navigation, before any page runs."""
    _routed.update(pages)


def page(key: str) -> st.Page:
    """The registered page at `key`, for st.page_link and st.switch_page."""
    if key not in _routed:
        raise LookupError(
            f"no page routed at {key!r}: the routing (app/main.py all_pages) registers every page "
            f"before one runs; a test that draws a page alone calls all_pages() first"
        )
    return _routed[key]
