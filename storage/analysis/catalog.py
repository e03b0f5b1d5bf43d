"""The experiments catalog (the listing): each experiment's status and progress (queries.experiment_rows, SQL) with its
best run taken from its verdict (storage/analysis/verdict.py's `verdicts`, one query for all), so the listing, the
detail page's headline, deploy and the CLI name the same best run and the same ties. No torch, no streamlit."""

from __future__ import annotations

from typing import Any

import pandas as pd

from storage.analysis.verdict import verdicts
from storage.db.store import Store
from storage.records import queries as q

# The best run's columns, after the listing's own (storage/records/columns.py's EXPERIMENT table holds their headers).
BEST_COLUMNS = ["best_value", "best_label", "best_speedup", "alpha", "best_ci_lo", "best_ci_hi", "n_tied"]
EXPERIMENT_COLUMNS = [*q.EXPERIMENT_ROW_COLUMNS, *BEST_COLUMNS]


def experiments(
    store: Store, tag: str | None = None, model: str | None = None, status: str | None = None
) -> pd.DataFrame:
    """All experiments, newest first, with their status, progress and the verdict's best run: its sweep_value
    (a draft or drafter sweep: its index) and label, speedup and interval, α, and how many values tie with it."""
    df = q.experiment_rows(store, tag, model, status)
    rows = q.verdict_rows(store)
    judged = verdicts(rows)
    best: dict[str, list[Any]] = {column: [] for column in BEST_COLUMNS}
    by_id = rows.set_index("run_id")
    for eid in df["experiment_id"]:
        v = judged.get(int(eid))
        b = v.best if v is not None else None
        run = by_id.loc[b.run_id] if b is not None else None
        for column, value in (
            ("best_value", run["sweep_value"] if run is not None else None),
            ("best_label", run["sweep_label"] if run is not None else None),
            ("best_speedup", b.speedup if b else None),
            ("alpha", run["alpha"] if run is not None else None),
            ("best_ci_lo", b.ci[0] if b else None),
            ("best_ci_hi", b.ci[1] if b else None),
            ("n_tied", len(v.tied) if v is not None else 0),
        ):
            best[column].append(value)
    for column in BEST_COLUMNS:
        df[column] = best[column]
    for column in ("best_value", "best_speedup", "alpha", "best_ci_lo", "best_ci_hi"):
        df[column] = pd.to_numeric(df[column]).astype(float)
    df["n_tied"] = df["n_tied"].astype(int)
    return df[EXPERIMENT_COLUMNS]
