"""The speedup predicted for one confirmed cell before its measurement is stored (issue 37, "Confirm closes the loop"):
a confirm (app/serving/confirm.py) stores it beside what it measures, so every confirmed cell holds predicted against
measured (storage/records/confirm_checks.py reads them back, storage/analysis/prediction_check.py judges them).

The prediction is storage/serving/profiles.py's: a server cost profile that fits the served configuration (the same
target, the drafter's fingerprint) and the run's own acceptance (storage/analysis/server_predicted.py). Here the
profile is never the confirm measuring the cell (a confirm is a profile too, and would predict itself), and each
cell takes the newest profile that measured its concurrency and a k at or above its own.
"""

from __future__ import annotations

from typing import Any

from engine.errors import DraftLabError
from storage.db.store import Store
from storage.records.server_costs import fitting_profiles, profile_costs


def cell_prediction(
    store: Store,
    run_id: int,
    target: str,
    fingerprint: str,
    k: int,
    concurrency: int,
    *,
    exclude: int | None = None,
    cache: dict | None = None,
) -> dict[str, Any] | None:
    """The server speedup predicted for one confirmed cell (k drafts at `concurrency`), before its measurement is
    stored: from the newest profile that fits the served configuration (`target`, the drafter's `fingerprint`) and
    measured that concurrency and a k at or above `k`, other than `exclude` (the confirm measuring it), and the run's
    own acceptance. {"speedup", "speedup_ci", "profile_id", "tokens_per_step", "step_seconds_ratio"}, or None where
    no profile predicts that cell (none fits, none measured that concurrency, the run drafted fewer positions).
    `cache` ({}) keeps each profile's document for the run across the cells of one confirm."""
    from storage.analysis.server_predicted import server_predicted

    cache = {} if cache is None else cache
    for head in fitting_profiles(store, target, fingerprint):
        profile_id = head["profile_id"]
        if profile_id == exclude:
            continue
        key = (run_id, profile_id, fingerprint)
        if key not in cache:
            costs = profile_costs(store, profile_id, fingerprint)
            try:
                cache[key] = server_predicted(store, run_id, costs) if costs else None
            except DraftLabError:  # nothing to predict from it for this run (no draft tokens, no k profiled)
                cache[key] = None
        cell = ((cache[key] or {}).get("concurrency") or {}).get(str(concurrency), {}).get(str(k))
        if cell is not None:
            return {
                "speedup": cell["speedup"],
                "speedup_ci": list(cell["speedup_ci"]),
                "profile_id": profile_id,
                "tokens_per_step": cell["tokens_per_step"],
                "step_seconds_ratio": cell["step_seconds_ratio"],
            }
    return None
