"""Writing a run's records: one transaction per prompt, bulk inserts, SQL rollups.

A prompt's rounds, draft tokens and emitted tokens are inserted with executemany (plain dicts, no ORM
objects; a record's columns are its dataclass's stored fields, engine/decoding/records.py), then its
`prompt_results` row is built by INSERT ... SELECT over those rows and the run's aggregates by UPDATE ... FROM over
its prompt rows, so every stored figure is a SQL aggregate and a prompt is either fully stored or not at all.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Table, insert, text

from engine.decoding.records import DraftToken, PromptResult, Round, stored_fields, summed_fields
from engine.metrics import stats
from engine.metrics.theory import expected_round_length, refined_speedup
from storage.db.schema import (
    BASELINE,
    FIRST,
    TARGET,
    Base,
    draft_tokens,
    output_tokens,
    prompt_results,
    rounds,
    timings,
    utcnow,
)

F = "DOUBLE PRECISION"


def encode_ids(ids: list[int]) -> str:
    """Canonical JSON for a token-id list (compared as text in SQL, so it must be canonical)."""
    return json.dumps([int(i) for i in ids], separators=(",", ":"))


def _output_rows(run_id: int, kind: str, result: PromptResult, texts: list[str]) -> list[dict]:
    if kind == BASELINE:
        kinds = [TARGET] * len(result.output_ids)
        owners: list[int | None] = [None] * len(result.output_ids)  # a baseline has no rounds
    else:
        leading = len(result.output_ids) - sum(len(r.emitted_ids) for r in result.rounds)
        kinds, owners = [FIRST] * leading, [None] * leading  # tokens no round emitted (a prefill-only first token)
        for r in result.rounds:
            kinds += r.emitted_kinds
            owners += [r.round_index] * len(r.emitted_ids)
    arrivals: list[float] | list[None] = (
        result.token_seconds
        if result.token_seconds is not None and len(result.token_seconds) == len(result.output_ids)
        else [None] * len(result.output_ids)
    )
    return [
        {
            "run_id": run_id,
            "prompt_index": result.prompt_index,
            "position": i,
            "token_id": int(token),
            "text": texts[i],
            "kind": kinds[i],
            "round_index": owners[i],
            "seconds": None if arrival is None else float(arrival),
        }
        for i, (token, arrival) in enumerate(zip(result.output_ids, arrivals))
    ]


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def _value(name: str, kind: type, nullable: bool, optional: bool) -> str:
    """The expression of field `name` of record `r` as the plain Python value every driver takes: a numpy or torch
    scalar as int or float, text as it is, a NaN as NULL where the column allows it."""
    if kind is float and nullable:
        return f"_finite_or_none(r.{name})"
    if kind is str:
        return f"r.{name}"
    convert = f"{kind.__name__}(r.{name})"
    return f"None if r.{name} is None else {convert}" if optional else convert


_ROWS: dict[tuple[type, str], Callable[[Any], dict[str, Any]]] = {}


def _row_builder(record: type, table: str) -> Callable[[Any], dict[str, Any]]:
    """A function of a `record` giving its row of `table`: each stored field (engine/decoding/records.py's
    stored_fields) under the column of the same name. Compiled once per record class into one dict display, as
    fast as a hand-written one (a prompt stores thousands of draft tokens)."""
    if (record, table) not in _ROWS:
        columns = Base.metadata.tables[table].c
        hints = typing.get_type_hints(record)
        items = [
            f"{name!r}: {_value(name, kind, bool(columns[name].nullable), hints[name] is not kind)}"
            for name, kind in stored_fields(record).items()
        ]
        namespace: dict[str, Any] = {"_finite_or_none": _finite_or_none}
        exec(f"def row(r):\n    return {{{', '.join(items)}}}\n", namespace)
        _ROWS[record, table] = namespace["row"]
    return _ROWS[record, table]


def _row(record: object, table: Table, **extra: object) -> dict[str, object]:
    """`table`'s row of an engine record: each stored field under its column's name, as a plain value; then
    `extra`."""
    row = _row_builder(type(record), table.name)(record)
    row.update(extra)
    return row


# A prompt's row: its record's stored fields (passed in) and SQL aggregates of its rounds and draft tokens, every
# round measurement summed per prompt (records.summed_fields) under its own name.
_PROMPT_FIELDS = [*stored_fields(PromptResult), "output_ids", "new_tokens", "finished"]
_ROUND_AGGREGATES = {
    "rounds": "COUNT(*)",
    "proposed": "COALESCE(SUM(k), 0)",
    "emitted": "COALESCE(SUM(emitted), 0)",
    "max_k": "COALESCE(MAX(k), 0)",
    **{name: f"COALESCE(SUM({name}), 0)" for name in summed_fields(Round)},
}
_TOKEN_AGGREGATES = {
    "accepted": "COALESCE(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END), 0)",
    "rejected": "COALESCE(SUM(CASE WHEN outcome = 'rejected' THEN 1 ELSE 0 END), 0)",
    "verified": "COALESCE(SUM(CASE WHEN outcome <> 'discarded' THEN 1 ELSE 0 END), 0)",
    "beta_sum": "COALESCE(SUM(CASE WHEN outcome <> 'discarded' THEN beta END), 0)",
    "kl_sum": "COALESCE(SUM(CASE WHEN outcome <> 'discarded' THEN kl END), 0)",
    "kl_count": "COUNT(CASE WHEN outcome <> 'discarded' THEN kl END)",
}


def _aggregates(columns: dict[str, str]) -> str:
    return ", ".join(f"{sql} AS {name}" for name, sql in columns.items())


_PROMPT_ROLLUP = f"""
INSERT INTO prompt_results (run_id, {", ".join(_PROMPT_FIELDS)}, {", ".join(_ROUND_AGGREGATES)},
    {", ".join(_TOKEN_AGGREGATES)})
SELECT :run_id, {", ".join(":" + name for name in _PROMPT_FIELDS)}, {", ".join("r." + n for n in _ROUND_AGGREGATES)},
    {", ".join("t." + name for name in _TOKEN_AGGREGATES)}
FROM (SELECT {_aggregates(_ROUND_AGGREGATES)}
      FROM rounds WHERE run_id = :run_id AND prompt_index = :prompt_index) r,
     (SELECT {_aggregates(_TOKEN_AGGREGATES)}
      FROM draft_tokens WHERE run_id = :run_id AND prompt_index = :prompt_index) t
"""

# A run's batches (prompts grouped in order into batches of its batch_size; batch 1: one prompt each) with their
# tokens and wall time: a batch lasts until its last row's last token, the longest row's wall_seconds.
_BATCHES = """SELECT pr.prompt_index / COALESCE(NULLIF(rr.batch_size, 0), 1) AS batch, SUM(pr.new_tokens) AS tokens,
       MAX(pr.wall_seconds) AS batch_seconds
FROM prompt_results pr JOIN runs rr ON rr.id = pr.run_id
WHERE pr.run_id = :run_id GROUP BY pr.prompt_index / COALESCE(NULLIF(rr.batch_size, 0), 1)"""

# Run aggregates under SPEC names, over the run's committed prompts (engine/metrics/metrics_oracle.py's definitions).
_RUN_ROLLUP = f"""
UPDATE runs SET
    prompts_done = a.prompts_done,
    progress = CASE WHEN runs.prompts_total > 0 THEN CAST(a.prompts_done AS {F}) / runs.prompts_total
        ELSE runs.progress END,
    new_tokens = a.new_tokens,
    wall_seconds = w.wall_seconds,
    tokens_per_second = CAST(a.new_tokens AS {F}) / NULLIF(w.wall_seconds, 0),
    target_step_seconds = CAST(a.decode_seconds AS {F}) / NULLIF(a.decode_steps, 0),
    rounds = a.rounds,
    proposed = a.proposed,
    accepted = a.accepted,
    rejected = a.rejected,
    draft_acceptance_rate = CAST(a.accepted AS {F}) / NULLIF(a.proposed, 0),
    alpha = CAST(a.accepted AS {F}) / NULLIF(a.accepted + a.rejected, 0),
    tokens_per_round = CAST(a.emitted AS {F}) / NULLIF(a.rounds, 0),
    expected_alpha = CAST(a.beta_sum AS {F}) / NULLIF(a.verified, 0),
    kl = CAST(a.kl_sum AS {F}) / NULLIF(a.kl_count, 0),
    draft_step_seconds = CAST(a.draft_seconds AS {F}) / NULLIF(a.draft_forwards, 0),
    max_k = a.max_k
FROM (SELECT COUNT(*) AS prompts_done, COALESCE(SUM(new_tokens), 0) AS new_tokens,
             COALESCE(SUM(wall_seconds), 0) AS wall_seconds, COALESCE(SUM(decode_seconds), 0) AS decode_seconds,
             COALESCE(SUM(decode_steps), 0) AS decode_steps, COALESCE(SUM(rounds), 0) AS rounds,
             COALESCE(SUM(proposed), 0) AS proposed, COALESCE(SUM(accepted), 0) AS accepted,
             COALESCE(SUM(rejected), 0) AS rejected, COALESCE(SUM(emitted), 0) AS emitted,
             COALESCE(SUM(verified), 0) AS verified, COALESCE(SUM(beta_sum), 0) AS beta_sum,
             COALESCE(SUM(kl_sum), 0) AS kl_sum, COALESCE(SUM(kl_count), 0) AS kl_count,
             COALESCE(SUM(draft_seconds), 0) AS draft_seconds, COALESCE(SUM(draft_forwards), 0) AS draft_forwards,
             COALESCE(MAX(max_k), 0) AS max_k
      FROM prompt_results WHERE run_id = :run_id) a,
     (SELECT COALESCE(SUM(batch_seconds), 0) AS wall_seconds FROM ({_BATCHES}) b) w
WHERE runs.id = :run_id
"""


def record_prompt(
    conn: Connection,
    run_id: int,
    kind: str,
    result: PromptResult,
    output_texts: list[str],
    repeats: list[PromptResult] | None = None,
    slots: list[int] | None = None,
) -> None:
    """Store one prompt's result in the caller's transaction; output_texts[i] is output token i's text.
    `repeats` are every timed decode of the prompt (result is one of them: the median repeat) and `slots`
    their places in the prompt's interleaved order; each becomes a `timings` row."""
    round_row, token_row = _row_builder(Round, rounds.name), _row_builder(DraftToken, draft_tokens.name)
    round_rows, token_rows = [], []
    for r in result.rounds:
        at = {"run_id": run_id, "prompt_index": result.prompt_index}
        round_rows.append({**round_row(r), **at, "rejected": r.rejected, "emitted": len(r.emitted_ids)})
        at_round = {**at, "round_index": r.round_index}
        token_rows += [{**token_row(t), **at_round} for t in r.draft_tokens]
    insert_rows(conn, round_rows, token_rows, _output_rows(run_id, kind, result, output_texts))
    timed = repeats or [result]
    bulk_insert(
        conn,
        timings,
        [
            {
                "run_id": run_id,
                "prompt_index": result.prompt_index,
                "repeat": i,
                "slot": (slots or [0] * len(timed))[i],
                "new_tokens": r.new_tokens,
                "wall_seconds": r.wall_seconds,
                "draft_seconds": sum(x.draft_seconds for x in r.rounds),
                "verify_seconds": sum(x.verify_seconds for x in r.rounds),
                "decode_seconds": r.decode_seconds,
                "decode_steps": r.decode_steps,
            }
            for i, r in enumerate(timed)
        ],
    )
    conn.execute(
        text(_PROMPT_ROLLUP),
        _row(
            result,
            prompt_results,
            run_id=run_id,
            output_ids=encode_ids(result.output_ids),
            new_tokens=result.new_tokens,
            finished=utcnow(),
        ),
    )
    refresh_run(conn, run_id)


def insert_rows(conn: Connection, round_rows: list[dict], token_rows: list[dict], output_rows: list[dict]) -> None:
    """Bulk-insert plain row dicts with one driver-level executemany per table."""
    for table, rows in ((rounds, round_rows), (draft_tokens, token_rows), (output_tokens, output_rows)):
        if rows:
            bulk_insert(conn, table, rows)


def bulk_insert(conn: Connection, table, rows: list[dict]) -> None:
    """executemany straight on the driver: the statement is compiled once for the dialect, and rows go as
    tuples (qmark drivers such as sqlite3) or dicts (psycopg), skipping SQLAlchemy's per-row processing,
    which costs more than SQLite's insert itself at a few thousand rows per prompt."""
    keys = list(rows[0])
    compiled = insert(table).compile(dialect=conn.dialect, column_keys=keys)
    params: list[tuple[Any, ...]] | list[dict[str, Any]]
    if compiled.positional:
        order = compiled.positiontup
        assert order is not None, "a positional compile lists its parameters in order"
        params = [tuple(row[key] for key in order) for row in rows]
    else:
        params = rows
    conn.exec_driver_sql(str(compiled), params)


# Serving metrics' samples (docs/metrics.md "Serving metrics"), from the committed rows of the run's median
# repeats: each request's first-token arrival and latency, and every gap between consecutive tokens of a request.
_FIRST_TOKENS = """SELECT o.seconds FROM output_tokens o WHERE o.run_id = :run_id AND o.position = 0
AND o.seconds IS NOT NULL ORDER BY o.seconds"""
_GAPS = """SELECT o.seconds - prev.seconds FROM output_tokens o JOIN output_tokens prev
ON prev.run_id = o.run_id AND prev.prompt_index = o.prompt_index AND prev.position = o.position - 1
WHERE o.run_id = :run_id AND o.seconds IS NOT NULL AND prev.seconds IS NOT NULL"""
_LATENCIES = """SELECT p.wall_seconds FROM prompt_results p WHERE p.run_id = :run_id
AND EXISTS (SELECT 1 FROM output_tokens o WHERE o.run_id = p.run_id AND o.prompt_index = p.prompt_index
            AND o.seconds IS NOT NULL)"""


def refresh_serving(conn: Connection, run_id: int) -> None:
    """A run's serving metrics: time to first token, inter-token latency and per-request latency, each at p50
    and p95 (stats.percentile); NULL for a run whose decoder reported no token arrivals."""
    figures = {}
    for name, query in (("ttft", _FIRST_TOKENS), ("itl", _GAPS), ("latency", _LATENCIES)):
        values = [float(v) for v in conn.execute(text(query), {"run_id": run_id}).scalars().all()]
        for q in (50, 95):
            figures[f"{name}_p{q}"] = stats.percentile(values, q)
    conn.execute(
        text("UPDATE runs SET " + ", ".join(f"{c} = :{c}" for c in figures) + " WHERE id = :run_id"),
        {**figures, "run_id": run_id},
    )


def refresh_run(conn: Connection, run_id: int) -> None:
    """Recompute a run's aggregate columns from its committed prompt rows (and, for a speculative run, its
    paired figures; for a baseline, those of the runs paired with it)."""
    conn.execute(text(_RUN_ROLLUP), {"run_id": run_id})
    refresh_serving(conn, run_id)
    paired = (
        conn.execute(
            text(
                "SELECT id FROM runs WHERE id = :rid AND baseline_run_id IS NOT NULL "
                "UNION SELECT id FROM runs WHERE baseline_run_id = :rid"
            ),
            {"rid": run_id},
        )
        .scalars()
        .all()
    )
    for rid in paired:
        refresh_paired(conn, rid)


# Paired (baseline, run) figures per batch, the resampling unit (rows of a batch share every forward, so they are
# not independent): tokens summed over the batch's rows, the batch's wall time its longest row's. At batch size 1
# a batch is a prompt. A run and its baseline always share a batch size (engine/config/variables.py: one baseline each).
_PAIRS = """SELECT SUM(bp.new_tokens), MAX(bp.wall_seconds), SUM(p.new_tokens), MAX(p.wall_seconds)
FROM prompt_results p JOIN runs r ON r.id = p.run_id
JOIN prompt_results bp ON bp.run_id = r.baseline_run_id AND bp.prompt_index = p.prompt_index
WHERE p.run_id = :rid GROUP BY p.prompt_index / COALESCE(NULLIF(r.batch_size, 0), 1)
ORDER BY p.prompt_index / COALESCE(NULLIF(r.batch_size, 0), 1)"""

_COSTS = """SELECT r.rounds, r.tokens_per_round, b.target_step_seconds,
       (SELECT SUM(draft_seconds) FROM prompt_results WHERE run_id = r.id),
       (SELECT SUM(verify_seconds) FROM prompt_results WHERE run_id = r.id)
FROM runs r JOIN runs b ON b.id = r.baseline_run_id WHERE r.id = :rid"""

_POSITIONS = f"""SELECT position, CAST(SUM(CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END) AS {F})
    / NULLIF(SUM(CASE WHEN outcome <> 'discarded' THEN 1 ELSE 0 END), 0)
FROM draft_tokens WHERE run_id = :rid GROUP BY position ORDER BY position"""


def refresh_paired(conn: Connection, run_id: int) -> None:
    """A speculative run's figures against its baseline (timing protocol v2): `speedup` and its 95 % paired
    bootstrap interval over the prompts both finished, `verify_cost` (a verify forward in target steps),
    `predicted_speedup_refined` from its own round times, and `timing_warning` when the measured speedup is
    physically impossible (above tokens per round)."""
    pairs = conn.execute(text(_PAIRS), {"rid": run_id}).all()
    # _PAIRS selects four columns, so there are always four (empty when no prompt is paired)
    base_tokens, base_seconds, run_tokens, run_seconds = list(zip(*pairs)) if pairs else [(), (), (), ()]
    speedup = stats.paired_speedup(base_tokens, base_seconds, run_tokens, run_seconds)
    interval = (
        stats.paired_bootstrap_ci(base_tokens, base_seconds, run_tokens, run_seconds, seed=run_id)
        if speedup is not None
        else None
    )
    rounds_, tokens_per_round, t_target, draft_s, verify_s = conn.execute(text(_COSTS), {"rid": run_id}).one()
    verify_cost = refined = None
    if rounds_ and t_target:
        verify_cost = (verify_s or 0.0) / rounds_ / t_target
        per_position = [
            float(v) if v is not None else 0.0 for _, v in conn.execute(text(_POSITIONS), {"rid": run_id}).all()
        ]
        refined = refined_speedup(
            expected_round_length(per_position), t_target, (draft_s or 0.0) / rounds_, (verify_s or 0.0) / rounds_
        )
    warning = None
    if speedup is not None and tokens_per_round and speedup > tokens_per_round:
        warning = (
            f"measured speedup {speedup:.2f}x exceeds its {tokens_per_round:.2f} tokens per round, which no "
            f"real speedup can (every round costs a target forward): the timing drifted; rerun with more "
            f"--repeats or on a quieter machine"
        )
    conn.execute(
        text(
            "UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi, verify_cost = :vc, "
            "predicted_speedup_refined = :ref, timing_warning = :w WHERE id = :rid"
        ),
        {
            "s": speedup,
            "lo": interval[0] if interval else None,
            "hi": interval[1] if interval else None,
            "vc": verify_cost,
            "ref": refined,
            "w": warning,
            "rid": run_id,
        },
    )


def clear_from(conn: Connection, run_id: int, prompt_index: int) -> None:
    """Delete a run's rows for prompts >= prompt_index (none exist when prompts commit atomically;
    this keeps a resume duplicate-free even so)."""
    for table in (draft_tokens, rounds, output_tokens, timings, prompt_results):
        conn.execute(table.delete().where(table.c.run_id == run_id, table.c.prompt_index >= prompt_index))
    refresh_run(conn, run_id)
