"""How fast a target decodes alone, read from its finished target-only runs (the New-experiment page's estimate).
target_speed: one target's latest at a batch size; baseline_speeds: every target's, what an estimate for a target
never measured scales from.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import text

from storage.db.store import Store
from storage.records.frames import _frame


def target_speed(store: Store, target: str, batch_size: int | None = None) -> dict | None:
    """The most recent finished target-only run of `target` (at `batch_size` when given: a batch's throughput is
    not one request's): {tokens_per_second, experiment_id, device_name, batch_size}, or None when this target was
    never measured there (the New-experiment page's duration estimate)."""
    at = "AND r.batch_size = :batch" if batch_size is not None else ""
    sql = f"""SELECT r.tokens_per_second, r.experiment_id, r.device_name, r.batch_size FROM runs r
             JOIN experiments e ON e.id = r.experiment_id
             WHERE r.kind = 'baseline' AND r.status = 'done' AND e.target = :target AND r.tokens_per_second > 0 {at}
             ORDER BY r.finished DESC, r.id DESC LIMIT 1"""
    with store.read() as conn:
        row = conn.execute(text(sql), {"target": target, "batch": batch_size}).mappings().first()
    return dict(row) if row is not None else None


def baseline_speeds(store: Store, batch_size: int) -> pd.DataFrame:
    """Each target's most recent finished target-only speed at `batch_size`, newest first: target,
    tokens_per_second, experiment_id, device_name (what an estimate for a target never measured scales from)."""
    sql = """SELECT e.target, r.tokens_per_second, r.experiment_id, r.device_name FROM runs r
             JOIN experiments e ON e.id = r.experiment_id
             WHERE r.kind = 'baseline' AND r.status = 'done' AND r.tokens_per_second > 0 AND r.batch_size = :batch
             ORDER BY r.finished DESC, r.id DESC"""
    with store.read() as conn:
        frame = _frame(conn, sql, {"batch": int(batch_size)})
    return frame.drop_duplicates("target").reset_index(drop=True)
