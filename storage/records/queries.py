"""Read queries for the CLI, exports and dashboard (docs/storage-api.md). Each returns a pandas DataFrame
computed in SQL; metric names and definitions are SPEC.md's and match engine/metrics/metrics_oracle.py.

Run-level figures come from the per-prompt rollups (`prompt_results`), which SQL fills from the rounds and
draft tokens when a prompt commits; the diagnostics (by position, type, token) aggregate `draft_tokens`
through covering indexes. The only Python arithmetic is predicted_speedup: a formula per row, not an
aggregate, taken from engine/metrics/theory.py so it is defined once.

This module is the one their callers import (`from storage.records import queries as q; q.runs(...)`, and the
pages' `cached("runs")`, which finds a query here by name); each read lives in the module of its topic, and every
public name is re-exported here:

    run_rows            runs, run_summary, sweep_curve, run_row, sampling_mismatches, RUN_COLUMNS
    run_choice          outputs_match, lossy, CHOOSABLE, RANK, verdict_rows, choosable
    experiment_listing  experiment_rows, EXPERIMENT_ROW_COLUMNS, experiment, grid_sizes, predicted_curves,
                        validation_links
    experiment_version  experiment_version (the dashboard's cache stamp)
    target_speeds       target_speed, baseline_speeds
    acceptance          acceptance_by_position, acceptance_by_type, top_rejected_tokens,
                        acceptance_by_prompt_position, prompt_proposals, prompt_verified, pooled_runs
    run_costs           round_costs, batch_round_costs, timings
    round_rows          per_prompt, prompt_tokens, outputs, prompt_output, round_proposals, k_distribution,
                        draft_token_rows
    worker_health       worker_health, WORKER_HEALTH_COLUMNS, device_leases
    frames              F and the DataFrame conversion every read shares

A token tree's, a block run's and a prompt's position breakdowns are their own modules beside these
(tree_breakdowns, block_positions, prompt_positions).
"""

from __future__ import annotations

from storage.records.acceptance import (
    acceptance_by_position,
    acceptance_by_prompt_position,
    acceptance_by_type,
    pooled_runs,
    prompt_proposals,
    prompt_verified,
    top_rejected_tokens,
)
from storage.records.experiment_listing import (
    EXPERIMENT_ROW_COLUMNS,
    experiment,
    experiment_rows,
    grid_sizes,
    predicted_curves,
    validation_links,
)
from storage.records.experiment_version import experiment_version
from storage.records.frames import F
from storage.records.round_rows import (
    draft_token_rows,
    k_distribution,
    outputs,
    per_prompt,
    prompt_output,
    prompt_tokens,
    round_proposals,
)
from storage.records.run_choice import CHOOSABLE, RANK, choosable, lossy, outputs_match, verdict_rows
from storage.records.run_costs import batch_round_costs, round_costs, timings
from storage.records.run_rows import RUN_COLUMNS, run_row, run_summary, runs, sampling_mismatches, sweep_curve
from storage.records.target_speeds import baseline_speeds, target_speed
from storage.records.worker_health import WORKER_HEALTH_COLUMNS, device_leases, worker_health

__all__ = [
    "CHOOSABLE",
    "EXPERIMENT_ROW_COLUMNS",
    "F",
    "RANK",
    "RUN_COLUMNS",
    "WORKER_HEALTH_COLUMNS",
    "acceptance_by_position",
    "acceptance_by_prompt_position",
    "acceptance_by_type",
    "baseline_speeds",
    "batch_round_costs",
    "choosable",
    "device_leases",
    "draft_token_rows",
    "experiment",
    "experiment_rows",
    "experiment_version",
    "grid_sizes",
    "k_distribution",
    "lossy",
    "outputs",
    "outputs_match",
    "per_prompt",
    "pooled_runs",
    "predicted_curves",
    "prompt_output",
    "prompt_proposals",
    "prompt_tokens",
    "prompt_verified",
    "round_costs",
    "round_proposals",
    "run_row",
    "run_summary",
    "runs",
    "sampling_mismatches",
    "sweep_curve",
    "target_speed",
    "timings",
    "top_rejected_tokens",
    "validation_links",
    "verdict_rows",
    "worker_health",
]
