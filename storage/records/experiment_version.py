"""A cheap stamp of what an experiment's runs hold: what the dashboard caches its query results on.
One aggregate over `runs` (no draft tokens read), with the experiment's labels and its imported production series.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from storage.db.store import Store
from storage.records.frames import F


def experiment_version(store: Store, experiment_id: int | None = None) -> tuple:
    """A cheap stamp of what an experiment's runs hold (all runs when experiment_id is None): it changes whenever a
    run is added, claimed, commits a prompt, beats, finishes, fails or is cancelled, or has its speedup recomputed,
    or a production series is imported, so the dashboard can cache query results per version. One aggregate over
    `runs` (no draft tokens read)."""
    where = "WHERE experiment_id = :eid" if experiment_id is not None else ""
    sql = f"""SELECT COUNT(*), COALESCE(SUM(prompts_done), 0), MAX(heartbeat), MAX(finished), MAX(started),
                     SUM(CASE WHEN status = 'done' THEN 1 ELSE 0 END),
                     SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END),
                     SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END),
                     SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END),
                     SUM(CASE WHEN status = 'cancelled' THEN 1 ELSE 0 END),
                     SUM(CASE WHEN timing_warning IS NULL THEN 0 ELSE 1 END),
                     CAST(COALESCE(SUM(speedup), 0) AS {F}), CAST(COALESCE(SUM(speedup_ci_lo), 0) AS {F}),
                     CAST(COALESCE(SUM(speedup_ci_hi), 0) AS {F}), COALESCE(SUM(rounds), 0)
              FROM runs {where}"""
    with store.read() as conn:
        row = conn.execute(text(sql), {"eid": experiment_id} if experiment_id is not None else {}).one()
        extra: tuple[Any, ...]
        if experiment_id is None:
            extra = tuple(conn.execute(text("SELECT COUNT(*), MAX(id) FROM experiments")).one())
        else:
            labels = conn.execute(
                text("SELECT name, tags, notes, validates, predicted_curve FROM experiments WHERE id = :eid"),
                {"eid": experiment_id},
            ).one_or_none()
            # production series imported later (`draftlab import-metrics`) change the findings too
            extra = (
                *(labels or ()),
                *conn.execute(
                    text("SELECT COUNT(*), MAX(id) FROM production_series WHERE experiment_id = :eid"),
                    {"eid": experiment_id},
                ).one(),
            )
    return tuple(str(v) for v in (*row, *(extra or ())))
