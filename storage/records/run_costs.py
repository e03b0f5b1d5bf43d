"""What a run's decoding cost, counted from its stored seconds: the cost model's inputs.
Its committed totals (round_costs), the same counted once per batch round, which a batch's rows share
(batch_round_costs), and every timed decode (timings).
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import text

from storage.db.store import Store
from storage.records.frames import _frame


def round_costs(store: Store, run_id: int) -> dict:
    """A run's committed totals: rounds, wall, draft and verify seconds (the inputs of the cost model)."""
    sql = """SELECT COALESCE(SUM(rounds), 0) AS rounds, COALESCE(SUM(wall_seconds), 0) AS wall_seconds,
                    COALESCE(SUM(draft_seconds), 0) AS draft_seconds, COALESCE(SUM(verify_seconds), 0) AS verify_seconds
             FROM prompt_results WHERE run_id = :rid"""
    with store.read() as conn:
        row = conn.execute(text(sql), {"rid": run_id}).mappings().one()
    return {key: float(value) for key, value in row.items()}


_BATCH_OF = "{t}.prompt_index / COALESCE(NULLIF(r.batch_size, 0), 1)"


def batch_round_costs(store: Store, run_id: int) -> dict:
    """A run's costs counted per batch round (rows of a batch share every round's forwards, so each of its rows
    stores the batch round's draft and verify seconds: read once per batch round; at batch size 1 a batch is a
    prompt): batches, batch rounds, their draft and verify seconds, the first rounds' (which carry the
    prefill), and the batches' wall seconds (each its longest row's)."""
    rounds_of = _BATCH_OF.format(t="rd")
    walls_of = _BATCH_OF.format(t="pr")
    sql = f"""
    WITH br AS (SELECT {rounds_of} AS batch, rd.round_index, MAX(rd.draft_seconds) AS draft,
                       MAX(rd.verify_seconds) AS verify
                FROM rounds rd JOIN runs r ON r.id = rd.run_id WHERE rd.run_id = :rid
                GROUP BY {rounds_of}, rd.round_index),
         bw AS (SELECT {walls_of} AS batch, MAX(pr.wall_seconds) AS wall
                FROM prompt_results pr JOIN runs r ON r.id = pr.run_id WHERE pr.run_id = :rid GROUP BY {walls_of})
    SELECT (SELECT COUNT(*) FROM bw) AS batches, (SELECT COUNT(*) FROM br) AS rounds,
           (SELECT COALESCE(SUM(draft), 0) FROM br) AS draft_seconds,
           (SELECT COALESCE(SUM(verify), 0) FROM br) AS verify_seconds,
           (SELECT COALESCE(SUM(verify), 0) FROM br WHERE round_index = 0) AS first_verify_seconds,
           (SELECT COALESCE(SUM(wall), 0) FROM bw) AS wall_seconds"""
    with store.read() as conn:
        row = conn.execute(text(sql), {"rid": run_id}).mappings().one()
    return {key: float(value or 0) for key, value in row.items()}


def timings(store: Store, run_id: int) -> pd.DataFrame:
    """Every timed decode of a run: prompt_index, repeat, slot (place in the prompt's interleaved order),
    new_tokens, wall_seconds, draft_seconds, verify_seconds, decode_seconds, decode_steps."""
    sql = """SELECT prompt_index, repeat, slot, new_tokens, wall_seconds, draft_seconds, verify_seconds,
                    decode_seconds, decode_steps FROM timings WHERE run_id = :rid ORDER BY prompt_index, repeat"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})
