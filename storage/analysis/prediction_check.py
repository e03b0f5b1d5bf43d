"""A confirmed cell against its prediction (issue 37, "Confirm closes the loop"): whether the measured speedup falls
outside the predicted interval, and if so which side of the prediction moved.

A prediction (engine/metrics/server_prediction.py) is two halves multiplied:

    predicted = L_lab · t_0 / t_k (profile)      L_lab: the lab run's tokens per step at k (its acceptance)

and a measurement, where the decode steps carry the time, is the same product of the server's own figures over the
same passes:

    measured ≈ L_server · t_0 / t_k (this confirm)   L_server: 1 + accepted / drafts of the server's counters

so, in logs, gap = ln(measured / predicted) ≈ acceptance + cost, with

    acceptance = ln(L_server / L_lab)                 the lab's acceptance against the server's counters
    cost       = −ln(R_confirm / R_profile)           R: t_k / t_0, the profile's against this confirm's step ratio
    rest       = gap − acceptance − cost               time outside the decode steps (prefill, queueing, the tail)

A side MOVED when it pushes the same way as the gap and carries at least MOVED_SHARE of it (and at least MIN_SHIFT
on its own); both can. Where neither does, the rest is named: the servers' time outside the steps changed (prefill,
queueing) or, where this confirm measured the configuration again, the server's own spread between starts.
"""

from __future__ import annotations

import math
from typing import Any

MOVED_SHARE = 1 / 3  # the share of the gap (in logs) a side must carry, in the gap's direction, to be named
MIN_SHIFT = 0.03  # and the least shift of its own (3 %): a side that moved less than that is not named
SIDES = ("acceptance", "cost")


def _log_ratio(a: float | None, b: float | None) -> float | None:
    return math.log(a / b) if a is not None and b is not None and a > 0 and b > 0 else None


def prediction_check(cell: dict[str, Any]) -> dict[str, Any] | None:
    """For one cell (storage/records/confirm_checks.py's predicted_cells row): {"outside": whether the measured
    speedup lies outside the predicted interval, "direction": "above" / "below" / None, "moved": the sides named
    (SIDES, the larger first; empty inside the interval), "acceptance_shift": L_server / L_lab − 1, "cost_shift":
    R_confirm / R_profile − 1 (None where a figure is missing), "lab_tokens_per_step", "server_tokens_per_step",
    "profile_cost_ratio", "confirm_cost_ratio"}. None without a measured speedup (withheld) or a prediction."""
    measured, predicted = cell.get("speedup"), cell.get("predicted_speedup")
    if measured is None or predicted is None or measured <= 0 or predicted <= 0:
        return None
    lo, hi = cell["predicted_speedup_ci"]
    direction = "above" if measured > hi else "below" if measured < lo else None
    lab, server = cell.get("lab_tokens_per_step"), cell.get("server_tokens_per_step")
    profile, confirm = cell.get("profile_cost_ratio"), cell.get("confirm_cost_ratio")
    acceptance = _log_ratio(server, lab)
    cost_up = _log_ratio(confirm, profile)
    contributions = {"acceptance": acceptance, "cost": -cost_up if cost_up is not None else None}
    gap = math.log(measured / predicted)
    moved = []
    if direction is not None:
        least = max(MOVED_SHARE * abs(gap), math.log(1 + MIN_SHIFT))
        moved = sorted(
            (side for side, v in contributions.items() if v is not None and v * gap > 0 and abs(v) >= least),
            key=lambda side: -abs(contributions[side] or 0.0),
        )
    return {
        "outside": direction is not None,
        "direction": direction,
        "moved": moved,
        "acceptance_shift": math.exp(acceptance) - 1 if acceptance is not None else None,
        "cost_shift": math.exp(cost_up) - 1 if cost_up is not None else None,
        "lab_tokens_per_step": lab,
        "server_tokens_per_step": server,
        "profile_cost_ratio": profile,
        "confirm_cost_ratio": confirm,
    }


def moved_words(check: dict[str, Any]) -> str:
    """Which side moved, in a clause with its figures: "acceptance moved (the lab's 1.80 tokens per step, the
    server's counters 1.35)", "cost moved (...)", both, or that neither explains the gap."""
    parts = []
    for side in check["moved"]:
        if side == "acceptance":
            parts.append(
                f"acceptance moved (the lab's {check['lab_tokens_per_step']:.2f} tokens per step, the server's "
                f"counters {check['server_tokens_per_step']:.2f})"
            )
        else:
            parts.append(
                f"cost moved (the profile's step ratio t_k/t_0 {check['profile_cost_ratio']:.2f}, this confirm's "
                f"{check['confirm_cost_ratio']:.2f})"
            )
    if parts:
        return " and ".join(parts)
    return (
        "neither acceptance nor step cost moved enough to explain it"
        + _figures(check)
        + ": the time outside the decode steps (prefill, queueing) or the server's own spread between starts"
    )


def _figures(check: dict[str, Any]) -> str:
    shown = []
    if check["lab_tokens_per_step"] is not None and check["server_tokens_per_step"] is not None:
        shown.append(
            f"tokens per step lab {check['lab_tokens_per_step']:.2f}, server {check['server_tokens_per_step']:.2f}"
        )
    if check["profile_cost_ratio"] is not None and check["confirm_cost_ratio"] is not None:
        shown.append(
            f"t_k/t_0 profile {check['profile_cost_ratio']:.2f}, this confirm {check['confirm_cost_ratio']:.2f}"
        )
    return f" ({'; '.join(shown)})" if shown else ""
