"""Production series: a serving engine's speculative-decoding counters next to the lab's run of the same
configuration (`draftlab import-metrics`, the detail page's Production panel, the `production` finding).

Counts are stored as the engine reports them; every rate is SQL over them, in DraftLab's definitions
(docs/metrics.md, "Production"):

    draft_acceptance_rate = accepted / draft_tokens          (vLLM's "draft acceptance rate")
    tokens_per_round      = 1 + accepted / drafts            (vLLM's "mean acceptance length")
    alpha                 = accepted / (accepted + rejected), rejected = drafts - rounds accepted at position k
    per_position_acceptance[j] = accepted_j / accepted_(j-1), accepted_0 = drafts   (conditional, as the lab's)

The lab's interval is over prompts (each prompt one cluster: a ratio estimator's standard error), since tokens
of one prompt are not independent draws.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import insert, text

from engine.metrics.stats import clustered_ratio_se
from storage.db.schema import DONE, SPECULATIVE, production_positions, production_series
from storage.db.store import Store, new_id
from storage.records.frames import F, _frame

Z95 = 1.959964


class ProductionError(ValueError):
    """Bad input to an import: the message names the problem and the fix, on one line."""


def production_k(drafts: int, draft_tokens: int, per_position: dict[int, int]) -> int:
    """The server's k: its largest counted position, else draft tokens per draft."""
    if per_position:
        return max(per_position)
    return max(1, round(draft_tokens / drafts))


def lab_run_for(store: Store, experiment_id: int, k: int, run_id: int | None = None) -> int | None:
    """The experiment's finished speculative run to compare with: `run_id` if given (checked), else the one at k.
    None when the experiment has none at k; ProductionError when several match (name one with --run)."""
    with store.read() as conn:
        if conn.execute(text("SELECT 1 FROM experiments WHERE id = :e"), {"e": experiment_id}).first() is None:
            raise ProductionError(f"no experiment {experiment_id}; `draftlab list` shows the ids")
        if run_id is not None:
            row = conn.execute(text("SELECT experiment_id, kind FROM runs WHERE id = :r"), {"r": run_id}).first()
            if row is None or row.experiment_id != experiment_id or row.kind != SPECULATIVE:
                raise ProductionError(
                    f"--run {run_id} is not a speculative run of experiment {experiment_id}; "
                    f"`draftlab list` shows its runs"
                )
            return run_id
        ids = [
            r.id
            for r in conn.execute(
                text(
                    "SELECT id FROM runs WHERE experiment_id = :e AND kind = :kind AND status = :done AND k = :k "
                    "ORDER BY id"
                ),
                {"e": experiment_id, "kind": SPECULATIVE, "done": DONE, "k": k},
            )
        ]
    if len(ids) > 1:
        raise ProductionError(
            f"experiment {experiment_id} has {len(ids)} finished runs at k = {k} (runs "
            f"{', '.join(map(str, ids))}): name the one the server runs with --run"
        )
    return ids[0] if ids else None


def add_series(
    store: Store,
    experiment_id: int,
    *,
    drafts: int,
    draft_tokens: int,
    accepted: int,
    per_position: dict[int, int],
    label: str,
    source: str,
    engine: str = "",
    seconds: float | None = None,
    run_id: int | None = None,
    several_ok: bool = False,
) -> dict:
    """Store one window of counters; returns {"series_id", "run_id", "k"}. Refused before anything is stored:
    an empty window, counts that contradict each other, a label too long. Without `run_id` the lab run is the one
    at the server's k (lab_run_for); `several_ok` stores the series without one where several share that k (a
    profile's k served beside a batch-size grid) instead of refusing."""
    if drafts <= 0 or draft_tokens <= 0:
        raise ProductionError(
            "no drafts in this window (the server speculated 0 times): send it traffic between "
            "the two scrapes, or scrape once for its totals since it started"
        )
    if accepted > draft_tokens or any(n > drafts for n in per_position.values()):
        raise ProductionError(
            "the counters contradict each other (more accepted than proposed): were the scrapes "
            "taken from two different servers?"
        )
    label = label.strip()
    if not label or len(label) > 200:
        raise ProductionError(f"--label must be 1 to 200 characters (got {len(label)})")
    k = production_k(drafts, draft_tokens, per_position)
    try:
        run_id = lab_run_for(store, experiment_id, k, run_id)
    except ProductionError:
        if run_id is not None or not several_ok:
            raise
        run_id = None
    with store.write() as conn:
        series_id = new_id(
            conn.execute(
                insert(production_series).values(
                    experiment_id=experiment_id,
                    run_id=run_id,
                    label=label,
                    source=source,
                    engine=engine,
                    seconds=seconds,
                    drafts=drafts,
                    draft_tokens=draft_tokens,
                    accepted=accepted,
                )
            )
        )
        if per_position:
            conn.execute(
                insert(production_positions),
                [{"series_id": series_id, "position": j, "accepted": n} for j, n in sorted(per_position.items())],
            )
    return {"series_id": series_id, "run_id": run_id, "k": k}


_SERIES_SQL = f"""
WITH last AS (
    SELECT p.series_id, p.accepted AS all_accepted FROM production_positions p
    WHERE p.position = (SELECT MAX(q.position) FROM production_positions q WHERE q.series_id = p.series_id))
SELECT s.id AS series_id, s.label, s.source, s.engine, s.created, s.seconds, s.run_id, s.drafts, s.draft_tokens,
       s.accepted,
       CAST(s.accepted AS {F}) / s.draft_tokens AS draft_acceptance_rate,
       1 + CAST(s.accepted AS {F}) / s.drafts AS tokens_per_round,
       CAST(s.accepted AS {F}) / NULLIF(s.accepted + s.drafts - last.all_accepted, 0) AS alpha,
       r.k AS lab_k, r.alpha AS lab_alpha, r.draft_acceptance_rate AS lab_draft_acceptance_rate,
       r.tokens_per_round AS lab_tokens_per_round
FROM production_series s
LEFT JOIN last ON last.series_id = s.id
LEFT JOIN runs r ON r.id = s.run_id
WHERE s.experiment_id = :eid
ORDER BY s.id
"""


def series(store: Store, experiment_id: int) -> pd.DataFrame:
    """Every production series of an experiment with its rates (SQL) and its lab run's, one row each."""
    with store.read() as conn:
        return _frame(conn, _SERIES_SQL, {"eid": experiment_id})


_POSITIONS_SQL = f"""
SELECT p.series_id, p.position, p.accepted,
       COALESCE(prev.accepted, s.drafts) AS reached,
       CAST(p.accepted AS {F}) / NULLIF(COALESCE(prev.accepted, s.drafts), 0) AS conditional
FROM production_positions p
JOIN production_series s ON s.id = p.series_id
LEFT JOIN production_positions prev ON prev.series_id = p.series_id AND prev.position = p.position - 1
WHERE s.experiment_id = :eid
ORDER BY p.series_id, p.position
"""


def series_document(store: Store, experiment_id: int, series_id: int) -> dict:
    """One series as `draftlab import-metrics --json` prints it (SPEC "Production counters"), exactly: experiment_id,
    label, drafts, draft_tokens, accepted, draft_acceptance_rate (accepted / draft_tokens), mean_acceptance_length
    (1 + accepted / drafts) and per_position_acceptance (conditional, from `positions`)."""
    table = series(store, experiment_id).set_index("series_id")
    row = table.loc[series_id]
    at = positions(store, experiment_id)
    return {
        "experiment_id": int(experiment_id),
        "label": str(row["label"]),
        "drafts": int(row["drafts"]),
        "draft_tokens": int(row["draft_tokens"]),
        "accepted": int(row["accepted"]),
        "draft_acceptance_rate": float(row["draft_acceptance_rate"]),
        "mean_acceptance_length": float(row["tokens_per_round"]),
        "per_position_acceptance": [float(v) for v in at[at["series_id"] == series_id]["conditional"]],
    }


def positions(store: Store, experiment_id: int) -> pd.DataFrame:
    """Per series and position: rounds that reached it, accepted there, and the conditional acceptance."""
    with store.read() as conn:
        return _frame(conn, _POSITIONS_SQL, {"eid": experiment_id})


def clustered_ratio(numerators, denominators) -> tuple[float, float, float] | None:
    """Σnum / Σden with a 95 % interval that treats each pair (a prompt) as one independent draw
    (engine/metrics/stats.py's clustered_ratio_se). None without a denominator."""
    estimate = clustered_ratio_se(numerators, denominators)
    if estimate is None:
        return None
    ratio, se, _ = estimate
    if se is None:
        return ratio, float("nan"), float("nan")
    return ratio, max(0.0, ratio - Z95 * se), min(1.0, ratio + Z95 * se)


def lab_alpha_interval(store: Store, run_id: int) -> tuple[float, float, float] | None:
    """The run's α with its prompt-clustered 95 % interval, from its per-prompt rollups."""
    with store.read() as conn:
        df = _frame(
            conn,
            "SELECT accepted, accepted + rejected AS verified FROM prompt_results WHERE run_id = :r",
            {"r": run_id},
        )
    return clustered_ratio(df["accepted"], df["verified"])


def lab_positions(store: Store, run_id: int) -> pd.DataFrame:
    """The run's conditional acceptance per position with its prompt-clustered 95 % interval (per-prompt counts
    by SQL GROUP BY, the interval over prompts)."""
    with store.read() as conn:
        df = _frame(
            conn,
            """
            SELECT position, prompt_index,
                   SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS accepted,
                   SUM(CASE WHEN outcome <> 'discarded' THEN 1 ELSE 0 END) AS reached
            FROM draft_tokens WHERE run_id = :r GROUP BY position, prompt_index ORDER BY position, prompt_index""",
            {"r": run_id},
        )
    rows = []
    for position, group in df.groupby("position", sort=True):
        estimate = clustered_ratio(group["accepted"], group["reached"])
        if estimate is not None:
            rows.append(
                {
                    "position": int(position),
                    "conditional": estimate[0],
                    "lo": estimate[1],
                    "hi": estimate[2],
                    "reached": int(group["reached"].sum()),
                }
            )
    return pd.DataFrame(rows, columns=["position", "conditional", "lo", "hi", "reached"])


def comparison(store: Store, experiment_id: int) -> list[dict]:
    """Per series: production α (or draft acceptance rate when the server counts no positions) against the lab
    run's value and interval, and the first position where production falls outside the lab's interval."""
    out: list[dict] = []
    table = series(store, experiment_id)
    if table.empty:
        return out
    prod_positions = positions(store, experiment_id)
    for row in table.itertuples(index=False):
        item = {"series_id": int(row.series_id), "label": row.label, "run_id": None, "metric": None}
        if row.run_id is None or row.run_id != row.run_id:
            out.append(item)
            continue
        run_id = int(row.run_id)
        item["run_id"] = run_id
        if row.alpha == row.alpha and row.alpha is not None:
            lab = lab_alpha_interval(store, run_id)
            item.update(metric="alpha", production=float(row.alpha))
        else:
            with store.read() as conn:
                df = _frame(conn, "SELECT accepted, proposed FROM prompt_results WHERE run_id = :r", {"r": run_id})
            lab = clustered_ratio(df["accepted"], df["proposed"])
            item.update(metric="draft_acceptance_rate", production=float(row.draft_acceptance_rate))
        if lab is None:
            item["metric"] = None
            out.append(item)
            continue
        item.update(lab=lab[0], lo=lab[1], hi=lab[2])
        item["outside"] = bool(lab[1] == lab[1] and not lab[1] <= item["production"] <= lab[2])
        lab_pos = lab_positions(store, run_id).set_index("position")
        mine = prod_positions[prod_positions["series_id"] == row.series_id]
        for p in mine.itertuples(index=False):
            if p.position in lab_pos.index and p.conditional == p.conditional:
                ref = lab_pos.loc[p.position]
                if ref["lo"] == ref["lo"] and not ref["lo"] <= p.conditional <= ref["hi"]:
                    item["position"] = {
                        "position": int(p.position),
                        "production": float(p.conditional),
                        "lab": float(ref["conditional"]),
                        "lo": float(ref["lo"]),
                        "hi": float(ref["hi"]),
                    }
                    break
        out.append(item)
    return out


def series_counts(store: Store, series_id: int) -> dict | None:
    """A stored series' counters: drafts, draft_tokens, accepted; None for no such series."""
    with store.read() as conn:
        row = (
            conn.execute(
                text("SELECT drafts, draft_tokens, accepted FROM production_series WHERE id = :s"), {"s": series_id}
            )
            .mappings()
            .first()
        )
    return dict(row) if row is not None else None
