"""The `production` rule: imported production traffic against the lab (storage/records/production.py), α or the
draft acceptance rate against the lab run's prompt-clustered 95 % interval.

It fires per imported production series with a lab run of its k (a confirm's own counters excepted: the confirm
rules read them): a warning where production falls outside the lab's interval (the traffic differs from the prompts
tuned on), info where the lab holds."""

from __future__ import annotations

from typing import Any

from storage.analysis.findings.base import _cap, _Context, _finding
from storage.records import production
from storage.records.confirms import confirmed_series


def _production(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: per imported production series (storage/records/production.py) with a lab run of its k, production α (or
    the draft acceptance rate when the server counts no positions) against the lab run's prompt-clustered 95 %
    interval; outside it, the traffic differs from the prompts tuned on (a warning); inside, the lab holds (info)."""
    found = []
    confirmed = confirmed_series(
        ctx.store, ctx.experiment_id
    )  # a confirm's counters are production series too: its own rule reads them
    for item in production.comparison(ctx.store, ctx.experiment_id):
        if item.get("metric") is None or item["series_id"] in confirmed:
            continue
        name = "α" if item["metric"] == "alpha" else "draft acceptance rate"
        figures = (
            f"production {name} {item['production']:.3f} vs lab {item['lab']:.3f} "
            f"({item['lo']:.3f}–{item['hi']:.3f}, run {item['run_id']})"
        )
        where = ""
        if item.get("position"):
            p = item["position"]
            where = (
                f"; the first position outside the lab's interval is {p['position']}: {p['production']:.3f} vs "
                f"{p['lab']:.3f} ({p['lo']:.3f}–{p['hi']:.3f})"
            )
        data = {
            key: item.get(key)
            for key in ("series_id", "run_id", "metric", "production", "lab", "lo", "hi", "outside", "position")
        }
        if item["outside"]:
            title = f"Production ({item['label']}) falls outside the lab's interval"
            detail = (
                f"{_cap(figures)}{where}: the traffic differs from the prompts tuned on ({ctx.experiment['prompts']})."
            )
            found.append(
                _finding(
                    "production",
                    "warning",
                    title,
                    detail,
                    "production",
                    "Capture prompts from production and distill the draft on them (Train a draft), "
                    "then validate on held-out production prompts.",
                    {"page": "train"},
                    data,
                )
            )
        else:
            title = f"Production ({item['label']}) matches the lab"
            detail = f"{_cap(figures)}{where}: the lab's verdict holds for this traffic."
            found.append(
                _finding(
                    "production",
                    "info",
                    title,
                    detail,
                    "production",
                    "Nothing to change; import again after the traffic changes.",
                    None,
                    data,
                )
            )
    return found
