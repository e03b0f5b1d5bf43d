"""A confirm's cells beside what they are checked against (issue 37, "Confirm closes the loop"): the speedup predicted
for each before it was measured, with the two halves of that prediction and this confirm's own figures for them, and
the other servings of the same configuration (its own spread between server starts).

- `predicted_cells`: per speculative measurement that stored a prediction (storage/records/confirms.py's
  add_measurement, from storage/serving/cell_predictions.py): the measured speedup and interval, the
  predicted one and its profile, the lab's tokens per step the prediction used beside the server's counters' over the
  same passes (1 + accepted / drafts), and the profile's step ratio t_k / t_0 beside this confirm's own (each side's
  Σ decode seconds / Σ decode steps over its passes at that concurrency, the target-only passes of this confirm).
- `servings`: every measured speedup of a configuration the experiment served more than once at one concurrency
  (in two confirms, or twice in one before identical configurations were served once): the same speculative config
  exactly, the same concurrency.

Storage reads only: storage/analysis/prediction_check.py judges the cells, storage/analysis/confirm_report.py and the
findings show them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from storage.db.store import Store

_STEPS = text(
    """
    SELECT m.id, m.concurrency, m.k, SUM(p.decode_seconds) / SUM(p.decode_steps) AS step_seconds
    FROM server_measurements m JOIN server_passes p ON p.measurement_id = m.id
    WHERE m.confirm_id = :c AND p.decode_steps > 0 AND p.decode_seconds > 0
    GROUP BY m.id, m.concurrency, m.k"""
)

_PREDICTED = text(
    """
    SELECT m.id AS measurement_id, m.label, m.k, m.concurrency, m.speedup, m.speedup_ci_lo, m.speedup_ci_hi,
           m.predicted_speedup, m.predicted_speedup_ci_lo, m.predicted_speedup_ci_hi, m.predicted_profile_id,
           m.predicted_tokens_per_step, m.predicted_cost_ratio, m.series_id,
           1 + CAST(s.accepted AS DOUBLE PRECISION) / s.drafts AS server_tokens_per_step,
           c.hardware, c.engine_version, pc.hardware AS profile_hardware, pc.engine_version AS profile_engine_version
    FROM server_measurements m
    JOIN server_confirms c ON c.id = m.confirm_id
    LEFT JOIN server_confirms pc ON pc.id = m.predicted_profile_id
    LEFT JOIN production_series s ON s.id = m.series_id AND s.drafts > 0
    WHERE m.confirm_id = :c AND m.speculative_config IS NOT NULL AND m.predicted_speedup IS NOT NULL
    ORDER BY m.id"""
)

_SERVINGS = text(
    """
    SELECT m.id AS measurement_id, m.confirm_id, m.label, m.k, m.speculative_config, m.concurrency, m.speedup,
           m.speedup_ci_lo, m.speedup_ci_hi
    FROM server_measurements m
    JOIN (SELECT speculative_config, concurrency FROM server_measurements
          WHERE experiment_id = :e AND speculative_config IS NOT NULL AND speedup IS NOT NULL
          GROUP BY speculative_config, concurrency HAVING COUNT(*) > 1) g
      ON g.speculative_config = m.speculative_config AND g.concurrency = m.concurrency
    WHERE m.experiment_id = :e AND m.speedup IS NOT NULL
    ORDER BY m.id"""
)


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def step_ratios(store: Store, confirm_id: int) -> dict[int, float]:
    """{speculative measurement id: its step over the target-only step at its concurrency}, this confirm's own
    t_k / t_0 (each Σ decode seconds / Σ decode steps over its passes; one GROUP BY). A measurement without decode
    figures, or at a concurrency without target-only ones, is left out."""
    with store.read() as conn:
        rows = conn.execute(_STEPS, {"c": confirm_id}).all()
    target = {int(r.concurrency): float(r.step_seconds) for r in rows if int(r.k) == 0}
    return {
        int(r.id): float(r.step_seconds) / target[int(r.concurrency)]
        for r in rows
        if int(r.k) != 0 and target.get(int(r.concurrency))
    }


def predicted_cells(store: Store, confirm_id: int) -> list[dict[str, Any]]:
    """The confirm's speculative measurements that stored a prediction, oldest first: measurement_id, label, k,
    concurrency, speedup and speedup_ci (None where withheld or one pass), predicted_speedup, predicted_speedup_ci,
    predicted_profile_id, lab_tokens_per_step (the prediction's), server_tokens_per_step (its counters'; None
    without), profile_cost_ratio (the prediction's t_k / t_0), confirm_cost_ratio (this confirm's; None without
    decode figures), and the hardware and engine version of this confirm and of the profile."""
    ratios = step_ratios(store, confirm_id)
    with store.read() as conn:
        rows = conn.execute(_PREDICTED, {"c": confirm_id}).mappings().all()
    return [
        {
            "measurement_id": int(r["measurement_id"]),
            "label": r["label"],
            "k": int(r["k"]),
            "concurrency": int(r["concurrency"]),
            "speedup": _num(r["speedup"]),
            "speedup_ci": (
                [float(r["speedup_ci_lo"]), float(r["speedup_ci_hi"])] if r["speedup_ci_lo"] is not None else None
            ),
            "predicted_speedup": float(r["predicted_speedup"]),
            "predicted_speedup_ci": [float(r["predicted_speedup_ci_lo"]), float(r["predicted_speedup_ci_hi"])],
            "predicted_profile_id": int(r["predicted_profile_id"]),
            "lab_tokens_per_step": _num(r["predicted_tokens_per_step"]),
            "server_tokens_per_step": _num(r["server_tokens_per_step"]),
            "profile_cost_ratio": _num(r["predicted_cost_ratio"]),
            "confirm_cost_ratio": ratios.get(int(r["measurement_id"])),
            "hardware": r["hardware"],
            "engine_version": r["engine_version"] or None,
            "profile_hardware": r["profile_hardware"],
            "profile_engine_version": r["profile_engine_version"] or None,
        }
        for r in rows
    ]


def servings(store: Store, experiment_id: int) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """{(speculative config, concurrency): its servings, oldest first} for each configuration the experiment's
    confirms measured a speedup of more than once at one concurrency; a serving: measurement_id, confirm_id, label,
    k, speedup, speedup_ci (None with one pass)."""
    with store.read() as conn:
        rows = conn.execute(_SERVINGS, {"e": experiment_id}).mappings().all()
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["speculative_config"], int(r["concurrency"])), []).append(
            {
                "measurement_id": int(r["measurement_id"]),
                "confirm_id": int(r["confirm_id"]),
                "label": r["label"],
                "k": int(r["k"]),
                "speedup": float(r["speedup"]),
                "speedup_ci": (
                    [float(r["speedup_ci_lo"]), float(r["speedup_ci_hi"])] if r["speedup_ci_lo"] is not None else None
                ),
            }
        )
    return out
