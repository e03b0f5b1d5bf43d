"""The page registry: one `st.Page` per module of pages/, built fresh each run so any page can be the start page.

Every page has its own path (`/experiments`, `/new`, ...). The root URL is a hidden page that switches to the start
page (the experiments list unless a test starts elsewhere), keeping the query string: Streamlit serves its default
page at the root only, so a visible default page would have no path of its own (`/experiments` answered "page not
found").
"""
from __future__ import annotations

import streamlit as st

# key -> (module, title, icon); the key is also the URL path.
PAGES = {
    "new": ("new_experiment", "New experiment", ":material/add_circle:"),
    "experiments": ("experiments", "Experiments", ":material/list:"),
    "experiment": ("experiment_detail", "Experiment detail", ":material/monitoring:"),
    "rounds": ("round_explorer", "Round explorer", ":material/token:"),
    "compare": ("compare", "Compare", ":material/compare_arrows:"),
    "train": ("train", "Train a draft", ":material/model_training:"),
    "theory": ("theory", "Theory", ":material/functions:"),
}
DEFAULT = "experiments"
ROOT = "start"  # the hidden root page's reserved path (Streamlit serves it at "/")


def page(key: str):
    import importlib

    module, title, icon = PAGES[key]
    render = importlib.import_module(f"pages.{module}").render
    return st.Page(render, title=title, icon=icon, url_path=key)


def all_pages(start: str | None = None) -> list:
    """Every page at its own path, plus the hidden root page that opens `start` (default: the experiments list)."""
    pages = {key: page(key) for key in PAGES}
    target = pages[start or DEFAULT]

    def open_start_page() -> None:
        st.switch_page(target, query_params=st.query_params.to_dict())

    root = st.Page(open_start_page, title=target.title, icon=target.icon, url_path=ROOT, default=True,
                   visibility="hidden")
    return [root, *pages.values()]
