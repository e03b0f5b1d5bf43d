"""Read queries for the CLI, exports and dashboard (docs/storage-api.md). Each returns a pandas DataFrame
computed in SQL; metric names and definitions are SPEC.md's and match engine/metrics/metrics_oracle.py.

Run-level figures come from the per-prompt rollups (`prompt_results`), which SQL fills from the rounds and
draft tokens when a prompt commits; the diagnostics (by position, type, token) aggregate `draft_tokens`
through covering indexes. The only Python arithmetic is predicted_speedup: a formula per row, not an
aggregate, taken from engine/metrics/theory.py so it is defined once.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pandas as pd
from sqlalchemy import select, text

from engine.config.drafter_specs import SPECS
from engine.config.run_config import RUN_PARAMETERS
from engine.config.tree_shape import is_tree
from engine.metrics.theory import predicted_speedup as _predicted_speedup
from storage.db import schema
from storage.db.store import Store
from storage.records.columns import COMPUTED, RUN_QUERY

F = "DOUBLE PRECISION"  # float division in both SQLite (REAL affinity) and PostgreSQL

RUN_COLUMNS = RUN_QUERY  # runs()' columns, in order: storage/records/columns.py's table (headers, help, formats too)

# Each run's own settings: every parameter a run stores (engine/config/run_config.py), beside k and batch size
# (metrics).
_SETTINGS = ", ".join(f"r.{name}" for name in RUN_PARAMETERS if name not in ("k", "batch_size"))
# The metrics whose SQL is their storage/records/columns.py entry's, computed over the run `r`.
_COMPUTED = "".join(f",\n       ({c.sql}) AS {c.name}" for c in COMPUTED)


def outputs_match(r: str) -> str:
    """SQL of the run `r`'s outputs_match_baseline, the one definition of a lossless run: NULL unless it is a greedy
    speculative run whose baseline committed prompts; else 1 when every prompt it committed has the baseline's output
    token for token (a finished run: every prompt the baseline has), 0 when not (`lossy`)."""
    return f"CASE WHEN {_compared(r)} THEN CASE WHEN {_differs(r)} THEN 0 ELSE 1 END END"


def lossy(r: str) -> str:
    """SQL: the run `r` is greedy and its outputs are not its baseline's (outputs_match_baseline is 0): never
    judged, scheduled, deployed or confirmed (SPEC "Lossless at every batch size")."""
    return f"({_compared(r)} AND {_differs(r)})"


def _compared(r: str) -> str:
    return (
        f"({r}.kind = 'speculative' AND COALESCE({r}.temperature, 0) <= 0 "
        f"AND EXISTS (SELECT 1 FROM prompt_results bp WHERE bp.run_id = {r}.baseline_run_id))"
    )


def _differs(r: str) -> str:
    return f"""(EXISTS (SELECT 1 FROM prompt_results p LEFT JOIN prompt_results bp
                        ON bp.run_id = {r}.baseline_run_id AND bp.prompt_index = p.prompt_index
                        WHERE p.run_id = {r}.id AND CASE WHEN p.output_ids = bp.output_ids THEN 0 ELSE 1 END = 1)
             OR ({r}.status = 'done' AND (SELECT COUNT(*) FROM prompt_results p WHERE p.run_id = {r}.id)
                 <> (SELECT COUNT(*) FROM prompt_results bp WHERE bp.run_id = {r}.baseline_run_id)))"""


# One row per run with its SPEC metrics; c and speedup against the run's own target-only baseline.
# outputs_match_baseline: NULL unless greedy; while a run is unfinished it compares the prompts committed so far.
_RUNS_SQL = f"""
WITH sel AS (SELECT * FROM runs WHERE {{where}}),
base AS (SELECT b.* FROM runs b WHERE b.id IN (SELECT baseline_run_id FROM sel))
SELECT r.id AS run_id, r.kind, r.k, r.sweep_value, r.status, r.progress, r.error, r.started, r.finished,
       r.new_tokens, r.wall_seconds, r.tokens_per_second, r.rounds, r.proposed, r.accepted, r.rejected,
       r.draft_acceptance_rate, r.alpha, r.tokens_per_round, r.expected_alpha, r.kl, r.draft_step_seconds,
       CASE WHEN r.kind = 'baseline' THEN r.target_step_seconds ELSE b.target_step_seconds END AS target_step_seconds,
       CASE WHEN r.kind = 'speculative' AND b.target_step_seconds > 0
            THEN b.target_step_seconds / NULLIF(r.draft_step_seconds, 0) END AS c,
       CASE WHEN b.status IN ('failed', 'cancelled') THEN NULL ELSE r.speedup END AS speedup,
       CASE WHEN b.status IN ('failed', 'cancelled') THEN NULL ELSE r.speedup_ci_lo END AS speedup_ci_lo,
       CASE WHEN b.status IN ('failed', 'cancelled') THEN NULL ELSE r.speedup_ci_hi END AS speedup_ci_hi,
       CASE WHEN r.kind <> 'speculative' THEN NULL
            WHEN b.status = 'failed' THEN 'no speedup: its baseline failed; resume the experiment to rerun it'
            WHEN b.status = 'cancelled' THEN 'no speedup: its baseline was cancelled; resume the experiment to rerun it'
            WHEN r.status <> 'done' AND r.speedup IS NOT NULL THEN 'in progress: over the prompts finished so far'
       END AS speedup_note,
       CASE WHEN b.status IN ('failed', 'cancelled') THEN NULL ELSE r.timing_warning END AS timing_warning,
       r.verify_cost, r.predicted_speedup_refined, r.batch_size,
       -- SPEC's serving names carry their unit; the columns keep their first names (no migration)
       r.ttft_p50 AS ttft_seconds_p50, r.ttft_p95 AS ttft_seconds_p95, r.itl_p50 AS itl_seconds_p50,
       r.itl_p95 AS itl_seconds_p95, r.latency_p50 AS request_latency_seconds_p50,
       r.latency_p95 AS request_latency_seconds_p95,
       {outputs_match("r")} AS outputs_match_baseline,
       r.peak_memory_mb, r.max_k, r.experiment_id, r.baseline_run_id, r.prompts_done, r.prompts_total,
       {_SETTINGS}, r.created, r.heartbeat, r.worker_id, r.device_name, r.sweep_label, r.draft_parameters,
       CASE WHEN r.kind = 'speculative' THEN r.peak_memory_mb - b.peak_memory_mb END AS extra_memory_mb
       {_COMPUTED}
FROM sel r
LEFT JOIN base b ON b.id = r.baseline_run_id
ORDER BY CASE WHEN r.kind = 'baseline' THEN 0 ELSE 1 END, r.sweep_value, r.id
"""

_DATETIMES = ("created", "started", "finished", "heartbeat")


def _frame(conn, sql: str, params: dict | None = None, columns: list[str] | None = None) -> pd.DataFrame:
    result = conn.execute(text(sql), params or {})
    keys = list(result.keys())
    rows = [tuple(float(v) if isinstance(v, Decimal) else v for v in row) for row in result]
    df = pd.DataFrame.from_records(rows, columns=keys)
    for col in _DATETIMES:
        if col in df.columns:
            df[col] = pd.to_datetime(df[col], format="ISO8601")
    if columns is not None:
        df = df[columns + [c for c in df.columns if c not in columns]]
    return df


def _nullable_int(df: pd.DataFrame, *columns: str) -> None:
    for column in columns:
        if column in df.columns:
            df[column] = df[column].astype("Int64")


def _nullable_bool(df: pd.DataFrame, column: str) -> None:
    df[column] = pd.Series([None if pd.isna(v) else bool(v) for v in df[column]], index=df.index, dtype=object)


def _with_predicted(df: pd.DataFrame) -> pd.DataFrame:
    """predicted_speedup from the measured alpha, the run's largest k and c (engine/metrics/theory.py's formula). The
    formula assumes a constant-k chain: runs whose drafter varies k per round (heuristic, confidence, prompt lookup)
    and token-tree runs (tree_topk > 1: several branches verified per round) get none rather than a number that
    means nothing."""
    constant = [
        (d is None or (isinstance(d, float) and pd.isna(d)) or _constant_k(d)) and not is_tree({"tree_topk": t})
        for d, t in zip(
            df["drafter"] if "drafter" in df else [None] * len(df),
            df["tree_topk"] if "tree_topk" in df else [None] * len(df),
        )
    ]
    df["predicted_speedup"] = [
        _predicted_speedup(a, int(k), c) if ok and pd.notna(a) and pd.notna(c) and c and pd.notna(k) and k else None
        for a, k, c, ok in zip(df["alpha"], df["max_k"], df["c"], constant)
    ]
    df["predicted_speedup"] = df["predicted_speedup"].astype(float)
    for column in ("speedup", "speedup_ci_lo", "speedup_ci_hi", "verify_cost", "predicted_speedup_refined", "c"):
        df[column] = pd.to_numeric(df[column]).astype(float)  # all-NULL columns would come back as objects
    _nullable_bool(df, "outputs_match_baseline")
    _nullable_int(df, "k", "baseline_run_id", "prompts_total")
    return df


def _constant_k(drafter: str) -> bool:
    """Whether a stored drafter spec proposes a constant k (engine/config/drafter_specs.py); an unknown one does not."""
    spec = SPECS.get(str(drafter).partition(":")[0].strip())
    return spec is not None and spec.constant_k


def _runs_where(store: Store, where: str, params: dict) -> pd.DataFrame:
    with store.read() as conn:
        df = _frame(conn, _RUNS_SQL.format(where=where), params)
    return _with_predicted(df)[RUN_COLUMNS + [c for c in df.columns if c not in RUN_COLUMNS]]


def runs(store: Store, experiment_id: int) -> pd.DataFrame:
    """Every run of an experiment (baseline first, then by sweep value) with its SPEC metrics."""
    return _runs_where(store, "experiment_id = :eid", {"eid": experiment_id})


def run_summary(store: Store, run_id: int) -> pd.DataFrame:
    """One run's row, same columns as runs()."""
    return _runs_where(store, "id = :rid", {"rid": run_id})


def sweep_curve(store: Store, experiment_id: int) -> pd.DataFrame:
    """Measured and predicted speedup, alpha and tokens_per_round against the swept value."""
    df = runs(store, experiment_id)
    df = df[df["kind"] == "speculative"]
    cols = [
        "sweep_value",
        "k",
        "speedup",
        "speedup_ci_lo",
        "speedup_ci_hi",
        "predicted_speedup",
        "predicted_speedup_refined",
        "alpha",
        "draft_acceptance_rate",
        "tokens_per_round",
        "c",
        "run_id",
        "status",
        "timing_warning",
        "draws_tree",
    ]
    df = df.assign(draws_tree=[is_tree(row) for _, row in df.iterrows()])  # a token tree: the chain formula's none
    return df[cols].sort_values(["sweep_value", "run_id"]).reset_index(drop=True)


# The one rule of which runs can be chosen as an experiment's best (storage/analysis/verdict.py; the listing, the
# schedule, findings and deploy read the verdict): a speculative run `s` that finished, with its baseline `b` finished,
# a measured speedup with its interval, no timing warning (a run timed faster than its tokens per round allow is never
# crowned), and lossless (a greedy run whose outputs differ from its baseline's, `lossy`, is never chosen). RANK: the
# highest measured speedup first; on equal speedups the smaller swept value, then the older run.
CHOOSABLE = (
    "s.kind = 'speculative' AND s.status = 'done' AND b.status = 'done' AND s.speedup IS NOT NULL "
    "AND s.speedup_ci_lo IS NOT NULL AND s.speedup_ci_hi IS NOT NULL AND s.timing_warning IS NULL "
    f"AND NOT {lossy('s')}"
)
RANK = "s.speedup DESC, s.sweep_value, s.id"

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


def round_costs(store: Store, run_id: int) -> dict:
    """A run's committed totals: rounds, wall, draft and verify seconds (the inputs of the cost model)."""
    sql = """SELECT COALESCE(SUM(rounds), 0) AS rounds, COALESCE(SUM(wall_seconds), 0) AS wall_seconds,
                    COALESCE(SUM(draft_seconds), 0) AS draft_seconds, COALESCE(SUM(verify_seconds), 0) AS verify_seconds
             FROM prompt_results WHERE run_id = :rid"""
    with store.read() as conn:
        row = conn.execute(text(sql), {"rid": run_id}).mappings().one()
    return {key: float(value) for key, value in row.items()}


_BATCH_OF = "{t}.prompt_index / COALESCE(NULLIF(r.batch_size, 0), 1)"


def batch_round_costs(store: Store, run_id: int) -> dict:
    """A run's costs counted per batch round (rows of a batch share every round's forwards, so each of its rows
    stores the batch round's draft and verify seconds: read once per batch round; at batch size 1 a batch is a
    prompt): batches, batch rounds, their draft and verify seconds, the first rounds' (which carry the
    prefill), and the batches' wall seconds (each its longest row's)."""
    rounds_of = _BATCH_OF.format(t="rd")
    walls_of = _BATCH_OF.format(t="pr")
    sql = f"""
    WITH br AS (SELECT {rounds_of} AS batch, rd.round_index, MAX(rd.draft_seconds) AS draft,
                       MAX(rd.verify_seconds) AS verify
                FROM rounds rd JOIN runs r ON r.id = rd.run_id WHERE rd.run_id = :rid
                GROUP BY {rounds_of}, rd.round_index),
         bw AS (SELECT {walls_of} AS batch, MAX(pr.wall_seconds) AS wall
                FROM prompt_results pr JOIN runs r ON r.id = pr.run_id WHERE pr.run_id = :rid GROUP BY {walls_of})
    SELECT (SELECT COUNT(*) FROM bw) AS batches, (SELECT COUNT(*) FROM br) AS rounds,
           (SELECT COALESCE(SUM(draft), 0) FROM br) AS draft_seconds,
           (SELECT COALESCE(SUM(verify), 0) FROM br) AS verify_seconds,
           (SELECT COALESCE(SUM(verify), 0) FROM br WHERE round_index = 0) AS first_verify_seconds,
           (SELECT COALESCE(SUM(wall), 0) FROM bw) AS wall_seconds"""
    with store.read() as conn:
        row = conn.execute(text(sql), {"rid": run_id}).mappings().one()
    return {key: float(value or 0) for key, value in row.items()}


def acceptance_by_prompt_position(store: Store, run_id: int) -> pd.DataFrame:
    """Per prompt and draft position: verified (reached) and accepted drafts, and the prompt's new tokens."""
    sql = """
    SELECT t.prompt_index, t.position,
           SUM(CASE WHEN t.outcome <> 'discarded' THEN 1 ELSE 0 END) AS reached,
           SUM(CASE WHEN t.outcome = 'accepted' THEN 1 ELSE 0 END) AS accepted
    FROM draft_tokens t WHERE t.run_id = :rid GROUP BY t.prompt_index, t.position ORDER BY t.prompt_index, t.position"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


def prompt_tokens(store: Store, run_id: int) -> dict[int, int]:
    """Each committed prompt's new tokens."""
    with store.read() as conn:
        return {
            int(i): int(n)
            for i, n in conn.execute(
                text("SELECT prompt_index, new_tokens FROM prompt_results WHERE run_id = :rid ORDER BY prompt_index"),
                {"rid": run_id},
            )
        }


def timings(store: Store, run_id: int) -> pd.DataFrame:
    """Every timed decode of a run: prompt_index, repeat, slot (place in the prompt's interleaved order),
    new_tokens, wall_seconds, draft_seconds, verify_seconds, decode_seconds, decode_steps."""
    sql = """SELECT prompt_index, repeat, slot, new_tokens, wall_seconds, draft_seconds, verify_seconds,
                    decode_seconds, decode_steps FROM timings WHERE run_id = :rid ORDER BY prompt_index, repeat"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


_VERDICT_ROWS_SQL = f"""
SELECT s.id AS run_id, s.experiment_id, s.kind, s.status, s.k, s.sweep_value, s.sweep_label, s.draft_parameters,
       s.device_name, s.batch_size, s.alpha, s.speedup, s.speedup_ci_lo, s.speedup_ci_hi,
       CASE WHEN {CHOOSABLE} THEN 1 ELSE 0 END AS choosable, {outputs_match("s")} AS outputs_match_baseline,
       e.sweep_variable, e.batch_sizes, e.dtype
FROM runs s LEFT JOIN runs b ON b.id = s.baseline_run_id JOIN experiments e ON e.id = s.experiment_id
WHERE s.kind = 'speculative' AND {{where}}
ORDER BY s.experiment_id, CASE WHEN {CHOOSABLE} THEN 0 ELSE 1 END, {RANK}"""


def verdict_rows(store: Store, experiment_id: int | None = None) -> pd.DataFrame:
    """What verdicts judge, of one experiment or of all (the listing: one query): every speculative run with its
    swept value, cost inputs (the draft's parameters, the device and the experiment's dtype: a draft_dtype of "same"
    costs that dtype's bytes), speedup and interval, `choosable` (CHOOSABLE), outputs_match_baseline (as runs()) and
    the experiment's sweep_variable and batch_sizes; per experiment the choosable runs come first, best first
    (RANK)."""
    where, params = ("s.experiment_id = :eid", {"eid": experiment_id}) if experiment_id is not None else ("1 = 1", {})
    with store.read() as conn:
        df = _frame(conn, _VERDICT_ROWS_SQL.format(where=where), params)
    for column in ("speedup", "speedup_ci_lo", "speedup_ci_hi", "alpha"):
        df[column] = pd.to_numeric(df[column]).astype(float)
    _nullable_bool(df, "outputs_match_baseline")
    return df


def choosable(store: Store, experiment_id: int) -> list[int]:
    """The ids of the runs a verdict may choose from (CHOOSABLE), best first (RANK): storage/analysis/verdict.py reads
    them."""
    sql = f"""SELECT s.id FROM runs s JOIN runs b ON b.id = s.baseline_run_id
              WHERE s.experiment_id = :eid AND {CHOOSABLE} ORDER BY {RANK}"""
    with store.read() as conn:
        return [int(rid) for (rid,) in conn.execute(text(sql), {"eid": experiment_id})]


def acceptance_by_position(store: Store, run_id: int) -> pd.DataFrame:
    """Per draft position 1..k: verified (reached), accepted, accepted/reached and accepted/rounds."""
    sql = f"""
    SELECT position,
           SUM(CASE WHEN outcome <> 'discarded' THEN 1 ELSE 0 END) AS reached,
           SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS accepted,
           CAST(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS {F})
               / NULLIF(SUM(CASE WHEN outcome <> 'discarded' THEN 1 ELSE 0 END), 0) AS conditional,
           CAST(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS {F})
               / NULLIF((SELECT rounds FROM runs WHERE id = :rid), 0) AS unconditional
    FROM draft_tokens WHERE run_id = :rid GROUP BY position ORDER BY position"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


def acceptance_by_type(store: Store, run_id: int) -> pd.DataFrame:
    """Per token type (SPEC's table): verified draft tokens, accepted, and the acceptance rate; `outside_vocab`: the
    rejections a draft with another vocabulary could not have avoided (the target's token lies outside the vocabulary
    both share; 0 with one tokenizer)."""
    sql = f"""
    SELECT token_type, COUNT(*) AS verified,
           SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS accepted,
           CAST(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS {F}) / COUNT(*) AS rate,
           SUM(CASE WHEN outside_vocab = 1 THEN 1 ELSE 0 END) AS outside_vocab
    FROM draft_tokens WHERE run_id = :rid AND outcome <> 'discarded'
    GROUP BY token_type ORDER BY token_type"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


def top_rejected_tokens(store: Store, run_id: int, limit: int = 20) -> pd.DataFrame:
    """The draft tokens the target refused most often: count, times verified, and rejection rate."""
    sql = f"""
    WITH counted AS (
        SELECT token_id, SUM(CASE WHEN outcome = 'rejected' THEN 1 ELSE 0 END) AS rejected, COUNT(*) AS verified
        FROM draft_tokens WHERE run_id = :rid AND outcome <> 'discarded' GROUP BY token_id),
    top AS (SELECT * FROM counted WHERE rejected > 0 ORDER BY rejected DESC, token_id LIMIT :limit)
    SELECT top.token_id,
           (SELECT d.text FROM draft_tokens d WHERE d.run_id = :rid AND d.token_id = top.token_id LIMIT 1) AS text,
           (SELECT d.token_type FROM draft_tokens d WHERE d.run_id = :rid AND d.token_id = top.token_id LIMIT 1)
             AS token_type,
           top.rejected, top.verified, CAST(top.rejected AS {F}) / top.verified AS rejection_rate
    FROM top ORDER BY top.rejected DESC, top.token_id"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id, "limit": int(limit)})


def per_prompt(store: Store, run_id: int) -> pd.DataFrame:
    """One row per committed prompt: throughput, rounds, acceptance, and whether it matches the baseline."""
    sql = f"""
    SELECT p.prompt_index, p.prompt, p.new_tokens, p.wall_seconds,
           CAST(p.new_tokens AS {F}) / NULLIF(p.wall_seconds, 0) AS tokens_per_second,
           p.rounds, p.accepted, p.rejected,
           CAST(p.accepted AS {F}) / NULLIF(p.accepted + p.rejected, 0) AS alpha,
           CAST(p.emitted AS {F}) / NULLIF(p.rounds, 0) AS tokens_per_round,
           CASE WHEN r.kind <> 'speculative' OR r.temperature > 0 OR bp.run_id IS NULL THEN NULL
                WHEN p.output_ids = bp.output_ids THEN 1 ELSE 0 END AS matches_baseline,
           p.proposed, p.verified, CAST(p.beta_sum AS {F}) / NULLIF(p.verified, 0) AS expected_alpha, p.text
    FROM prompt_results p
    JOIN runs r ON r.id = p.run_id
    LEFT JOIN prompt_results bp ON bp.run_id = r.baseline_run_id AND bp.prompt_index = p.prompt_index
    WHERE p.run_id = :rid ORDER BY p.prompt_index"""
    with store.read() as conn:
        df = _frame(conn, sql, {"rid": run_id})
    _nullable_bool(df, "matches_baseline")
    return df


def prompt_output(store: Store, run_id: int, prompt_index: int) -> pd.DataFrame:
    """The tokens a run emitted for one prompt, in order, with the round and kind that emitted each
    (kind 'first' = the target's prefill token, 'target' = a baseline token)."""
    sql = """SELECT position, token_id, text, kind, round_index FROM output_tokens
             WHERE run_id = :rid AND prompt_index = :pi ORDER BY position"""
    with store.read() as conn:
        df = _frame(conn, sql, {"rid": run_id, "pi": prompt_index})
    _nullable_int(df, "round_index")
    return df


def round_proposals(store: Store, run_id: int, prompt_index: int, round_index: int) -> pd.DataFrame:
    """The k draft tokens of one round, with both models' probabilities and the outcome; a token tree's round: the
    path verification walked, one per depth, each node's sibling_rank (0 = the draft's top-1; null for chains)."""
    sql = """SELECT position, token_id, text, token_type, p_draft, p_target, beta, kl, outcome, sibling_rank
             FROM draft_tokens
             WHERE run_id = :rid AND prompt_index = :pi AND round_index = :ri ORDER BY position"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id, "pi": prompt_index, "ri": round_index})


def outputs(store: Store, run_id: int) -> pd.DataFrame:
    """prompt_index, token_ids (list), text per committed prompt: the `outputs` of the run JSON."""
    with store.read() as conn:
        df = _frame(
            conn,
            "SELECT prompt_index, output_ids, text FROM prompt_results WHERE run_id = :rid ORDER BY prompt_index",
            {"rid": run_id},
        )
    df["token_ids"] = [json.loads(v) for v in df.pop("output_ids")]
    return df[["prompt_index", "token_ids", "text"]]


def draft_token_rows(store: Store, experiment_id: int) -> pd.DataFrame:
    """Every draft token of an experiment's runs, with the run's k (for exports); token trees: its `depth` (= position,
    one row per depth) and `sibling_rank` (0 = the draft's top-1; null for chains)."""
    sql = """SELECT d.run_id, r.k, d.prompt_index, d.round_index, d.position, d.token_id, d.text, d.token_type,
                    d.p_draft, d.p_target, d.beta, d.kl, d.outcome, d.position AS depth, d.sibling_rank
             FROM draft_tokens d JOIN runs r ON r.id = d.run_id
             WHERE r.experiment_id = :eid ORDER BY d.run_id, d.prompt_index, d.round_index, d.position"""
    with store.read() as conn:
        return _frame(conn, sql, {"eid": experiment_id})


def device_leases(store: Store, max_age_seconds: float = 30) -> pd.DataFrame:
    """Who times on which device (one timed job per device): a row per device that is leased or waited for, and per
    worker waiting for it. device; worker_id, experiment_id, acquired, heartbeat: the lease's holder, what it
    times, since when, its last beat (NULL when nobody holds the device); waiting_worker: a worker whose
    `waiting_for` names the device (NULL when none waits). Waiting workers silent for max_age_seconds are left out."""
    sql = """
    WITH devices AS (SELECT device FROM device_leases
                     UNION SELECT waiting_for FROM workers WHERE waiting_for IS NOT NULL AND heartbeat >= :cutoff)
    SELECT d.device, l.worker_id, l.experiment_id, l.acquired, l.heartbeat, w.id AS waiting_worker
    FROM devices d
    LEFT JOIN device_leases l ON l.device = d.device
    LEFT JOIN workers w ON w.waiting_for = d.device AND w.heartbeat >= :cutoff
    ORDER BY d.device, w.id"""
    from datetime import timedelta

    from storage.db.schema import utcnow

    with store.read() as conn:
        df = _frame(conn, sql, {"cutoff": utcnow() - timedelta(seconds=max_age_seconds)})
    df["acquired"] = pd.to_datetime(df["acquired"], format="ISO8601")
    _nullable_int(df, "experiment_id")
    return df


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


def validation_links(store: Store) -> pd.DataFrame:
    """experiment_id, validates: every validation experiment and the tuning experiment it validates."""
    with store.read() as conn:
        df = _frame(
            conn, "SELECT id AS experiment_id, validates FROM experiments WHERE validates IS NOT NULL ORDER BY id"
        )
    return df


def k_distribution(store: Store, run_id: int) -> pd.DataFrame:
    """How many rounds drafted each k_r (a heuristic or confidence drafter varies it per round): k, rounds, share."""
    sql = f"""SELECT k, COUNT(*) AS rounds,
                     CAST(COUNT(*) AS {F}) / (SELECT COUNT(*) FROM rounds WHERE run_id = :rid) AS share
              FROM rounds WHERE run_id = :rid GROUP BY k ORDER BY k"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


WORKER_HEALTH_COLUMNS = [
    "worker_id",
    "host",
    "pid",
    "device",
    "status",
    "experiment_id",
    "runs",
    "progress",
    "waiting_for",
    "heartbeat_age_s",
    "started",
]


def worker_health(store: Store, stale_seconds: float | None = None) -> dict:
    """The workers' state for the dashboard. Returns {"workers": DataFrame, "queued_runs", "queued_experiments",
    "running_runs": int}; one row per registered worker (WORKER_HEALTH_COLUMNS): device: its pinned device
    (`...@cuda:1`, see `draftlab worker --devices`), else the lease it holds, else None; status: stale (no
    heartbeat for the stale window, or its process gone on this host: the next sweep takes its runs for
    interrupted), timing (runs in progress), training (job N) (a Train-a-draft job), waiting (for a device lease)
    or idle; experiment_id, runs,
    progress: what it times (the mean progress of its running runs); heartbeat_age_s: seconds since its last beat."""
    from datetime import timedelta

    from storage.db.schema import utcnow
    from storage.db.settings import stale_window
    from storage.records import workers as liveness

    seconds = stale_window(stale_seconds)
    now = utcnow()
    with store.read() as conn:
        rows = conn.execute(select(schema.workers)).mappings().all()
        dead = set(liveness.dead_workers(conn, now - timedelta(seconds=seconds)))
        leases: dict[str, str] = dict(conn.execute(text("SELECT worker_id, device FROM device_leases")).all())
        running = (
            conn.execute(
                text(f"""SELECT worker_id, MIN(experiment_id) AS experiment_id, COUNT(*) AS runs,
                                               AVG(CAST(progress AS {F})) AS progress
                                        FROM runs WHERE status = 'running' GROUP BY worker_id""")
            )
            .mappings()
            .all()
        )
        queued = conn.execute(
            text("SELECT COUNT(*), COUNT(DISTINCT experiment_id) FROM runs WHERE status = 'queued'")
        ).one()
        training: dict[str, int] = dict(
            conn.execute(
                text("SELECT worker_id, MIN(id) FROM training_jobs WHERE status = 'running' GROUP BY worker_id")
            ).all()
        )
        queued_jobs = conn.execute(text("SELECT COUNT(*) FROM training_jobs WHERE status = 'queued'")).scalar()
    busy = {r["worker_id"]: r for r in running}
    out = []
    for w in sorted(rows, key=lambda r: r["id"]):
        timing = busy.get(w["id"])
        device = w["id"].rsplit("@", 1)[1] if "@" in w["id"] else None
        lease = leases.get(w["id"])
        job = training.get(w["id"])
        status = (
            "stale"
            if w["id"] in dead
            else "timing"
            if timing
            else f"training (job {job})"
            if job is not None
            else "waiting"
            if w["waiting_for"]
            else "idle"
        )
        out.append(
            {
                "worker_id": w["id"],
                "host": (w["host"] or "").split("#")[0],
                "pid": w["pid"],
                "device": device or (lease.split(":", 1)[1] if lease and ":" in lease else lease),
                "status": status,
                "experiment_id": timing["experiment_id"] if timing else None,
                "runs": int(timing["runs"]) if timing else 0,
                "progress": float(timing["progress"]) if timing and timing["progress"] is not None else None,
                "waiting_for": w["waiting_for"],
                "heartbeat_age_s": (now - w["heartbeat"]).total_seconds() if w["heartbeat"] else None,
                "started": w["started"],
            }
        )
    frame = pd.DataFrame(out, columns=WORKER_HEALTH_COLUMNS)
    _nullable_int(frame, "experiment_id")
    return {
        "workers": frame,
        "queued_runs": int(queued[0]),
        "queued_experiments": int(queued[1]),
        "queued_training_jobs": int(queued_jobs or 0),
        "running_runs": sum(int(r["runs"]) for r in running),
    }


# --- reads for the analysis (storage/analysis/: the verdict, formula, findings and validation compute from these) ---

_POOLED_SQL = """
SELECT COUNT(*) AS runs, SUM(r.accepted) AS accepted, SUM(r.accepted + r.rejected) AS verified,
       AVG(b.target_step_seconds / r.draft_step_seconds) AS c
FROM runs r JOIN runs b ON b.id = r.baseline_run_id
WHERE r.experiment_id = :eid AND r.kind = 'speculative' AND r.status = 'done'
  AND (r.drafter IS NULL OR r.drafter IN ({drafters}))
  AND b.status = 'done' AND b.target_step_seconds > 0 AND r.draft_step_seconds > 0
  AND r.accepted IS NOT NULL AND r.rejected IS NOT NULL AND COALESCE(r.tree_topk, 1) <= 1{at_batch}"""


def pooled_runs(
    store: Store, experiment_id: int, drafters: tuple[str, ...], batch_size: int | None = None
) -> dict | None:
    """runs, accepted (Σ), verified (Σ accepted + rejected) and c (the mean of target step / draft step, each run
    against its own baseline) over the experiment's finished speculative runs drafted by one of `drafters` (or no
    drafter recorded) with a measured c, chains only (the formula does not model token trees); batch_size: only that
    batch size's runs. storage/analysis/formula.py's pooled α and c."""
    params = {"eid": experiment_id, "bs": batch_size, **{f"d{i}": name for i, name in enumerate(drafters)}}
    sql = _POOLED_SQL.format(
        drafters=", ".join(f":d{i}" for i in range(len(drafters))),
        at_batch=" AND r.batch_size = :bs" if batch_size is not None else "",
    )
    with store.read() as conn:
        row = conn.execute(text(sql), params).mappings().first()
    return dict(row) if row is not None else None


_MISMATCH_SQL = """
SELECT s.id AS run_id, s.sweep_value, s.sweep_label, b.id AS baseline_run_id,
       s.temperature, b.temperature AS b_temperature, s.top_k, b.top_k AS b_top_k, s.top_p, b.top_p AS b_top_p,
       s.seed, b.seed AS b_seed, s.max_new_tokens, b.max_new_tokens AS b_max_new_tokens,
       s.batch_size, b.batch_size AS b_batch_size
FROM runs s JOIN runs b ON b.id = s.baseline_run_id
WHERE s.experiment_id = :eid AND s.kind = 'speculative'
  AND (s.temperature <> b.temperature OR s.top_k <> b.top_k OR s.top_p <> b.top_p OR s.seed <> b.seed
       OR s.max_new_tokens <> b.max_new_tokens OR s.batch_size <> b.batch_size)
ORDER BY s.id"""


def sampling_mismatches(store: Store, experiment_id: int) -> list[dict]:
    """The experiment's speculative runs that decoded with other sampling settings than their own baseline (SQL join
    of each run with its baseline), in run order: run_id, sweep_value, sweep_label, baseline_run_id and each of
    temperature, top_k, top_p, seed, max_new_tokens, batch_size beside the baseline's (`b_temperature`, ...)."""
    with store.read() as conn:
        return [dict(row) for row in conn.execute(text(_MISMATCH_SQL), {"eid": experiment_id}).mappings().all()]


def run_row(store: Store, run_id: int) -> dict:
    """Every column the runs table has for this run (draft / drafter exist only in newer schemas); {} when none."""
    with store.read() as conn:
        row = conn.execute(text("SELECT * FROM runs WHERE id = :rid"), {"rid": run_id}).mappings().first()
    return dict(row) if row is not None else {}


def prompt_proposals(store: Store, run_id: int) -> pd.DataFrame:
    """accepted, proposed: the run's per-prompt rollups of the prompts that proposed drafts."""
    with store.read() as conn:
        return _frame(
            conn, "SELECT accepted, proposed FROM prompt_results WHERE run_id = :r AND proposed > 0", {"r": run_id}
        )


def prompt_verified(store: Store, run_id: int) -> list[tuple[int, int]]:
    """(accepted, verified = accepted + rejected) of each of the run's prompts with both counted."""
    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT accepted, accepted + rejected AS verified FROM prompt_results "
                "WHERE run_id = :rid AND accepted IS NOT NULL AND rejected IS NOT NULL"
            ),
            {"rid": int(run_id)},
        ).all()
    return [(row.accepted, row.verified) for row in rows]
