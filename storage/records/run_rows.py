"""The runs table as the CLI, the exports and the pages show it: one row per run with its SPEC metrics.

runs() (an experiment's runs, baseline first), run_summary (one run's row), sweep_curve (measured and predicted
speedup against the swept value), run_row (every stored column of one run) and sampling_mismatches (each run's
sampling settings beside its own baseline's).

Run-level figures come from the per-prompt rollups (`prompt_results`), which SQL fills from the rounds and draft
tokens when a prompt commits; storage/records/columns.py's `sql=` entries are selected here as columns of the run
`r`. The only Python arithmetic is predicted_speedup: a formula per row, not an aggregate, taken from
engine/metrics/theory.py so it is defined once.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import text

from engine.config.drafter_specs import SPECS
from engine.config.run_config import RUN_PARAMETERS
from engine.config.tree_shape import is_tree
from engine.metrics.theory import predicted_speedup as _predicted_speedup
from storage.db.store import Store
from storage.records.columns import COMPUTED, RUN_QUERY
from storage.records.frames import _frame, _nullable_bool, _nullable_int
from storage.records.run_choice import outputs_match

RUN_COLUMNS = RUN_QUERY  # runs()' columns, in order: storage/records/columns.py's table (headers, help, formats too)


# Each run's own settings: every parameter a run stores (engine/config/run_config.py), beside k and batch size
# (metrics).
_SETTINGS = ", ".join(f"r.{name}" for name in RUN_PARAMETERS if name not in ("k", "batch_size"))


# The metrics whose SQL is their storage/records/columns.py entry's, computed over the run `r`.
_COMPUTED = "".join(f",\n       ({c.sql}) AS {c.name}" for c in COMPUTED)


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
