"""A run's acceptance breakdowns, each one GROUP BY over its draft tokens or its per-prompt rollups.

By draft position (acceptance_by_position), by token type (acceptance_by_type), the tokens the target refused most
(top_rejected_tokens), per prompt and position (acceptance_by_prompt_position), each prompt's accepted of its proposed
or verified drafts (prompt_proposals, prompt_verified), and an experiment's runs pooled into the formula's α and c
(pooled_runs). The same SQL on SQLite and PostgreSQL.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import text

from storage.db.store import Store
from storage.records.frames import F, _frame


def acceptance_by_position(store: Store, run_id: int) -> pd.DataFrame:
    """Per draft position 1..k: verified (reached), accepted, accepted/reached and accepted/rounds."""
    sql = f"""
    SELECT position,
           SUM(CASE WHEN outcome <> 'discarded' THEN 1 ELSE 0 END) AS reached,
           SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS accepted,
           CAST(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS {F})
               / NULLIF(SUM(CASE WHEN outcome <> 'discarded' THEN 1 ELSE 0 END), 0) AS conditional,
           CAST(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS {F})
               / NULLIF((SELECT rounds FROM runs WHERE id = :rid), 0) AS unconditional
    FROM draft_tokens WHERE run_id = :rid GROUP BY position ORDER BY position"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


def acceptance_by_type(store: Store, run_id: int) -> pd.DataFrame:
    """Per token type (SPEC's table): verified draft tokens, accepted, and the acceptance rate; `outside_vocab`: the
    rejections a draft with another vocabulary could not have avoided (the target's token lies outside the vocabulary
    both share; 0 with one tokenizer)."""
    sql = f"""
    SELECT token_type, COUNT(*) AS verified,
           SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS accepted,
           CAST(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS {F}) / COUNT(*) AS rate,
           SUM(CASE WHEN outside_vocab = 1 THEN 1 ELSE 0 END) AS outside_vocab
    FROM draft_tokens WHERE run_id = :rid AND outcome <> 'discarded'
    GROUP BY token_type ORDER BY token_type"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


def top_rejected_tokens(store: Store, run_id: int, limit: int = 20) -> pd.DataFrame:
    """The draft tokens the target refused most often: count, times verified, and rejection rate."""
    sql = f"""
    WITH counted AS (
        SELECT token_id, SUM(CASE WHEN outcome = 'rejected' THEN 1 ELSE 0 END) AS rejected, COUNT(*) AS verified
        FROM draft_tokens WHERE run_id = :rid AND outcome <> 'discarded' GROUP BY token_id),
    top AS (SELECT * FROM counted WHERE rejected > 0 ORDER BY rejected DESC, token_id LIMIT :limit)
    SELECT top.token_id,
           (SELECT d.text FROM draft_tokens d WHERE d.run_id = :rid AND d.token_id = top.token_id LIMIT 1) AS text,
           (SELECT d.token_type FROM draft_tokens d WHERE d.run_id = :rid AND d.token_id = top.token_id LIMIT 1)
             AS token_type,
           top.rejected, top.verified, CAST(top.rejected AS {F}) / top.verified AS rejection_rate
    FROM top ORDER BY top.rejected DESC, top.token_id"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id, "limit": int(limit)})


def acceptance_by_prompt_position(store: Store, run_id: int) -> pd.DataFrame:
    """Per prompt and draft position: verified (reached) and accepted drafts, and the prompt's new tokens."""
    sql = """
    SELECT t.prompt_index, t.position,
           SUM(CASE WHEN t.outcome <> 'discarded' THEN 1 ELSE 0 END) AS reached,
           SUM(CASE WHEN t.outcome = 'accepted' THEN 1 ELSE 0 END) AS accepted
    FROM draft_tokens t WHERE t.run_id = :rid GROUP BY t.prompt_index, t.position ORDER BY t.prompt_index, t.position"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


def prompt_proposals(store: Store, run_id: int) -> pd.DataFrame:
    """accepted, proposed: the run's per-prompt rollups of the prompts that proposed drafts."""
    with store.read() as conn:
        return _frame(
            conn, "SELECT accepted, proposed FROM prompt_results WHERE run_id = :r AND proposed > 0", {"r": run_id}
        )


def prompt_verified(store: Store, run_id: int) -> list[tuple[int, int]]:
    """(accepted, verified = accepted + rejected) of each of the run's prompts with both counted."""
    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT accepted, accepted + rejected AS verified FROM prompt_results "
                "WHERE run_id = :rid AND accepted IS NOT NULL AND rejected IS NOT NULL"
            ),
            {"rid": int(run_id)},
        ).all()
    return [(row.accepted, row.verified) for row in rows]


_POOLED_SQL = """
SELECT COUNT(*) AS runs, SUM(r.accepted) AS accepted, SUM(r.accepted + r.rejected) AS verified,
       AVG(b.target_step_seconds / r.draft_step_seconds) AS c
FROM runs r JOIN runs b ON b.id = r.baseline_run_id
WHERE r.experiment_id = :eid AND r.kind = 'speculative' AND r.status = 'done'
  AND (r.drafter IS NULL OR r.drafter IN ({drafters}))
  AND b.status = 'done' AND b.target_step_seconds > 0 AND r.draft_step_seconds > 0
  AND r.accepted IS NOT NULL AND r.rejected IS NOT NULL AND COALESCE(r.tree_topk, 1) <= 1{at_batch}"""


def pooled_runs(
    store: Store, experiment_id: int, drafters: tuple[str, ...], batch_size: int | None = None
) -> dict | None:
    """runs, accepted (Σ), verified (Σ accepted + rejected) and c (the mean of target step / draft step, each run
    against its own baseline) over the experiment's finished speculative runs drafted by one of `drafters` (or no
    drafter recorded) with a measured c, chains only (the formula does not model token trees); batch_size: only that
    batch size's runs. storage/analysis/formula.py's pooled α and c."""
    params = {"eid": experiment_id, "bs": batch_size, **{f"d{i}": name for i, name in enumerate(drafters)}}
    sql = _POOLED_SQL.format(
        drafters=", ".join(f":d{i}" for i in range(len(drafters))),
        at_batch=" AND r.batch_size = :bs" if batch_size is not None else "",
    )
    with store.read() as conn:
        row = conn.execute(text(sql), params).mappings().first()
    return dict(row) if row is not None else None
