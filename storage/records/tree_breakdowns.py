"""A token-tree run's breakdowns (SPEC "Token trees"), each one GROUP BY over its draft tokens, the same SQL on
SQLite and PostgreSQL.

A tree round stores one draft_tokens row per depth (position = depth): the path verification walked, its accepted
nodes with their sibling rank (0 = the drafter's top-ranked child of the accepted parent), then the top-ranked
child verification rejected, then the deeper top-1 chain discarded. So acceptance by position
(queries.acceptance_by_position) is acceptance by depth as it stands, and:

    acceptance_by_sibling_rank  per depth d and rank r: the rounds whose path reached d (a row there that was not
                                discarded), the accepted nodes at d of rank r, and their share of those rounds; the
                                shares of one depth add up to its conditional acceptance
    the run's accepted_off_chain_share is a runs column (storage/records/columns.py), beside its other metrics.

A chain's rows carry no sibling rank (NULL): its breakdown by rank is empty.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import text

from engine.decoding.records import ACCEPTED, DISCARDED
from storage.db.store import Store

_F = "DOUBLE PRECISION"  # float division in both SQLite and PostgreSQL

_BY_RANK = text(
    f"""
    WITH reached AS (
        SELECT position AS depth, SUM(CASE WHEN outcome <> :discarded THEN 1 ELSE 0 END) AS reached
        FROM draft_tokens WHERE run_id = :rid GROUP BY position),
    ranked AS (
        SELECT position AS depth, sibling_rank, COUNT(*) AS accepted
        FROM draft_tokens WHERE run_id = :rid AND outcome = :accepted AND sibling_rank IS NOT NULL
        GROUP BY position, sibling_rank)
    SELECT ranked.depth, ranked.sibling_rank, ranked.accepted, reached.reached,
           CAST(ranked.accepted AS {_F}) / NULLIF(reached.reached, 0) AS share
    FROM ranked JOIN reached ON reached.depth = ranked.depth
    ORDER BY ranked.depth, ranked.sibling_rank"""
)
COLUMNS = ["depth", "sibling_rank", "accepted", "reached", "share"]


def acceptance_by_sibling_rank(store: Store, run_id: int) -> pd.DataFrame:
    """depth, sibling_rank, accepted, reached, share (accepted / reached) of a tree run: one row per depth and rank
    that accepted a node; empty for a chain (its rows have no rank)."""
    with store.read() as conn:
        rows = conn.execute(_BY_RANK, {"rid": run_id, "accepted": ACCEPTED, "discarded": DISCARDED}).all()
    frame = pd.DataFrame([tuple(row) for row in rows], columns=COLUMNS)
    for column in ("depth", "sibling_rank", "accepted", "reached"):
        frame[column] = frame[column].astype(int)
    frame["share"] = frame["share"].astype(float)
    return frame


def by_rank_document(frame: pd.DataFrame) -> list[dict]:
    """The run JSON's `acceptance_by_sibling_rank`: [{"depth", "sibling_rank", "share"}, ...] (plain numbers)."""
    return [
        {"depth": int(row.depth), "sibling_rank": int(row.sibling_rank), "share": float(row.share)}
        for row in frame.itertuples()
    ]
