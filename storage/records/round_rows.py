"""A run's recorded prompts, rounds and tokens as rows: the Round explorer's, the run JSON's and the exports' reads.
Per prompt (per_prompt, prompt_tokens, outputs), one prompt's emitted tokens (prompt_output), one round's draft
tokens (round_proposals), the rounds per drafted k (k_distribution) and every draft token of an experiment
(draft_token_rows, the per-token export).
"""

from __future__ import annotations

import json

import pandas as pd
from sqlalchemy import text

from storage.db.store import Store
from storage.records.frames import F, _frame, _nullable_bool, _nullable_int


def per_prompt(store: Store, run_id: int) -> pd.DataFrame:
    """One row per committed prompt: throughput, rounds, acceptance, and whether it matches the baseline."""
    sql = f"""
    SELECT p.prompt_index, p.prompt, p.new_tokens, p.wall_seconds,
           CAST(p.new_tokens AS {F}) / NULLIF(p.wall_seconds, 0) AS tokens_per_second,
           p.rounds, p.accepted, p.rejected,
           CAST(p.accepted AS {F}) / NULLIF(p.accepted + p.rejected, 0) AS alpha,
           CAST(p.emitted AS {F}) / NULLIF(p.rounds, 0) AS tokens_per_round,
           CASE WHEN r.kind <> 'speculative' OR r.temperature > 0 OR bp.run_id IS NULL THEN NULL
                WHEN p.output_ids = bp.output_ids THEN 1 ELSE 0 END AS matches_baseline,
           p.proposed, p.verified, CAST(p.beta_sum AS {F}) / NULLIF(p.verified, 0) AS expected_alpha, p.text
    FROM prompt_results p
    JOIN runs r ON r.id = p.run_id
    LEFT JOIN prompt_results bp ON bp.run_id = r.baseline_run_id AND bp.prompt_index = p.prompt_index
    WHERE p.run_id = :rid ORDER BY p.prompt_index"""
    with store.read() as conn:
        df = _frame(conn, sql, {"rid": run_id})
    _nullable_bool(df, "matches_baseline")
    return df


def prompt_tokens(store: Store, run_id: int) -> dict[int, int]:
    """Each committed prompt's new tokens."""
    with store.read() as conn:
        return {
            int(i): int(n)
            for i, n in conn.execute(
                text("SELECT prompt_index, new_tokens FROM prompt_results WHERE run_id = :rid ORDER BY prompt_index"),
                {"rid": run_id},
            )
        }


def outputs(store: Store, run_id: int) -> pd.DataFrame:
    """prompt_index, token_ids (list), text per committed prompt: the `outputs` of the run JSON."""
    with store.read() as conn:
        df = _frame(
            conn,
            "SELECT prompt_index, output_ids, text FROM prompt_results WHERE run_id = :rid ORDER BY prompt_index",
            {"rid": run_id},
        )
    df["token_ids"] = [json.loads(v) for v in df.pop("output_ids")]
    return df[["prompt_index", "token_ids", "text"]]


def prompt_output(store: Store, run_id: int, prompt_index: int) -> pd.DataFrame:
    """The tokens a run emitted for one prompt, in order, with the round and kind that emitted each
    (kind 'first' = the target's prefill token, 'target' = a baseline token)."""
    sql = """SELECT position, token_id, text, kind, round_index FROM output_tokens
             WHERE run_id = :rid AND prompt_index = :pi ORDER BY position"""
    with store.read() as conn:
        df = _frame(conn, sql, {"rid": run_id, "pi": prompt_index})
    _nullable_int(df, "round_index")
    return df


def round_proposals(store: Store, run_id: int, prompt_index: int, round_index: int) -> pd.DataFrame:
    """The k draft tokens of one round, with both models' probabilities and the outcome; a token tree's round: the
    path verification walked, one per depth, each node's sibling_rank (0 = the draft's top-1; null for chains)."""
    sql = """SELECT position, token_id, text, token_type, p_draft, p_target, beta, kl, outcome, sibling_rank
             FROM draft_tokens
             WHERE run_id = :rid AND prompt_index = :pi AND round_index = :ri ORDER BY position"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id, "pi": prompt_index, "ri": round_index})


def k_distribution(store: Store, run_id: int) -> pd.DataFrame:
    """How many rounds drafted each k_r (a heuristic or confidence drafter varies it per round): k, rounds, share."""
    sql = f"""SELECT k, COUNT(*) AS rounds,
                     CAST(COUNT(*) AS {F}) / (SELECT COUNT(*) FROM rounds WHERE run_id = :rid) AS share
              FROM rounds WHERE run_id = :rid GROUP BY k ORDER BY k"""
    with store.read() as conn:
        return _frame(conn, sql, {"rid": run_id})


def draft_token_rows(store: Store, experiment_id: int) -> pd.DataFrame:
    """Every draft token of an experiment's runs, with the run's k (for exports); token trees: its `depth` (= position,
    one row per depth) and `sibling_rank` (0 = the draft's top-1; null for chains)."""
    sql = """SELECT d.run_id, r.k, d.prompt_index, d.round_index, d.position, d.token_id, d.text, d.token_type,
                    d.p_draft, d.p_target, d.beta, d.kl, d.outcome, d.position AS depth, d.sibling_rank
             FROM draft_tokens d JOIN runs r ON r.id = d.run_id
             WHERE r.experiment_id = :eid ORDER BY d.run_id, d.prompt_index, d.round_index, d.position"""
    with store.read() as conn:
        return _frame(conn, sql, {"eid": experiment_id})
