"""Focus weights (`draftlab distill --focus-from`, a training job's "focus on" experiment): how much each token
type and draft position weighs in the distillation loss, read from where a stored experiment's draft failed.

Domain logic on stored results: torch-free, read by app/training/distill_driver.py for the CLI and the worker alike.
"""

from __future__ import annotations

from typing import Any

from engine.errors import DraftLabError
from storage.analysis.verdict import verdict
from storage.db.store import Store
from storage.records import queries as q

FOCUS_FLOOR = 0.05  # a type or position the target always accepted still weighs a little (1 - acceptance floor)
FOCUS_CLIP = (0.25, 4.0)  # focus weights are clipped to this range after normalising to mean 1


def focus_profile_weights(profile: dict[Any, tuple[Any, Any]]) -> dict[Any, float]:
    """{key: (acceptance, count)} -> {key: weight}: (1 - acceptance), floored at FOCUS_FLOOR, normalised to a
    count-weighted mean of 1, clipped to FOCUS_CLIP. Keys with no count or no acceptance are left out (weight 1)."""
    rows = {key: (float(acc), int(n)) for key, (acc, n) in profile.items() if n and acc is not None and acc == acc}
    if not rows:
        return {}
    raw = {key: max(1.0 - acc, FOCUS_FLOOR) for key, (acc, _) in rows.items()}
    total = sum(n for _, n in rows.values())
    mean = sum(raw[key] * n for key, (_, n) in rows.items()) / total
    lo, hi = FOCUS_CLIP
    return {key: min(hi, max(lo, w / mean)) for key, w in raw.items()}


def focus_weights(store: Store, experiment_id: int) -> dict[str, Any]:
    """The --focus-from weights of a stored experiment: read from its best run (storage/analysis/verdict.py; without
    one, the speculative run with the most verified draft tokens). Keys: experiment_id, run_id, k, how,
    type_weights {type: w}, position_weights {position: w}, acceptance_by_type, acceptance_by_position."""
    exp = q.experiment(store, experiment_id)
    if exp is None:
        raise DraftLabError(
            f"--focus-from {experiment_id}: no experiment {experiment_id} in {store.safe_url}; "
            f"`draftlab list --db {store.safe_url}` shows the ids"
        )
    df = q.runs(store, experiment_id)
    spec = df[(df["kind"] == "speculative") & ((df["accepted"].fillna(0) + df["rejected"].fillna(0)) > 0)]
    if spec.empty:
        raise DraftLabError(
            f"--focus-from {experiment_id}: the experiment has no speculative run with verified draft "
            f"tokens (a model drafter, run to completion); run it first or pick another experiment"
        )
    best = verdict(store, experiment_id).run(spec)
    chosen, how = None, "its best run by measured speedup"
    if best is not None:
        chosen = next(r for r in spec.itertuples() if r.run_id == best["run_id"])
    if chosen is None:
        chosen = (
            spec.assign(verified=spec["accepted"].fillna(0) + spec["rejected"].fillna(0))
            .sort_values(["verified", "run_id"], ascending=[False, True])
            .iloc[0]
        )
        chosen, how = (
            next(r for r in spec.itertuples() if r.run_id == chosen["run_id"]),
            "no best run by speedup: the run with the most verified draft tokens",
        )
    run_id = int(chosen.run_id)
    by_type = q.acceptance_by_type(store, run_id)
    by_pos = q.acceptance_by_position(store, run_id)
    types = {str(r.token_type): (r.rate, r.verified) for r in by_type.itertuples()}
    positions = {int(r.position): (r.conditional, r.reached) for r in by_pos.itertuples()}
    return {
        "experiment_id": experiment_id,
        "run_id": run_id,
        "k": int(chosen.k) if chosen.k == chosen.k else 4,
        "how": how,
        "type_weights": focus_profile_weights(types),
        "position_weights": focus_profile_weights(positions),
        "acceptance_by_type": {k: float(v[0]) for k, v in types.items()},
        "acceptance_by_position": {
            k: (None if v[0] is None or v[0] != v[0] else float(v[0])) for k, v in positions.items()
        },
    }
