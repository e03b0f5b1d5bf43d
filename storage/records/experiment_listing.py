"""The experiments as the listing and an experiment's pages read them, one row or dict per experiment.

experiment_rows (every experiment, newest first, with its status and progress; storage/analysis/catalog.py adds each
one's best run), experiment (one experiment's fields, its sampling as a dict), its grid's batch sizes (grid_sizes),
its `--k auto` curves (predicted_curves) and the validation experiments' links (validation_links).
"""

from __future__ import annotations

import json

import pandas as pd
from sqlalchemy import select, text

from storage.db import schema
from storage.db.store import Store
from storage.records.frames import _frame

_EXPERIMENTS_SQL = """
WITH stats AS (
    SELECT experiment_id,
           SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END) AS n_running,
           SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END) AS n_queued,
           SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS n_failed,
           SUM(CASE WHEN status = 'interrupted' THEN 1 ELSE 0 END) AS n_interrupted,
           SUM(CASE WHEN status = 'cancelled' THEN 1 ELSE 0 END) AS n_cancelled,
           SUM(CASE WHEN status = 'done' THEN 1.0 ELSE progress END) / COUNT(*) AS progress
    FROM runs GROUP BY experiment_id),
warned AS (  -- as runs() shows them: a failed or cancelled baseline leaves no speedup to warn about
    SELECT s.experiment_id, COUNT(*) AS n_warnings FROM runs s JOIN runs b ON b.id = s.baseline_run_id
    WHERE s.timing_warning IS NOT NULL AND b.status NOT IN ('failed', 'cancelled') GROUP BY s.experiment_id),
listed AS (
    SELECT e.id AS experiment_id, e.name, e.created, e.target, e.draft, e.prompts, e.sweep_variable, e.sweep_values,
           CASE WHEN st.n_running > 0 THEN 'running' WHEN st.n_queued > 0 THEN 'queued'
                WHEN st.n_failed > 0 THEN 'failed' WHEN st.n_interrupted > 0 THEN 'interrupted'
                WHEN st.n_cancelled > 0 THEN 'cancelled' ELSE 'done' END AS status,
           CAST(COALESCE(st.progress, 0) AS DOUBLE PRECISION) AS progress,
           e.tags, e.notes, COALESCE(warned.n_warnings, 0) AS timing_warnings, e.repeats,
           e.validates, (SELECT MAX(v.id) FROM experiments v WHERE v.validates = e.id) AS validated_by,
           e.batch_sizes
    FROM experiments e
    LEFT JOIN stats st ON st.experiment_id = e.id
    LEFT JOIN warned ON warned.experiment_id = e.id
    WHERE {experiment_filter})
SELECT * FROM listed WHERE {status_filter} ORDER BY experiment_id DESC
"""


# The listing's own columns (storage/analysis/catalog.py adds the best run's, from each experiment's verdict).
EXPERIMENT_ROW_COLUMNS = [
    "experiment_id",
    "name",
    "created",
    "target",
    "draft",
    "prompts",
    "sweep_variable",
    "sweep_values",
    "status",
    "progress",
    "tags",
    "notes",
    "timing_warnings",
    "repeats",
    "validates",
    "validated_by",
    "batch_sizes",
]


def experiment_rows(
    store: Store, tag: str | None = None, model: str | None = None, status: str | None = None
) -> pd.DataFrame:
    """All experiments, newest first, with their status and progress (storage/analysis/catalog.py's `experiments` adds
    the best run, from the verdict)."""
    # Filters are added only when given: PostgreSQL cannot type a bare `:param IS NULL`.
    conditions = ["1 = 1"]
    if tag:
        conditions.append("(',' || e.tags || ',') LIKE ('%,' || :tag || ',%')")
    if model:
        conditions.append("(e.target = :model OR e.draft = :model)")
    sql = _EXPERIMENTS_SQL.format(
        experiment_filter=" AND ".join(conditions), status_filter="status = :status" if status else "1 = 1"
    )
    params = {key: value for key, value in (("tag", tag), ("model", model), ("status", status)) if value}
    with store.read() as conn:
        df = _frame(conn, sql, params, EXPERIMENT_ROW_COLUMNS)
    df["sweep_values"] = [json.loads(v) for v in df["sweep_values"]]
    df["batch_sizes"] = [grid_sizes({"batch_sizes": v}) for v in df["batch_sizes"]]  # a grid's, else None
    return df


def experiment(store: Store, experiment_id: int) -> dict | None:
    """One experiment's fields, its sampling config as a dict, tags as a list, sweep_values as a list."""
    with store.read() as conn:
        row = (
            conn.execute(select(schema.experiments).where(schema.experiments.c.id == experiment_id)).mappings().first()
        )
        if row is None:
            return None
        prompt_count = conn.execute(
            text("SELECT COUNT(*) FROM experiment_prompts WHERE experiment_id = :eid"), {"eid": experiment_id}
        ).scalar()
    d = dict(row)
    d["experiment_id"] = d.pop("id")
    d["sweep_values"] = json.loads(d["sweep_values"])
    d["tag_list"] = [t for t in d["tags"].split(",") if t]
    d["sampling"] = {key: d[key] for key in ("temperature", "top_k", "top_p", "seed", "max_new_tokens")}
    d["prompt_count"] = prompt_count or None  # known once the first run has loaded the prompt set
    d["predicted_curve"] = json.loads(d["predicted_curve"]) if d.get("predicted_curve") else None
    return d


def grid_sizes(experiment: dict) -> list[int] | None:
    """A grid experiment's batch sizes (its outer axis), None for a sweep at one batch size."""
    raw = experiment.get("batch_sizes")
    if raw is None or (isinstance(raw, float) and raw != raw):
        return None
    sizes = json.loads(raw) if isinstance(raw, str) else list(raw)
    return [int(v) for v in sizes] or None


def predicted_curves(experiment: dict) -> dict[int, tuple[dict[int, float], list[int]]]:
    """{batch size: (predicted curve {k: speedup}, confirmed k values)} of a `--k auto` experiment
    (storage.records.queries.experiment's dict); a curve stored without batch sizes is the experiment's batch size's.
    Empty before."""
    auto = experiment.get("predicted_curve") or {}
    if isinstance(auto, str):
        auto = json.loads(auto)
    if not auto:
        return {}

    def parsed(entry):
        return {int(k): float(v) for k, v in (entry.get("curve") or {}).items()}, [
            int(k) for k in entry.get("confirmed") or []
        ]

    if auto.get("by_batch_size"):
        return {int(b): parsed(entry) for b, entry in auto["by_batch_size"].items()}
    return {int(experiment.get("batch_size") or 1): parsed(auto)}


def validation_links(store: Store) -> pd.DataFrame:
    """experiment_id, validates: every validation experiment and the tuning experiment it validates."""
    with store.read() as conn:
        df = _frame(
            conn, "SELECT id AS experiment_id, validates FROM experiments WHERE validates IS NOT NULL ORDER BY id"
        )
    return df
