"""The page registry: one `st.Page` per module of pages/, built fresh each run so any page can be the start page."""
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


def page(key: str, default: bool = False):
    import importlib

    module, title, icon = PAGES[key]
    render = importlib.import_module(f"pages.{module}").render
    return st.Page(render, title=title, icon=icon, url_path=key, default=default)


def all_pages(start: str | None = None) -> list:
    start = start or DEFAULT
    return [page(key, default=key == start) for key in PAGES]
