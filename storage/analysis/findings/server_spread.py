"""The server's own spread (kind `confirm`): one configuration served more than once at one concurrency, its
speedups SPREAD_NOTED or more apart.

It fires (info) for a configuration of the newest confirm served more than once (in two confirms, or twice in one),
reported as the server's spread between starts and not as a difference between the lab and the server."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.base import SPREAD_NOTED, _Context, _finding, _pct, _x
from storage.records.confirm_checks import servings
from storage.records.confirms import latest_measured


def _server_spread(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: a configuration of the newest confirm that the experiment served more than once at one concurrency (in
    two confirms, or twice in one before identical configurations were served once), its speedups SPREAD_NOTED or
    more apart: the server's own spread between starts, reported as that and not as a difference between the lab
    and the server (info)."""
    confirm_id = latest_measured(ctx.store, ctx.experiment_id)
    if confirm_id is None:
        return []
    found = []
    for (config, concurrency), servings_of in servings(ctx.store, ctx.experiment_id).items():
        mine = [s for s in servings_of if s["confirm_id"] == confirm_id]
        lo, hi = min(s["speedup"] for s in servings_of), max(s["speedup"] for s in servings_of)
        if not mine or lo <= 0 or hi / lo - 1 < SPREAD_NOTED:
            continue
        confirms = sorted({s["confirm_id"] for s in servings_of})
        where = f"{mine[0]['label']} (k={mine[0]['k']}) at concurrency {concurrency}"
        found.append(
            _finding(
                "confirm",
                "info",
                f"In vLLM, {where} measured {_x(lo)} to {_x(hi)} over {len(servings_of)} servings",
                f"The same speculative configuration, served {len(servings_of)} times at concurrency {concurrency} "
                f"(confirm{'s' if len(confirms) > 1 else ''} {', '.join(map(str, confirms))}), measured "
                f"{', '.join(_x(s['speedup']) for s in servings_of)}: {_pct(hi / lo - 1)} apart, the server's own "
                f"spread between starts (no lab figure enters it); one confirm's interval covers its own passes only.",
                "confirm",
                "Judge the lab's figure against the range of the servings, not one of them; confirm again to see "
                "how wide the range runs on this machine.",
                None,
                {
                    "confirm_id": int(confirm_id),
                    "label": mine[0]["label"],
                    "k": mine[0]["k"],
                    "concurrency": int(concurrency),
                    "speculative_config": config,
                    "servings": servings_of,
                    "lo": lo,
                    "hi": hi,
                },
            )
        )
    return found
