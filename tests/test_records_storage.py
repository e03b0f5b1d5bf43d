"""The engine's records (engine/decoding/records.py) are the one description of what a run stores: each stored
field is a column of its table (storage/db/schema.py), recording fills it from the field
(storage/records/recording.py), every round measurement summed per prompt is summed into prompt_results, and a
database without such a column gains it on open (storage/db/migrations.py's add_record_columns), on SQLite and
PostgreSQL alike."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from sqlalchemy import inspect, text

from engine.decoding.records import PER_PROMPT_SUM, DraftToken, PromptResult, Round, stored_fields, summed_fields
from storage import open_store
from storage.db.schema import draft_tokens, prompt_results, record_columns, rounds
from tests.test_storage import fill_experiment

TABLES = ((DraftToken, draft_tokens), (Round, rounds), (PromptResult, prompt_results))


def test_every_stored_field_is_a_column_of_its_table():
    for record, table in TABLES:
        assert set(stored_fields(record)) <= set(table.c.keys()), record.__name__
    assert {"draft_seconds", "verify_seconds", "draft_forwards"} <= set(summed_fields())
    assert set(summed_fields()) <= set(prompt_results.c.keys())
    assert ("rounds", "draft_seconds", "DOUBLE PRECISION") in record_columns()
    assert ("prompt_results", "draft_forwards", "INTEGER") in record_columns()
    assert ("draft_tokens", "token_type", "TEXT") in record_columns()
    # Lists are stored as their own rows (draft tokens, output tokens), never as a column.
    assert "emitted_ids" not in stored_fields(Round) and "output_ids" not in stored_fields(PromptResult)


def test_stored_fields_read_the_declaration():
    @dataclass
    class Measured:
        count: int
        seconds: float | None
        label: str = ""
        ids: list[int] = field(default_factory=list)
        summed: float = field(default=0.0, metadata=PER_PROMPT_SUM)

    assert stored_fields(Measured) == {"count": int, "seconds": float, "label": str, "summed": float}
    assert summed_fields(Measured) == ["summed"]


def _drop(conn, table: str, column: str) -> None:
    conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))


def test_a_database_without_a_records_column_gains_it_on_open(db_url):
    """As a database from before a measurement: rounds and prompt_results lack its column; opening it adds both,
    and the next prompts store the measurement and its per-prompt sum."""
    store = open_store(db_url)
    with store.write() as conn:
        _drop(conn, "rounds", "draft_forwards")
        _drop(conn, "prompt_results", "draft_forwards")
        assert "draft_forwards" not in {c["name"] for c in inspect(conn).get_columns("rounds")}
    store.dispose()
    store = open_store(db_url)
    try:
        with store.read() as conn:
            for table in ("rounds", "prompt_results"):
                assert "draft_forwards" in {c["name"] for c in inspect(conn).get_columns(table)}, table
        _, ids, results = fill_experiment(store, ks=(3,), prompts=2)
        rid = ids[("speculative", 3)]
        with store.read() as conn:
            stored = dict(
                conn.execute(
                    text("SELECT prompt_index, draft_forwards FROM prompt_results WHERE run_id = :r"), {"r": rid}
                ).all()
            )
            per_round = conn.execute(
                text("SELECT SUM(draft_forwards) FROM rounds WHERE run_id = :r"), {"r": rid}
            ).scalar()
        expected = {p.prompt_index: sum(r.draft_forwards for r in p.rounds) for p in results[rid]}
        assert stored == expected and per_round == sum(expected.values()) > 0
    finally:
        store.dispose()


def test_recording_stores_each_field_as_the_record_holds_it(store):
    """Every stored field of a round and its draft tokens reaches its column; a NaN KL (a drafter without logits)
    is NULL, where the column allows it."""
    _, ids, results = fill_experiment(store, ks=(5,), prompts=1)
    rid = ids[("speculative", 5)]
    (result,) = results[rid]
    with store.read() as conn:
        got = [
            dict(row._mapping)
            for row in conn.execute(
                text(f"SELECT {', '.join(stored_fields(Round))} FROM rounds WHERE run_id = :r ORDER BY round_index"),
                {"r": rid},
            )
        ]
        kls = conn.execute(
            text("SELECT kl FROM draft_tokens WHERE run_id = :r ORDER BY round_index, position"), {"r": rid}
        ).scalars()
        kls = list(kls)
    want = [{name: getattr(r, name) for name in stored_fields(Round)} for r in result.rounds]
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g == pytest.approx(w)
    tokens = [t for r in result.rounds for t in r.draft_tokens]
    assert [None if math.isnan(t.kl) else pytest.approx(t.kl) for t in tokens] == kls
    assert None in kls and len(set(kls)) > 2  # the synthetic records hold both
