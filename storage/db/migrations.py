"""Schema versions: a new database gets the current schema; an older one is upgraded step by step.

`schema_info.version` holds the version. Each step upgrades from `version` to `version + 1` inside one
transaction, so a crash mid-upgrade leaves the database at the old version. Steps only add (columns,
tables, indexes): an older DraftLab keeps reading a database a newer one upgraded, as far as SQL allows.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, Engine, inspect, text

from storage.db.schema import SCHEMA_VERSION, Base, record_columns, schema_info, variable_columns


class SchemaTooNew(RuntimeError):
    pass


def _add_columns(conn: Connection, columns) -> None:
    """ALTER TABLE ... ADD COLUMN for each (table, column, SQL type) not there yet (steps may be re-run); a table
    an older version did not have yet is left to create_all, which creates it with every column."""
    found: dict[str, set[str] | None] = {}  # each table's columns, read once (None: no such table yet)
    for table, column, sql_type in columns:
        if table not in found:
            found[table] = (
                {c["name"] for c in inspect(conn).get_columns(table)} if inspect(conn).has_table(table) else None
            )
        existing = found[table]
        if existing is not None and column not in existing:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))
            existing.add(column)


def _v1_to_v2(conn: Connection) -> None:
    """v2: peak memory, device name and tracebacks on runs; the run a worker is executing."""
    _add_columns(
        conn,
        (
            ("runs", "peak_memory_mb", "DOUBLE PRECISION"),
            ("runs", "device_name", "VARCHAR(200)"),
            ("runs", "error_detail", "TEXT"),
            ("workers", "run_id", "INTEGER"),
        ),
    )


def _v2_to_v3(conn: Connection) -> None:
    """v3: timing protocol v2 (repeats, paired speedup with its interval, verify cost, timing warnings,
    `--k auto`), device leases (new tables come from create_all)."""
    _add_columns(
        conn,
        (
            ("experiments", "repeats", "INTEGER DEFAULT 1"),
            ("experiments", "k_auto", "INTEGER"),
            ("experiments", "predicted_curve", "TEXT"),
            ("workers", "waiting_for", "VARCHAR(200)"),
            ("runs", "speedup", "DOUBLE PRECISION"),
            ("runs", "speedup_ci_lo", "DOUBLE PRECISION"),
            ("runs", "speedup_ci_hi", "DOUBLE PRECISION"),
            ("runs", "verify_cost", "DOUBLE PRECISION"),
            ("runs", "predicted_speedup_refined", "DOUBLE PRECISION"),
            ("runs", "timing_warning", "TEXT"),
        ),
    )


def _v3_to_v4(conn: Connection) -> None:
    """v4: each run's draft, drafter, its draft's size and swept value as text (sweeps over drafts and drafting
    strategies); the experiment a validation experiment validates."""
    _add_columns(
        conn,
        (
            ("experiments", "drafter", "VARCHAR(80) DEFAULT 'model'"),
            ("runs", "draft", "TEXT"),
            ("runs", "drafter", "VARCHAR(80)"),
            ("runs", "sweep_label", "TEXT"),
            ("experiments", "validates", "INTEGER"),
            ("runs", "draft_parameters", "BIGINT"),
        ),
    )


def _v4_to_v5(conn: Connection) -> None:
    """v5: training jobs (`Train a draft`) and their curves: new tables only, which create_all adds."""


def _v5_to_v6(conn: Connection) -> None:
    """v6: production counters imported from a serving engine (`draftlab import-metrics`): new tables only."""


def _v6_to_v7(conn: Connection) -> None:
    """v7: how an experiment's conversation prompts become text (its chat template)."""
    _add_columns(conn, (("experiments", "chat_template", "TEXT DEFAULT 'auto'"),))


def _v7_to_v8(conn: Connection) -> None:
    """v8: how the draft model proposes (probabilistic or greedy), on experiments and runs."""
    _add_columns(
        conn,
        (
            ("experiments", "draft_sampling", "VARCHAR(20) DEFAULT 'probabilistic'"),
            ("runs", "draft_sampling", "VARCHAR(20) DEFAULT 'probabilistic'"),
        ),
    )


def _v8_to_v9(conn: Connection) -> None:
    """v9: batch size as a swept variable (runs and experiments), each output token's arrival time, and the
    serving metrics per run (time to first token, inter-token and per-request latency percentiles)."""
    _add_columns(
        conn,
        (
            ("experiments", "batch_size", "INTEGER DEFAULT 1"),
            ("runs", "batch_size", "INTEGER DEFAULT 1"),
            ("output_tokens", "seconds", "DOUBLE PRECISION"),
            *(
                ("runs", column, "DOUBLE PRECISION")
                for column in ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "latency_p50", "latency_p95")
            ),
        ),
    )


def _v9_to_v10(conn: Connection) -> None:
    """v10: who queued each experiment and training job."""
    _add_columns(
        conn, (("experiments", "launched_by", "VARCHAR(200)"), ("training_jobs", "launched_by", "VARCHAR(200)"))
    )


def _v10_to_v11(conn: Connection) -> None:
    """v11: a grid's outer axis, the batch sizes a sweep is run at (`--batch-size 1,4,16 --k 1,2,3,4`)."""
    _add_columns(conn, (("experiments", "batch_sizes", "TEXT"),))


def _v11_to_v12(conn: Connection) -> None:
    """v12: the verify-cost profile per batch size (`--k auto` at batch sizes above 1 and in a grid): a new table
    only, which create_all adds."""


def _v12_to_v13(conn: Connection) -> None:
    """v13: `draftlab confirm`'s server measurements (server_confirms, server_measurements, server_passes): new
    tables only, which create_all adds."""


def _v13_to_v14(conn: Connection) -> None:
    """v14: a confirm is a job the dashboard queues and a worker runs (who runs it, its heartbeat, phase and
    requests done)."""
    _add_columns(
        conn,
        (
            ("server_confirms", "worker_id", "VARCHAR(80)"),
            ("server_confirms", "heartbeat", "TIMESTAMP"),
            ("server_confirms", "phase", "TEXT"),
            ("server_confirms", "requests_done", "INTEGER"),
            ("server_confirms", "requests_total", "INTEGER"),
        ),
    )


def _v15_to_v16(conn: Connection) -> None:
    """v16: training jobs of kind "head" (`draftlab train-head` from the queue): the kind (older jobs distil), a
    head's settings, the acceptance length before/after and per eval point; its held-out acceptance by draft
    position is the new table training_accuracy, which create_all adds."""
    _add_columns(
        conn,
        (
            ("training_jobs", "kind", "VARCHAR(20) NOT NULL DEFAULT 'distill'"),
            ("training_jobs", "ttt_steps", "INTEGER"),
            ("training_jobs", "draft_vocab_size", "INTEGER"),
            ("training_jobs", "aux_layers", "VARCHAR(200)"),
            ("training_jobs", "acceptance_length_before", "DOUBLE PRECISION"),
            ("training_jobs", "acceptance_length_after", "DOUBLE PRECISION"),
            ("training_points", "acceptance_length", "DOUBLE PRECISION"),
        ),
    )


def _v16_to_v17(conn: Connection) -> None:
    """v17: one draft sweep may compare EAGLE-3 heads with causal LMs, each draft drafting with its own drafter: the
    experiment's drafter per draft (runs already store theirs)."""
    _add_columns(conn, (("experiments", "draft_drafters", "TEXT"),))


def _v17_to_v18(conn: Connection) -> None:
    """v18: a confirm's speedup compares equal work and is withheld when it is no result: each measurement's paired
    target-only throughput, the reason a speedup is withheld, and the sampled-output comparison."""
    _add_columns(
        conn,
        (
            ("server_measurements", "baseline_tokens_per_second", "DOUBLE PRECISION"),
            ("server_measurements", "speedup_warning", "TEXT"),
            ("server_measurements", "outputs_test", "TEXT"),
        ),
    )


def _v18_to_v19(conn: Connection) -> None:
    """v19: the process running a confirm and the servers it started, so a sweep ends those a killed confirm left."""
    _add_columns(conn, (("server_confirms", "processes", "TEXT"),))


def _v19_to_v20(conn: Connection) -> None:
    """v20: each pass's engine steps and their seconds, and what a confirm's costs hold for (hardware, target,
    drafter fingerprint): a confirm or a `draftlab profile` is a server cost profile (storage/serving/profiles.py).
    How a confirm's servers ran (starts, one at a time), the runs a served configuration stands for, and each cell's
    prediction beside its measurement (issue 37, "Confirm closes the loop")."""
    _add_columns(
        conn,
        (
            ("server_passes", "decode_seconds", "DOUBLE PRECISION"),
            ("server_passes", "decode_tokens", "BIGINT"),
            ("server_passes", "decode_steps", "BIGINT"),
            ("server_confirms", "hardware", "TEXT"),
            ("server_confirms", "target", "TEXT"),
            ("server_confirms", "profile_run_id", "INTEGER"),
            ("server_confirms", "profile_ks", "TEXT"),
            ("server_measurements", "drafter_fingerprint", "TEXT"),
            ("server_confirms", "server_starts", "INTEGER"),
            ("server_confirms", "one_server_at_a_time", "BOOLEAN"),
            ("server_measurements", "run_ids", "TEXT"),
            ("server_measurements", "predicted_speedup", "DOUBLE PRECISION"),
            ("server_measurements", "predicted_speedup_ci_lo", "DOUBLE PRECISION"),
            ("server_measurements", "predicted_speedup_ci_hi", "DOUBLE PRECISION"),
            ("server_measurements", "predicted_profile_id", "INTEGER"),
            ("server_measurements", "predicted_tokens_per_step", "DOUBLE PRECISION"),
            ("server_measurements", "predicted_cost_ratio", "DOUBLE PRECISION"),
        ),
    )


def add_variable_columns(conn: Connection) -> None:
    """v15, and every open after: each swept variable's column on experiments and runs (storage/db/schema.py's
    variable_columns, typed from engine/config/variables.py), so a new variable needs no step of its own. Older rows
    keep NULL there, which engine/config/run_config.py reads as the variable's default."""
    _add_columns(conn, variable_columns())


def add_record_columns(conn: Connection) -> None:
    """Every open: each column the engine's records store (storage/db/schema.py's record_columns, from the fields of
    engine/decoding/records.py), so a new measurement needs no step of its own. Older rows keep NULL there (a
    measurement they were not taken with)."""
    _add_columns(conn, record_columns())


STEPS: dict[int, Callable[[Connection], None]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
    6: _v6_to_v7,
    7: _v7_to_v8,
    8: _v8_to_v9,
    9: _v9_to_v10,
    10: _v10_to_v11,
    11: _v11_to_v12,
    12: _v12_to_v13,
    13: _v13_to_v14,
    14: add_variable_columns,
    15: _v15_to_v16,
    16: _v16_to_v17,
    17: _v17_to_v18,
    18: _v18_to_v19,
    19: _v19_to_v20,
}
assert all(v in STEPS for v in range(1, SCHEMA_VERSION)), "every version below SCHEMA_VERSION needs an upgrade step"


def current_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table("schema_info"):
        return None
    return conn.execute(text("SELECT MAX(version) FROM schema_info")).scalar()


def ensure_schema(engine: Engine) -> int | None:
    """Create or upgrade the schema; return the version found before (None for a new database)."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(704201)"))  # two processes creating at once
        found = current_version(conn)
        if found is None:
            Base.metadata.create_all(conn)
            conn.execute(schema_info.insert().values(version=SCHEMA_VERSION))
            return None
        if found > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the database has schema version {found}, newer than this DraftLab's "
                f"{SCHEMA_VERSION}; upgrade DraftLab (pip install -U draftlab) or use another --db"
            )
        for version in range(found, SCHEMA_VERSION):
            STEPS[version](conn)
        add_variable_columns(conn)  # a variable described since this database's version (no step of its own)
        add_record_columns(conn)  # a measurement the engine's records gained since (no step of its own either)
        # New tables and indexes of later versions (create_all skips what exists).
        Base.metadata.create_all(conn)
        if found < SCHEMA_VERSION:
            conn.execute(schema_info.delete())
            conn.execute(schema_info.insert().values(version=SCHEMA_VERSION))
        return found
