"""A lab run's draft-position counts per prompt: for each prompt and each draft position j, the rounds that reached
j and the drafts accepted there, the input of engine/metrics/server_prediction.py's bootstrap over prompts (issue 37,
"Prediction for every lab run").

Definitions are production.lab_positions' (conditional acceptance), kept per prompt instead of pooled: a draft token
reached its position when verification judged it (its outcome is accepted or rejected, not discarded past a rejection
or a cut), and accepted_j counts the accepted ones. Pooled over prompts, accepted_j / reached_j is lab_positions'
`conditional`. One GROUP BY over the run's draft tokens (the covering index on run_id, position, outcome), the same
SQL on SQLite and PostgreSQL.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import text

from engine.decoding.records import ACCEPTED, DISCARDED
from storage.db.store import Store

_COUNTS = text(
    """
    SELECT prompt_index, position,
           SUM(CASE WHEN outcome <> :discarded THEN 1 ELSE 0 END) AS reached,
           SUM(CASE WHEN outcome = :accepted THEN 1 ELSE 0 END) AS accepted
    FROM draft_tokens WHERE run_id = :r
    GROUP BY prompt_index, position ORDER BY prompt_index, position"""
)


def prompt_positions(store: Store, run_id: int) -> tuple[list[int], NDArray[np.int64], NDArray[np.int64]]:
    """(prompt indices, reached, accepted) of a run: `reached[i, j - 1]` is the rounds of prompt `prompts[i]` that
    reached draft position j, `accepted[i, j - 1]` the drafts accepted there, for j = 1..K, K the largest position
    the run drafted (a position every round discarded counts 0 reached). Only prompts with a draft token are listed,
    in prompt order; a run with none (a target-only run) gives ([], and two 0 × 0 arrays)."""
    with store.read() as conn:
        rows = conn.execute(_COUNTS, {"r": run_id, "accepted": ACCEPTED, "discarded": DISCARDED}).all()
    prompts = sorted({int(row.prompt_index) for row in rows})
    K = max((int(row.position) for row in rows), default=0)
    reached = np.zeros((len(prompts), K), dtype=np.int64)
    accepted = np.zeros((len(prompts), K), dtype=np.int64)
    index = {p: i for i, p in enumerate(prompts)}
    for row in rows:
        i, j = index[int(row.prompt_index)], int(row.position) - 1
        reached[i, j] = int(row.reached)
        accepted[i, j] = int(row.accepted)
    return prompts, reached, accepted
