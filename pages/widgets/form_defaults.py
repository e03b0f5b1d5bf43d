"""Each New-experiment widget's first value (DEFAULTS) and seed_widget, which puts it into st.session_state: the
form's widgets are created without value=/index=, so a value from a link (pages/widgets/prefill.py) never competes
with a default.
"""

from __future__ import annotations

import streamlit as st

from engine import zoo
from engine.config.run_config import DEFAULTS as RUN_DEFAULTS
from pages.widgets.prefill import (
    DEFAULT_DRAFTER_SWEEP,
    DEFAULT_SWEEP,
    DRAFTER_PARAMETERS,
    DRAFTER_SWEEP_WIDGETS,
    DRAFTER_WIDGETS,
    WIDGETS,
)

DEFAULT_K_AUTO = 8  # k auto's largest k
# Each widget's first value: the page seeds st.session_state with these (or the link's values) and creates the
# widgets without value=/index=, so a value from a link never competes with a default.
DEFAULTS = {
    # every described parameter's field at its default (engine/config/run_config.py), the draft a shipped one
    **{WIDGETS[name]: RUN_DEFAULTS[name] for name in RUN_DEFAULTS if name != "draft"},
    "target": zoo.DEMO_TARGET,
    "draft": zoo.DEMO_DRAFTS[0],
    "prompt_source": "Built-in",
    "device": "auto",
    "dtype": "auto",
    "sweep_variable": "k",
    "sweep_values": DEFAULT_SWEEP,
    "k_auto": DEFAULT_K_AUTO,
    "name": "",
    "tags": "",
    "notes": "",
    "drafter_sweep": DEFAULT_DRAFTER_SWEEP,
    "grid_batch_sizes": "",
    **{DRAFTER_WIDGETS[name]: param.default for name, param in DRAFTER_PARAMETERS.items()},
    **{DRAFTER_SWEEP_WIDGETS[name]: f"{param.default:g}" for name, param in DRAFTER_PARAMETERS.items()},
}


def seed_widget(key: str, default=None) -> None:
    """Give a widget its first value through st.session_state (the widget is then created without one)."""
    if key not in st.session_state:
        st.session_state[key] = DEFAULTS[key] if default is None else default
