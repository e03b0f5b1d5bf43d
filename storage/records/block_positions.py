"""What block verification accepted that the standard rule rejected, per draft position (SPEC "Verification rule").
A block run's rounds store both verdicts on the same drafts with the same uniforms: `accepted` (block's) and
`accepted_standard` (what the standard rule would have accepted). Per position i of the run's drafts:

    drafted        rounds that proposed a draft at i
    block          rounds whose block verdict accepted i             (i <= accepted)
    standard       rounds whose standard verdict accepted i          (i <= accepted_standard)
    block_only     accepted by block, rejected by standard           (accepted_standard < i <= accepted)
    standard_only  accepted by standard, rejected by block           (accepted < i <= accepted_standard)

so block - standard = block_only - standard_only at each position. One GROUP BY over the run's rounds joined to their
draft positions (draft_tokens), the same SQL on SQLite and PostgreSQL; a standard run (accepted_standard NULL) has
no rows.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import text

from storage.db.store import Store

_BY_POSITION = text(
    """
    SELECT dt.position AS position, COUNT(*) AS drafted,
           SUM(CASE WHEN dt.position <= rd.accepted THEN 1 ELSE 0 END) AS block,
           SUM(CASE WHEN dt.position <= rd.accepted_standard THEN 1 ELSE 0 END) AS standard,
           SUM(CASE WHEN rd.accepted_standard < dt.position AND dt.position <= rd.accepted THEN 1 ELSE 0 END)
               AS block_only,
           SUM(CASE WHEN rd.accepted < dt.position AND dt.position <= rd.accepted_standard THEN 1 ELSE 0 END)
               AS standard_only
    FROM rounds rd JOIN draft_tokens dt
      ON dt.run_id = rd.run_id AND dt.prompt_index = rd.prompt_index AND dt.round_index = rd.round_index
    WHERE rd.run_id = :rid AND rd.accepted_standard IS NOT NULL
    GROUP BY dt.position ORDER BY dt.position"""
)
COLUMNS = ["position", "drafted", "block", "standard", "block_only", "standard_only"]


def block_gain_by_position(store: Store, run_id: int) -> pd.DataFrame:
    """position, drafted, block, standard, block_only, standard_only (COLUMNS, all counts of rounds) of a block
    run, one row per draft position; empty for a standard run."""
    with store.read() as conn:
        rows = conn.execute(_BY_POSITION, {"rid": run_id}).all()
    return pd.DataFrame([tuple(int(v) for v in row) for row in rows], columns=COLUMNS)
