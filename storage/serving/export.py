"""Documents built from the stored queries: the `draftlab run --json` object and experiment exports.

Everything here reads through storage.records.queries, so the CLI JSON, the exports and the dashboard show the
same figures.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from engine.config.variables import variable
from storage.analysis.confirm_report import confirms
from storage.analysis.schedule import schedule, schedule_dict
from storage.analysis.verdict import verdict_dict
from storage.db.store import Store
from storage.records import columns
from storage.records import queries as q
from storage.records.tree_breakdowns import acceptance_by_sibling_rank, by_rank_document
from storage.serving.plain import plain

# Keys of a speculative run in the `run --json` object, in SPEC order (engine/metrics/metrics_oracle.py's
# speculative_metrics): the column table's `json` entries (storage/records/columns.py), where each key's header, help
# and format live too.
SPECULATIVE_KEYS = columns.SPECULATIVE_KEYS
# A baseline's serving figures in the JSON, as a speculative run's (docs/metrics.md "Serving metrics").
SERVING_KEYS = (
    "batch_size",
    "ttft_seconds_p50",
    "ttft_seconds_p95",
    "itl_seconds_p50",
    "itl_seconds_p95",
    "request_latency_seconds_p50",
    "request_latency_seconds_p95",
)


def _outputs(store: Store, run_id: int) -> list[dict]:
    return [
        {"prompt_index": int(r.prompt_index), "token_ids": list(r.token_ids), "text": r.text}
        for r in q.outputs(store, run_id).itertuples()
    ]


def _tree(store: Store, run: pd.Series) -> dict:
    """A run's token-tree keys (SPEC "Token trees"): tree_topk and tree_tokens (a chain: 1 and 0) and, for a tree,
    acceptance by depth and sibling rank (storage/records/tree_breakdowns.py)."""
    topk = int(run.tree_topk) if "tree_topk" in run.index and pd.notna(run.tree_topk) else 1
    tokens = int(run.tree_tokens) if "tree_tokens" in run.index and pd.notna(run.tree_tokens) else 0
    keys: dict = {"tree_topk": topk, "tree_tokens": tokens}
    if topk > 1:
        keys["acceptance_by_sibling_rank"] = by_rank_document(acceptance_by_sibling_rank(store, int(run.run_id)))
    return keys


def run_document(store: Store, experiment_id: int, with_outputs: bool = True) -> dict:
    """The SPEC `draftlab run --json` object for a stored experiment, plus timing protocol v2's keys:
    `repeats`, the `verdict` (storage/analysis/verdict.py: best configuration, `tied_with`, too wide to choose, the
    cheaper tied `chosen`), for a grid its `batch_sizes`, SPEC's `k_schedule` and the whole `schedule`
    (storage/analysis/schedule.py) and, for `--k auto`,
    `predicted_curve`, `confirmed` and each confirmed run's `prediction_error`; every speculative run's
    `server_predicted` (storage/serving/run_predictions.py: its predicted speedup in the server per concurrency and
    k from the newest server cost profile that fits it, or {"profile": null, "reason": why none does}); and its tree
    (`tree_topk`, `tree_tokens`; a tree's `acceptance_by_sibling_rank`, SPEC "Token trees")."""
    from storage.serving.run_predictions import experiment_predictions

    runs = q.runs(store, experiment_id)
    predicted = experiment_predictions(store, experiment_id)
    experiment = q.experiment(store, experiment_id) or {}
    sweep_variable = experiment.get("sweep_variable", "k")
    swept = variable(sweep_variable)
    auto = experiment.get("predicted_curve") or {}
    curve = {int(k): v for k, v in (auto.get("curve") or {}).items()}
    confirmed = list(auto.get("confirmed") or [])
    curves = q.predicted_curves(experiment)  # {batch size: (curve, confirmed)}
    baseline_rows = runs[runs["kind"] == "baseline"]
    doc: dict = {"experiment_id": experiment_id, "repeats": experiment.get("repeats"), "baseline": None, "runs": []}
    for _, b in baseline_rows.iterrows():
        entry = {
            "run_id": b.run_id,
            "status": b.status,
            "error": b.error,
            "new_tokens": b.new_tokens,
            "wall_seconds": b.wall_seconds,
            "tokens_per_second": b.tokens_per_second,
            "target_step_seconds": b.target_step_seconds,
            **{key: b[key] for key in SERVING_KEYS if key in b.index},
        }
        if with_outputs:
            entry["outputs"] = _outputs(store, int(b.run_id))
        if doc["baseline"] is None:
            doc["baseline"] = plain(entry)  # the first pass's; a sampling sweep or `--k auto` lists them all
        if len(baseline_rows) > 1:
            doc.setdefault("baselines", []).append(plain(entry))
    for _, r in runs[runs["kind"] == "speculative"].iterrows():
        run_id = int(r.run_id)
        position = q.acceptance_by_position(store, run_id)
        by_type = q.acceptance_by_type(store, run_id)
        ci = [r.speedup_ci_lo, r.speedup_ci_hi] if pd.notna(r.speedup_ci_lo) else None
        entry = {
            "run_id": run_id,
            "k": r.k,
            "status": r.status,
            "error": r.error,
            **{key: r[key] for key in SPECULATIVE_KEYS if key in r.index},
            "speedup_ci": ci,
            "per_position_acceptance": list(position["conditional"]),
            "acceptance_by_type": dict(zip(by_type["token_type"], by_type["rate"])),
            "outputs_match_baseline": r.outputs_match_baseline,
            "sweep_variable": sweep_variable,
            "sweep_value": swept.run_value(r),
            # rows from before drafts were stored per run (schema 2) name no drafter: the experiment's draft
            "draft": r.draft if pd.notna(r.draft) else None if pd.notna(r.drafter) else experiment.get("draft"),
            "drafter": r.drafter if pd.notna(r.drafter) else "model",
            "baseline_run_id": r.baseline_run_id,
        }
        keys = [
            "run_id",
            "k",
            "status",
            "error",
            *SPECULATIVE_KEYS,
            "outputs_match_baseline",
            "sweep_variable",
            "sweep_value",
            "draft",
            "drafter",
            "baseline_run_id",
        ]
        entry = {key: entry[key] for key in keys}
        at_size, confirmed_at_size = curves.get(int(r.batch_size) if pd.notna(r.batch_size) else 1, ({}, []))
        if experiment.get("k_auto") and int(r.k) != int(experiment["k_auto"]) and int(r.k) in confirmed_at_size:
            # a confirmation (the first pass holds only k = k_auto), against its batch size's predicted curve
            entry["predicted"] = at_size.get(int(r.k))
            entry["prediction_error"] = (
                (at_size[int(r.k)] / r.speedup - 1) if pd.notna(r.speedup) and r.speedup else None
            )
        entry["server_predicted"] = predicted.get(run_id)
        entry.update(_tree(store, r))
        if with_outputs:
            entry["outputs"] = _outputs(store, run_id)
        doc["runs"].append(plain(entry))
    doc["verdict"] = plain(verdict_dict(store, experiment_id))
    doc["best"], doc["tied_with"] = doc["verdict"]["best"], doc["verdict"]["tied_with"]
    grid = schedule(store, experiment_id)
    if grid is not None:  # a grid: SPEC's k_schedule, and the verdict per batch size (storage/analysis/schedule.py)
        doc["batch_sizes"] = q.grid_sizes(experiment)
        doc["k_schedule"] = plain(grid.k_schedule())
        doc["schedule"] = plain(grid.as_dict())
    if experiment.get("k_auto"):
        doc["predicted_curve"] = {str(k): v for k, v in curve.items()} or None
        doc["confirmed"] = confirmed
        if auto.get("by_batch_size"):  # one predicted curve per batch size (a grid, or a batch size above 1)
            doc["predicted_curves"] = {
                str(b): {"curve": {str(k): v for k, v in c.items()}, "confirmed": ks}
                for b, (c, ks) in sorted(curves.items())
            }
    return doc


def export_json(store: Store, experiment_id: int) -> dict:
    """An experiment, its runs with every metric, every draft token, its confirms and each speculative run's
    `server_predicted` ({run id: the run JSON's document}, storage/serving/run_predictions.py)."""
    from storage.serving.run_predictions import experiment_predictions

    experiment = q.experiment(store, experiment_id)
    if experiment is None:
        raise KeyError(experiment_id)
    runs = q.runs(store, experiment_id)
    tokens = q.draft_token_rows(store, experiment_id)
    timings = [
        {"run_id": int(rid), **row}
        for rid in runs["run_id"]
        for row in q.timings(store, int(rid)).to_dict(orient="records")
    ]
    return plain(
        {
            "experiment": experiment,
            "verdict": verdict_dict(store, experiment_id),
            **({"schedule": schedule_dict(store, experiment_id)} if q.grid_sizes(experiment) else {}),
            "runs": runs.to_dict(orient="records"),
            "timings": timings,
            "draft_tokens": tokens.to_dict(orient="records"),
            "server_confirms": confirms(store, experiment_id),
            "server_predicted": {
                str(run_id): doc for run_id, doc in experiment_predictions(store, experiment_id).items()
            },
        }
    )


def csv_names(experiment_id: int) -> list[str]:
    """The files export_csv writes: runs, draft tokens, timings."""
    return [f"experiment-{experiment_id}-{what}.csv" for what in ("runs", "draft-tokens", "timings")]


def export_csv(store: Store, experiment_id: int, directory: str | Path) -> list[Path]:
    """Write experiment-N-runs.csv, -draft-tokens.csv and -timings.csv into directory; return their paths."""
    if q.experiment(store, experiment_id) is None:
        raise KeyError(experiment_id)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    runs_path, tokens_path, timings_path = (directory / name for name in csv_names(experiment_id))
    runs = q.runs(store, experiment_id)
    runs.to_csv(runs_path, index=False)
    q.draft_token_rows(store, experiment_id).to_csv(tokens_path, index=False)
    frames = [q.timings(store, int(rid)).assign(run_id=int(rid)) for rid in runs["run_id"]]
    timings = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run_id"])
    timings.to_csv(timings_path, index=False)
    return [runs_path, tokens_path, timings_path]
