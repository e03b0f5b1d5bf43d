"""Dashboard entry script (`streamlit run app/main.py`, started by `draftlab ui`): it only routes.

The pages live in the top-level `pages/` package, registered as callables, so Streamlit's legacy `pages/`
auto-discovery (a folder beside the entry script) never kicks in.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app.pair_check import warm_up  # noqa: E402
from pages.nav import all_pages  # noqa: E402


def run(start: str | None = None) -> None:
    """Route to the page in the URL; `start` picks the default page (tests open a page directly this way)."""
    st.set_page_config(page_title="DraftLab", page_icon=":material/science:", layout="wide")
    warm_up()  # the pair check's transformers import, off the first page view
    st.navigation(all_pages(start)).run()


if __name__ == "__main__":
    run()
