"""The experiment-detail page's sections: the headline (status, what to serve, the verdict) above a row of tabs, of
which only the open one is built. The open tab is kept in the URL (`?experiment=3&section=Serving`), so a link
opens the named section; the Verdict tab, the default, leaves the URL without one.

    for name, tab in zip(ORDER, tabs()):
        if tab.open:
            with tab: BUILDERS[name](...)

Findings point at charts in other sections (pages/panels/findings_panel.py): `CHART_SECTIONS` says where each chart is,
`open_section` switches to it in place.
"""

from __future__ import annotations

import streamlit as st

KEY = "section"  # the tabs' widget key, which is also the URL's query parameter
VERDICT, REJECTED, PREDICTIONS, SERVING, CONFIRM, RUNS = (
    "Verdict",
    "Why drafts are rejected",
    "Predictions and cost",
    "Serving",
    "Confirm in vLLM",
    "Runs",
)
ORDER = (VERDICT, REJECTED, PREDICTIONS, SERVING, CONFIRM, RUNS)
# A finding's chart key (storage/analysis/findings/base.py CHARTS) -> the section that draws it.
CHART_SECTIONS = {
    "speedup": VERDICT,
    "schedule": VERDICT,
    "predictions": PREDICTIONS,
    "cost": PREDICTIONS,
    "by-position": REJECTED,
    "by-type": REJECTED,
    "runs": RUNS,
    "production": SERVING,
    "confirm": CONFIRM,
    "server": PREDICTIONS,
}


def tabs():
    """The section tabs, bound to `?section=`: each tab's `.open` says whether it is the one shown (the others are
    not built)."""
    return st.tabs(list(ORDER), key=KEY, bind="query-params")


def open_section(name: str) -> None:
    """A button's callback: show section `name` (the tabs follow their widget state; the URL follows the tabs)."""
    st.session_state[KEY] = name


def current() -> str:
    """The section open now (the Verdict before the tabs were drawn)."""
    name = st.session_state.get(KEY)
    return name if name in ORDER else VERDICT
