"""A confirm read back as SPEC's "Confirm in a serving engine" JSON (`draftlab confirm --json`, the export's
`server_confirms`), with the lab's schedule beside a schedule confirm: the stored rows (storage/records/confirms.py)
put together with the lab's judgement of them (storage/analysis/schedule.py)."""

from __future__ import annotations

import json
from typing import Any

from storage.analysis.prediction_check import prediction_check
from storage.analysis.schedule import schedule_dict
from storage.db.store import Store
from storage.records.confirm_checks import predicted_cells, servings
from storage.records.confirms import (
    LATENCY_KEYS,
    _frame_rows,
    _int,
    _lab,
    _num,
    beside_lab,
    comparable_positions,
    confirm_experiment,
    confirm_head,
    confirm_heads,
    first_divergences,
)
from storage.records.production import series_document


def confirm_document(store: Store, confirm_id: int) -> dict[str, Any]:
    """One confirm as `draftlab confirm --json` prints it (SPEC "Confirm in a serving engine"), exactly."""
    head = confirm_head(store, confirm_id)
    if head is None:
        raise KeyError(confirm_id)
    rows = _frame_rows(store, confirm_id)
    eid = int(head["experiment_id"])
    baseline = [r for r in rows if r["k"] == 0 and r["speculative_config"] is None]
    doc = {
        "experiment_id": eid,
        "engine": head["engine"],
        "engine_version": head["engine_version"],
        "baseline": {
            "per_concurrency": [
                {
                    "concurrency": int(r["concurrency"]),
                    "tokens_per_second": r["tokens_per_second"],
                    **{key: r[key] for key in LATENCY_KEYS},
                }
                for r in baseline
            ]
        },
        "configs": [],
        "server_starts": _int(head.get("server_starts")),
        "one_server_at_a_time": bool(head["one_server_at_a_time"])
        if head.get("one_server_at_a_time") is not None
        else None,
    }
    predicted = {cell["measurement_id"]: cell for cell in predicted_cells(store, confirm_id)}
    served = servings(store, eid)
    lab_cache: dict[int, tuple[float | None, list[float] | None]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["speculative_config"] is None:
            continue
        config = configs.get(r["label"])
        if config is None:
            config = configs[r["label"]] = {
                "label": r["label"],
                "k": int(r["k"]),
                "lab_run_id": _int(r["run_id"]),
                "runs": _runs(r),
                "speculative_config": json.loads(r["speculative_config"]),
                "per_concurrency": [],
            }
            if r["label"] == "schedule":  # the lab's schedule and the server's answer, batch size by batch size
                config["lab_schedule"] = lab_schedule_beside(store, confirm_id)
            doc["configs"].append(config)
        server_rate, server_positions, steps = None, None, 1.0  # no series: the server never drafted
        if r["series_id"] is not None:
            counted = series_document(store, eid, int(r["series_id"]))
            server_rate, server_positions = counted["draft_acceptance_rate"], counted["per_position_acceptance"]
            steps = counted["mean_acceptance_length"]
            server_positions = [
                None if v != v else v
                for v in server_positions[  # a position no round reached: null, not NaN
                    : comparable_positions(json.loads(r["speculative_config"]), int(r["concurrency"]))
                ]
            ]
        lab_rate, lab_pos = _lab(store, _int(r["run_id"]), lab_cache)
        ci = [r["speedup_ci_lo"], r["speedup_ci_hi"]] if r["speedup_ci_lo"] is not None else None
        config["per_concurrency"].append(
            {
                "concurrency": int(r["concurrency"]),
                "tokens_per_second": r["tokens_per_second"],
                "speedup": r["speedup"],
                "speedup_ci": ci,
                **{key: r[key] for key in LATENCY_KEYS},
                "server_draft_acceptance_rate": server_rate,
                "server_per_position_acceptance": server_positions,
                "lab_draft_acceptance_rate": lab_rate,
                "lab_per_position_acceptance": lab_pos,
                "outputs_match_server_baseline": r["outputs_match_server_baseline"],
                "outputs_match_lab": r["outputs_match_lab"],
                "baseline_tokens_per_second": r.get("baseline_tokens_per_second"),
                "server_tokens_per_step": steps,
                "speedup_warning": r.get("speedup_warning"),
                "outputs_test": json.loads(r["outputs_test"]) if r.get("outputs_test") else None,
                **_predicted(predicted.get(int(r["id"]))),
                "server_spread": spread(served.get((r["speculative_config"], int(r["concurrency"])))),
            }
        )
    return doc


def _runs(row: dict[str, Any]) -> list[int]:
    """The lab runs a served configuration stands for (`run_ids`; before v20's, its one run)."""
    if row.get("run_ids"):
        return [int(x) for x in str(row["run_ids"]).split(",")]
    return [int(row["run_id"])] if _int(row["run_id"]) is not None else []


def _predicted(cell: dict[str, Any] | None) -> dict[str, Any]:
    """A cell's prediction keys: predicted_speedup, predicted_speedup_ci, predicted_profile_id (None where no profile
    other than this confirm fitted) and prediction_check (storage/analysis/prediction_check.py; None where the
    speedup is withheld or there is no prediction)."""
    if cell is None:
        return {
            "predicted_speedup": None,
            "predicted_speedup_ci": None,
            "predicted_profile_id": None,
            "prediction_check": None,
        }
    return {
        "predicted_speedup": cell["predicted_speedup"],
        "predicted_speedup_ci": cell["predicted_speedup_ci"],
        "predicted_profile_id": cell["predicted_profile_id"],
        "prediction_check": prediction_check(cell),
    }


def spread(found: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The server's own spread of one configuration at one concurrency, served more than once (storage/records/
    confirm_checks.py's servings): {"servings": [{confirm_id, measurement_id, speedup, speedup_ci}], "lo", "hi",
    "relative": hi / lo − 1}; None when it was served once. Between server starts, not between the lab and the
    server: no one confirm's interval covers it."""
    if not found or len(found) < 2:
        return None
    lo, hi = min(s["speedup"] for s in found), max(s["speedup"] for s in found)
    return {"servings": found, "lo": lo, "hi": hi, "relative": hi / lo - 1 if lo > 0 else None}


def confirms(store: Store, experiment_id: int) -> list[dict[str, Any]]:
    """Every confirm of an experiment, oldest first: its id, status, error, wall time and document (the export's
    `server_confirms`)."""
    heads = confirm_heads(store, experiment_id)
    return [
        {
            "confirm_id": int(h["id"]),
            "status": h["status"],
            "error": h["error"],
            "repeats": int(h["repeats"]),
            "wall_seconds": h["wall_seconds"],
            "created": str(h["created"]),
            "first_divergences": first_divergences(store, int(h["id"])),
            **confirm_document(store, int(h["id"])),
        }
        for h in heads
    ]


def lab_schedule_beside(store: Store, confirm_id: int) -> list[dict[str, Any]]:
    """A schedule confirm: per batch size the lab measured, the lab schedule's k and speedup beside the k vLLM
    served at that concurrency and the server's speedup there (None where the confirm did not measure it)."""
    eid = confirm_experiment(store, confirm_id)
    lab = schedule_dict(store, eid) if eid is not None else None
    if not lab:
        return []
    served = beside_lab(store, confirm_id)
    served = served[served["label"] == "schedule"].set_index("concurrency")
    out = []
    for step in lab["steps"]:
        b = int(step["batch_size"])
        row = served.loc[b] if b in served.index else None
        out.append(
            {
                "batch_size": b,
                "k": step["k"],
                "speedup": step["speedup"],
                "speedup_ci": step["speedup_ci"],
                "server_k": int(row["k"]) if row is not None else None,
                "server_speedup": _num(row["speedup"]) if row is not None else None,
                "server_speedup_ci": (
                    [_num(row["speedup_ci_lo"]), _num(row["speedup_ci_hi"])]
                    if row is not None and _num(row["speedup_ci_lo"]) is not None
                    else None
                ),
            }
        )
    return out
