"""JSON-ready values: what every document of storage/serving (the run JSON, the exports, the deploy settings) passes
its figures through, so numpy scalars, NaN and timestamps never reach a JSON encoder. A module of its own, below
the documents that use it, so none of them imports another only for this."""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd


def plain(value):
    """A JSON-ready Python value: numpy scalars unwrapped, NaN/NA as None, timestamps as ISO strings."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, datetime):  # pd.Timestamp included
        return value.isoformat()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
