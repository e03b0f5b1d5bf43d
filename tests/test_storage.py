"""Storage on SQLite and PostgreSQL: schema, SQL metrics == engine/metrics/metrics_oracle.py, queue atomicity, cancel,
stale heartbeats, concurrent readers. Records are synthetic (no models), built with the engine's invariants."""

from __future__ import annotations

import math
import random
import threading
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import text

from benchmarks.bench_queries import synthetic_baseline, synthetic_prompt
from engine.decoding.records import REJECTED
from engine.metrics.metrics_oracle import outputs_match, speculative_metrics, target_step_seconds, throughput
from storage import open_store
from storage.analysis import catalog
from storage.db.errors import QueueError
from storage.db.schema import SCHEMA_VERSION, utcnow
from storage.jobs import liveness, run_state
from storage.jobs.experiments import add_k_runs, enqueue_experiment
from storage.records import queries as q
from storage.records.recording import record_prompt
from storage.serving.export import plain, run_document

REL = 1e-12  # SQL sums may associate float additions differently from Python's left-to-right sum


def enqueue(store, ks=(2, 4), prompts=3, **kw):
    return enqueue_experiment(
        store,
        name=kw.pop("name", "exp"),
        target=kw.pop("target", "tgt"),
        draft=kw.pop("draft", "drf"),
        prompts="inline",
        sampling=kw.pop("sampling", {"temperature": 0.0, "max_new_tokens": 64}),
        sweep_values=list(ks),
        prompt_texts=[f"p{i}" for i in range(prompts)],
        **kw,
    )


def run_ids(store, experiment_id):
    frame = q.runs(store, experiment_id)
    return {(r.kind, None if r.kind == "baseline" else int(r.k)): int(r.run_id) for r in frame.itertuples()}


def record(store, run_id, kind, result):
    with store.write() as conn:
        record_prompt(conn, run_id, kind, result, [f"tok{t}" for t in result.output_ids])


def fill_experiment(store, ks=(2, 4), prompts=3, seed=0, same_outputs_for=None):
    """An experiment whose runs all completed with synthetic results; returns (id, {run_id: results}). Greedy: each
    speculative run reproduces the baseline's outputs (lossless, as a done run is) 0.8 to 1.6 times as fast, or with
    `same_outputs_for` = k only the run at that k does (the others are not lossless)."""
    rng = random.Random(seed)
    eid = enqueue(store, ks, prompts)
    ids = run_ids(store, eid)
    results = {}
    baseline = [synthetic_baseline(rng, i, 12) for i in range(prompts)]
    for (kind, k), rid in ids.items():
        lossless = same_outputs_for in (None, k)
        rows = (
            baseline
            if kind == "baseline"
            else [
                synthetic_prompt(rng, i, k, rounds=6, follow=base.output_ids if lossless else None)
                for i, base in enumerate(baseline)
            ]
        )
        for row, base in zip(rows, baseline) if kind != "baseline" and lossless else ():
            row.wall_seconds = base.wall_seconds / rng.uniform(0.8, 1.6)  # below its tokens per round: possible
        results[rid] = rows
    assert sorted(run_state.claim_group(store, eid, "test-worker")) == sorted(ids.values())
    for (kind, _k), rid in sorted(ids.items(), key=lambda kv: kv[0][0] != "baseline"):
        run_state.start_run(store, rid, prompts, "cpu")
        for result in results[rid]:
            record(store, rid, kind, result)
        run_state.finish_run(store, rid, "done")
    return eid, ids, results


def assert_close(actual, expected, what):
    if expected is None:
        assert actual is None or (isinstance(actual, float) and math.isnan(actual)), what
    else:
        assert actual == pytest.approx(expected, rel=REL), what


# --- schema -----------------------------------------------------------------------------------------------


def test_sqlite_is_wal_with_busy_timeout(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000


def test_default_url_comes_from_env(monkeypatch, tmp_path):
    from storage import resolve_url

    monkeypatch.delenv("DRAFTLAB_DB", raising=False)
    assert resolve_url() == "sqlite:///draftlab.db"
    monkeypatch.setenv("DRAFTLAB_DB", f"sqlite:///{tmp_path}/env.db")
    assert resolve_url() == f"sqlite:///{tmp_path}/env.db"
    assert resolve_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"


# Schema version 1, as the first DraftLab wrote it (SQLite DDL, frozen here on purpose).
V1_DDL = """
CREATE TABLE schema_info (version INTEGER NOT NULL PRIMARY KEY);
INSERT INTO schema_info VALUES (1);
CREATE TABLE experiments (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL, notes TEXT NOT NULL,
    tags TEXT NOT NULL, created DATETIME NOT NULL, target TEXT NOT NULL, draft TEXT NOT NULL, prompts TEXT NOT NULL,
    device VARCHAR(20) NOT NULL, dtype VARCHAR(20) NOT NULL, trust_remote_code BOOLEAN NOT NULL,
    temperature DOUBLE NOT NULL, top_k INTEGER NOT NULL, top_p DOUBLE NOT NULL, seed INTEGER NOT NULL,
    max_new_tokens INTEGER NOT NULL, k INTEGER NOT NULL, sweep_variable VARCHAR(40) NOT NULL,
    sweep_values TEXT NOT NULL);
CREATE TABLE workers (id VARCHAR(80) NOT NULL PRIMARY KEY, host VARCHAR(200) NOT NULL, pid INTEGER NOT NULL,
    started DATETIME NOT NULL, heartbeat DATETIME NOT NULL);
CREATE TABLE runs (id INTEGER NOT NULL PRIMARY KEY, experiment_id INTEGER NOT NULL REFERENCES experiments (id),
    kind VARCHAR(20) NOT NULL, baseline_run_id INTEGER, sweep_value DOUBLE, k INTEGER, temperature DOUBLE NOT NULL,
    top_k INTEGER NOT NULL, top_p DOUBLE NOT NULL, seed INTEGER NOT NULL, max_new_tokens INTEGER NOT NULL,
    status VARCHAR(20) NOT NULL, progress DOUBLE NOT NULL, prompts_total INTEGER, prompts_done INTEGER NOT NULL,
    error TEXT, cancel_requested BOOLEAN NOT NULL, reserved_for VARCHAR(80), worker_id VARCHAR(80),
    created DATETIME NOT NULL, started DATETIME, finished DATETIME, heartbeat DATETIME,
    new_tokens INTEGER NOT NULL, wall_seconds DOUBLE NOT NULL, tokens_per_second DOUBLE, target_step_seconds DOUBLE,
    rounds INTEGER NOT NULL, proposed INTEGER NOT NULL, accepted INTEGER NOT NULL, rejected INTEGER NOT NULL,
    draft_acceptance_rate DOUBLE, alpha DOUBLE, tokens_per_round DOUBLE, expected_alpha DOUBLE, kl DOUBLE,
    draft_step_seconds DOUBLE, max_k INTEGER NOT NULL);
INSERT INTO experiments VALUES (1, 'old', '', 'legacy', '2026-01-01 00:00:00', 'tgt', 'drf', 'code', 'auto', 'auto', 0,
    0.0, 0, 1.0, 0, 32, 4, 'k', '[4]');
INSERT INTO runs (id, experiment_id, kind, temperature, top_k, top_p, seed, max_new_tokens, status, progress,
    prompts_done, cancel_requested, created, new_tokens, wall_seconds, rounds, proposed, accepted, rejected, max_k)
    VALUES (1, 1, 'baseline', 0.0, 0, 1.0, 0, 32, 'done', 1.0, 0, 0, '2026-01-01 00:00:00', 0, 0.0, 0, 0, 0, 0, 0);
"""


def test_opens_and_upgrades_a_version_1_database(tmp_path):
    import sqlite3

    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_DDL)
    store = open_store(f"sqlite:///{path}")
    with store.read() as conn:
        assert conn.execute(text("SELECT version FROM schema_info")).scalar() == SCHEMA_VERSION
        columns = {row[1] for row in conn.execute(text("PRAGMA table_info(runs)"))}
    assert {"peak_memory_mb", "device_name", "error_detail"} <= columns
    assert catalog.experiments(store)["name"].tolist() == ["old"]
    assert q.runs(store, 1)["peak_memory_mb"].isna().all()
    assert set(catalog.experiments(store, tag="legacy")["experiment_id"]) == {1}
    # The upgraded database is fully usable: new tables and indexes are there.
    eid, _, _ = fill_experiment(store, ks=(2,), prompts=1)
    assert catalog.experiments(store, status="done")["experiment_id"].tolist() == [eid, 1]


def test_a_newer_database_is_refused_with_a_clear_message(tmp_path):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    store = open_store(url)
    with store.write() as conn:
        conn.execute(text("UPDATE schema_info SET version = :v"), {"v": SCHEMA_VERSION + 1})
    with pytest.raises(RuntimeError, match="newer than this DraftLab"):
        open_store(url)


# --- SQL metrics == engine/metrics/metrics_oracle.py ------------------------------------------------------------------


def test_stored_metrics_equal_engine_metrics(store):
    eid, ids, results = fill_experiment(store, ks=(1, 3, 5), prompts=4, same_outputs_for=3)
    baseline = results[ids[("baseline", None)]]
    frame = q.runs(store, eid).set_index("run_id")
    base_row = frame.loc[ids[("baseline", None)]]
    assert base_row.new_tokens == throughput(baseline)["new_tokens"]
    assert_close(base_row.tokens_per_second, throughput(baseline)["tokens_per_second"], "baseline tok/s")
    assert_close(base_row.target_step_seconds, target_step_seconds(baseline), "target step")
    for k in (1, 3, 5):
        rid = ids[("speculative", k)]
        expected = speculative_metrics(results[rid], baseline)
        row = frame.loc[rid]
        for key in ("new_tokens", "rounds", "proposed", "accepted", "rejected"):
            assert row[key] == expected[key], key
        for key in (
            "wall_seconds",
            "tokens_per_second",
            "draft_acceptance_rate",
            "alpha",
            "tokens_per_round",
            "expected_alpha",
            "kl",
            "target_entropy",
            "draft_step_seconds",
            "c",
            "predicted_speedup",
            "speedup",
        ):
            assert_close(row[key], expected[key], f"k={k} {key}")
        position = q.acceptance_by_position(store, rid)
        assert position["position"].tolist() == list(range(1, k + 1))
        for got, want in zip(position["conditional"], expected["per_position_acceptance"]):
            assert_close(None if math.isnan(got) else got, want, "per position")
        by_type = q.acceptance_by_type(store, rid)
        assert dict(zip(by_type["token_type"], by_type["rate"])) == pytest.approx(
            expected["acceptance_by_type"], rel=REL
        )
        assert row.outputs_match_baseline == outputs_match(results[rid], baseline)
    assert frame.loc[ids[("speculative", 3)]].outputs_match_baseline is True
    assert frame.loc[ids[("speculative", 1)]].outputs_match_baseline is False


def test_full_accept_share_is_the_share_of_rounds_with_every_draft_accepted(store):
    """storage/records/columns.py's SQL for full_accept_share equals the count over the engine's own rounds, on every
    database; the run JSON carries it, a baseline has none."""
    eid, ids, results = fill_experiment(store, ks=(1, 3, 5), prompts=4, same_outputs_for=3)
    frame = q.runs(store, eid).set_index("run_id")
    assert math.isnan(frame.loc[ids[("baseline", None)]].full_accept_share)
    shares = []
    for k in (1, 3, 5):
        rounds = [r for p in results[ids[("speculative", k)]] for r in p.rounds if r.k > 0]
        expected = sum(r.accepted == r.k for r in rounds) / len(rounds)
        assert_close(frame.loc[ids[("speculative", k)]].full_accept_share, expected, f"k={k} full accepts")
        shares.append(expected)
    assert len(set(shares)) > 1 and 0 < max(shares) < 1  # the records hold both kinds of round
    (entry,) = [r for r in run_document(store, eid)["runs"] if r["k"] == 3]
    assert entry["full_accept_share"] == pytest.approx(shares[1], rel=REL)
    # A round cut by max_new_tokens before its last draft (none rejected, not all accepted) is no full accept, and
    # a round that proposed nothing (prompt lookup without a match) is not counted at all: 1 of 3.
    rid = ids[("speculative", 3)]
    with store.write() as conn:
        conn.execute(text("DELETE FROM rounds WHERE run_id = :r"), {"r": rid})
        conn.execute(
            text(
                "INSERT INTO rounds (run_id, prompt_index, round_index, k, accepted, rejected, emitted, "
                "draft_seconds, verify_seconds, draft_forwards) VALUES (:r, 0, :i, :k, :a, :j, 1, 0, 0, 0)"
            ),
            [
                {"r": rid, "i": i, "k": k, "a": a, "j": j}
                for i, (k, a, j) in enumerate([(3, 3, 0), (3, 1, 1), (3, 2, 0), (0, 0, 0)])
            ],
        )
    assert q.runs(store, eid).set_index("run_id").loc[rid].full_accept_share == pytest.approx(1 / 3)


def test_zero_accept_share_is_the_share_of_rounds_whose_first_draft_was_rejected(store):
    """storage/records/columns.py's SQL for zero_accept_share (empty rounds) equals the count over the engine's own
    rounds, on every database; the run JSON carries it, a baseline has none, and a round cut before its first draft
    is not an empty round."""
    eid, ids, results = fill_experiment(store, ks=(1, 3, 5), prompts=4, same_outputs_for=3)
    frame = q.runs(store, eid).set_index("run_id")
    assert math.isnan(frame.loc[ids[("baseline", None)]].zero_accept_share)
    shares = []
    for k in (1, 3, 5):
        rounds = [r for p in results[ids[("speculative", k)]] for r in p.rounds if r.k > 0]
        first_rejected = [r.draft_tokens[0].outcome == REJECTED for r in rounds]
        expected = sum(first_rejected) / len(rounds)
        assert_close(frame.loc[ids[("speculative", k)]].zero_accept_share, expected, f"k={k} empty rounds")
        shares.append(expected)
    assert len(set(shares)) > 1 and 0 < max(shares) < 1  # the records hold both kinds of round
    (entry,) = [r for r in run_document(store, eid)["runs"] if r["k"] == 3]
    assert entry["zero_accept_share"] == pytest.approx(shares[1], rel=REL)
    rid = ids[("speculative", 3)]
    with store.write() as conn:
        conn.execute(text("DELETE FROM rounds WHERE run_id = :r"), {"r": rid})
        conn.execute(
            text(
                "INSERT INTO rounds (run_id, prompt_index, round_index, k, accepted, rejected, emitted, "
                "draft_seconds, verify_seconds, draft_forwards) VALUES (:r, 0, :i, :k, :a, :j, 1, 0, 0, 0)"
            ),
            [  # rejected first, full accept, rejected later, cut before the first draft, nothing proposed
                {"r": rid, "i": i, "k": k, "a": a, "j": j}
                for i, (k, a, j) in enumerate([(3, 0, 1), (3, 3, 0), (3, 1, 1), (3, 0, 0), (0, 0, 0)])
            ],
        )
    assert q.runs(store, eid).set_index("run_id").loc[rid].zero_accept_share == pytest.approx(1 / 4)


def test_run_document_has_the_cli_shape_and_the_engine_figures(store):
    eid, ids, results = fill_experiment(store, ks=(2,), prompts=2)
    doc = run_document(store, eid)
    baseline = results[ids[("baseline", None)]]
    spec = results[ids[("speculative", 2)]]
    assert doc["experiment_id"] == eid and doc["baseline"]["run_id"] == ids[("baseline", None)]
    assert doc["baseline"]["outputs"] == [
        {"prompt_index": p.prompt_index, "token_ids": p.output_ids, "text": p.text} for p in baseline
    ]
    (entry,) = doc["runs"]
    expected = speculative_metrics(spec, baseline)
    for key, value in expected.items():
        if isinstance(value, float):
            assert entry[key] == pytest.approx(value, rel=REL), key
        elif isinstance(value, dict):
            assert entry[key] == pytest.approx(value, rel=REL), key
        elif isinstance(value, list):
            assert entry[key] == pytest.approx(value, rel=REL), key
        else:
            assert entry[key] == value, key
    import json

    json.dumps(doc, allow_nan=False)  # strict JSON: no NaN


def test_diagnostic_queries_count_what_the_records_say(store):
    eid, ids, results = fill_experiment(store, ks=(4,), prompts=3, seed=7)
    rid = ids[("speculative", 4)]
    tokens = [t for p in results[rid] for r in p.rounds for t in r.draft_tokens]
    rejected = Counter(t.token_id for t in tokens if t.outcome == "rejected")
    verified = Counter(t.token_id for t in tokens if t.outcome != "discarded")
    top = q.top_rejected_tokens(store, rid, limit=5)
    assert len(top) == min(5, len(rejected))
    for row in top.itertuples():
        assert row.rejected == rejected[row.token_id] and row.verified == verified[row.token_id]
        assert row.text == f"tok{row.token_id}"
        assert row.rejection_rate == pytest.approx(row.rejected / row.verified)
    assert top["rejected"].tolist() == sorted(top["rejected"], reverse=True)
    assert top["rejected"].iloc[0] == max(rejected.values())

    prompts = q.per_prompt(store, rid)
    for row, p in zip(prompts.itertuples(), results[rid]):
        assert (row.prompt_index, row.new_tokens, row.rounds) == (p.prompt_index, p.new_tokens, len(p.rounds))
        assert row.accepted == sum(r.accepted for r in p.rounds)
        assert row.tokens_per_round == pytest.approx(sum(len(r.emitted_ids) for r in p.rounds) / len(p.rounds))

    p = results[rid][1]
    out = q.prompt_output(store, rid, 1)
    assert out["token_id"].tolist() == p.output_ids
    leading = len(p.output_ids) - sum(len(r.emitted_ids) for r in p.rounds)  # tokens no round emitted
    assert out["kind"].tolist() == ["first"] * leading + [kind for r in p.rounds for kind in r.emitted_kinds]
    assert out["round_index"].tolist()[leading:] == [r.round_index for r in p.rounds for _ in r.emitted_ids]
    proposals = q.round_proposals(store, rid, 1, 2)
    assert proposals["outcome"].tolist() == [t.outcome for t in p.rounds[2].draft_tokens]
    assert proposals["p_target"].tolist() == pytest.approx([t.p_target for t in p.rounds[2].draft_tokens])
    base_out = q.prompt_output(store, ids[("baseline", None)], 0)
    assert set(base_out["kind"]) == {"target"}

    position = q.acceptance_by_position(store, rid)
    n_rounds = sum(len(p.rounds) for p in results[rid])
    assert position["unconditional"].tolist() == pytest.approx((position["accepted"] / n_rounds).tolist())


def test_experiment_listing_filters_and_best_run(store):
    eid, ids, results = fill_experiment(store, ks=(1, 2), prompts=2)
    other = enqueue(store, (4,), tags=["nightly", "code"], target="big-model")
    listing = catalog.experiments(store)
    assert listing["experiment_id"].tolist() == [other, eid]
    assert list(listing.columns[: len(catalog.EXPERIMENT_COLUMNS)]) == catalog.EXPERIMENT_COLUMNS
    row = listing.set_index("experiment_id").loc[eid]
    assert row.status == "done" and row.progress == pytest.approx(1.0)
    runs = q.runs(store, eid).set_index("run_id")
    speedups = runs[runs["timing_warning"].isna()]["speedup"]  # an impossible speedup is never crowned
    best = speedups.idxmax()
    assert row.best_speedup == pytest.approx(speedups.max())
    assert row.best_value == q.runs(store, eid).set_index("run_id").loc[best, "sweep_value"]
    assert catalog.experiments(store, tag="code")["experiment_id"].tolist() == [other]
    assert catalog.experiments(store, tag="cod").empty  # whole tags only
    assert catalog.experiments(store, model="big-model")["experiment_id"].tolist() == [other]
    assert catalog.experiments(store, status="queued")["experiment_id"].tolist() == [other]
    assert q.experiment(store, other)["tags"] == "nightly,code"
    assert q.experiment(store, other)["sampling"]["max_new_tokens"] == 64
    assert q.experiment(store, 12345) is None
    curve = q.sweep_curve(store, eid)
    assert curve["sweep_value"].tolist() == [1.0, 2.0] and curve["k"].tolist() == [1, 2]


def test_sampling_sweep_gets_a_baseline_per_value(store):
    eid = enqueue_experiment(
        store,
        name="t",
        target="a",
        draft="b",
        prompts="code",
        sampling={},
        sweep_variable="temperature",
        sweep_values=[0.0, 0.7],
        k=3,
    )
    frame = q.runs(store, eid)
    assert sorted(frame["kind"]) == ["baseline", "baseline", "speculative", "speculative"]
    spec = frame[frame["kind"] == "speculative"]
    assert spec["k"].tolist() == [3, 3]
    with store.read() as conn:
        pairs = conn.execute(
            text("SELECT s.temperature, b.temperature FROM runs s JOIN runs b ON b.id = s.baseline_run_id")
        ).all()
    assert sorted(pairs) == [(0.0, 0.0), (0.7, 0.7)]
    with pytest.raises(QueueError):
        enqueue_experiment(
            store, name="t", target="a", draft="b", prompts="code", sampling={}, sweep_variable="seed", sweep_values=[1]
        )  # seeds are not a tuning variable


# --- the queue ---------------------------------------------------------------------------------------------


def test_claim_order_one_worker_per_experiment(store):
    first = enqueue(store, (2, 4))
    second = enqueue(store, (8,))
    ids1, ids2 = run_ids(store, first), run_ids(store, second)
    # The oldest experiment first, all its queued runs at once (timed together); the other experiment may run.
    assert run_state.next_experiment(store, "w1") == first
    assert run_state.claim_group(store, first, "w1") == sorted(ids1.values())
    assert run_state.next_experiment(store, "w2") == second
    assert run_state.claim_group(store, first, "w2") == []  # another worker is running it
    added = add_k_runs(store, first, [8])  # queued while w1 times the rest: still not another worker's to take
    assert run_state.next_experiment(store, "w2") == second
    assert run_state.claim_group(store, first, "w2") == []
    assert run_state.claim_group(store, second, "w2") == sorted(ids2.values())
    assert run_state.next_experiment(store, "w3") is None
    for rid in ids1.values():
        run_state.finish_run(store, rid, "done")
    assert run_state.claim_group(store, first, "w3") == added  # once w1 is done, the new pass is anyone's
    # The experiment whose models a worker holds comes first.
    third, fourth = enqueue(store, (1,)), enqueue(store, (1,))
    assert run_state.next_experiment(store, "w3") == third
    assert run_state.next_experiment(store, "w3", prefer_experiment=fourth) == fourth
    # A run reserved for a worker is only that worker's.
    reserved = enqueue(store, (1,), reserved_for="cli-worker")
    assert run_state.next_experiment(store, "w3", experiment_id=reserved) is None
    assert run_state.claim_group(store, reserved, "w3") == []
    assert run_state.next_experiment(store, "cli-worker", experiment_id=reserved) == reserved
    assert run_state.claim_group(store, reserved, "cli-worker") == sorted(run_ids(store, reserved).values())


def test_two_workers_never_claim_the_same_run(db_url):
    setup = open_store(db_url)
    experiments = [enqueue(setup, (1,), prompts=1, name=f"e{i}") for i in range(12)]
    all_runs = {rid for e in experiments for rid in run_ids(setup, e).values()}
    claimed: dict[str, list[int]] = {"a": [], "b": []}
    errors = []
    barrier = threading.Barrier(2)

    def work(name):
        store = open_store(db_url)  # its own engine and connections, as a second process would have
        try:
            barrier.wait()
            while True:
                eid = run_state.next_experiment(store, f"worker-{name}")
                if eid is None:
                    break
                # Both may pick the same experiment: one claims its runs, the other gets none and looks again.
                rids = run_state.claim_group(store, eid, f"worker-{name}")
                claimed[name] += rids
                for rid in rids:
                    run_state.finish_run(store, rid, "done")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            store.dispose()

    threads = [threading.Thread(target=work, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert not set(claimed["a"]) & set(claimed["b"])
    assert sorted(claimed["a"] + claimed["b"]) == sorted(all_runs)
    # And a direct race on one experiment: exactly one winner, who takes every run.
    race_eid = enqueue(setup, (1,), name="race")
    wins = []
    race = threading.Barrier(4)

    def grab(i):
        s = open_store(db_url)
        race.wait()
        wins.append(run_state.claim_group(s, race_eid, f"w{i}"))
        s.dispose()

    grabbers = [threading.Thread(target=grab, args=(i,)) for i in range(4)]
    for t in grabbers:
        t.start()
    for t in grabbers:
        t.join(30)
    assert sorted(wins, key=len) == [[], [], [], sorted(run_ids(setup, race_eid).values())]


def test_cancel_resume_and_stale_heartbeats(store):
    eid = enqueue(store, (2, 4))
    ids = run_ids(store, eid)
    base, k2, k4 = ids[("baseline", None)], ids[("speculative", 2)], ids[("speculative", 4)]
    with store.write() as conn:  # only the baseline is this worker's to claim; k = 2 and 4 stay queued
        conn.execute(text(f"UPDATE runs SET reserved_for = 'other' WHERE id IN ({k2}, {k4})"))
    assert run_state.claim_group(store, eid, "w") == [base]
    assert run_state.report_progress(store, base, 0.3) is False
    assert run_state.cancel_run(store, k4)  # queued: cancelled at once
    assert run_state.get_run(store, k4)["status"] == "cancelled"
    assert run_state.cancel_experiment(store, eid) == 2  # base (running: flagged) + k2 (queued)
    assert run_state.get_run(store, base)["status"] == "running"
    assert run_state.report_progress(store, base, 0.4) is True  # the worker sees the request between rounds
    run_state.finish_run(store, base, "cancelled")
    assert run_state.resume_run(store, base) and run_state.get_run(store, base)["status"] == "queued"
    assert not run_state.resume_run(store, base)  # already queued

    # A run whose worker stopped heartbeating becomes interrupted; a fresh one is left alone.
    assert run_state.claim_group(store, eid, "dead-worker") == [base]  # k = 2 and 4 are cancelled
    other_eid = enqueue(store, (1,))
    other = run_ids(store, other_eid)[("baseline", None)]
    assert other in run_state.claim_group(store, other_eid, "live-worker")
    with store.write() as conn:
        conn.execute(
            text("UPDATE runs SET heartbeat = :old WHERE id = :rid"),
            {"old": utcnow() - timedelta(seconds=120), "rid": base},
        )
    assert liveness.mark_stale(store, stale_seconds=60) == [base]
    run = run_state.get_run(store, base)
    assert run["status"] == "interrupted" and "resume" in run["error"]
    assert run_state.get_run(store, other)["status"] == "running"


def test_live_workers(store):
    liveness.register_worker(store, "w1", "host", 1)
    liveness.register_worker(store, "w2", "host", 2)
    with store.write() as conn:
        conn.execute(
            text("UPDATE workers SET heartbeat = :old WHERE id = 'w2'"), {"old": utcnow() - timedelta(seconds=300)}
        )
    assert liveness.live_workers(store, max_age_seconds=30) == 1
    liveness.heartbeat(store, "w2", None)
    assert liveness.live_workers(store) == 2
    liveness.unregister_worker(store, "w1")
    assert liveness.live_workers(store) == 1


def test_readers_never_error_while_a_worker_writes(db_url):
    writer_store = open_store(db_url)
    eid = enqueue(writer_store, (4,), prompts=40)
    ids = run_ids(writer_store, eid)
    rid = ids[("speculative", 4)]
    assert run_state.claim_group(writer_store, eid, "w") == sorted(ids.values())
    run_state.finish_run(writer_store, ids[("baseline", None)], "done")
    done = threading.Event()
    errors = []

    def write():
        rng = random.Random(3)
        try:
            for i in range(40):
                record(writer_store, rid, "speculative", synthetic_prompt(rng, i, 4, rounds=30))
                run_state.report_progress(writer_store, rid, (i + 1) / 40)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    reader_store = open_store(db_url)
    thread = threading.Thread(target=write)
    thread.start()
    reads = 0
    seen_prompts = []
    while not done.is_set() or reads < 3:
        summary = q.run_summary(reader_store, rid)
        prompts = q.per_prompt(reader_store, rid)
        q.acceptance_by_position(reader_store, rid)
        catalog.experiments(reader_store)
        # Each read is one snapshot: the run row agrees with the prompt rows it counts.
        assert int(summary["rounds"].iloc[0]) >= 0
        seen_prompts.append(len(prompts))
        reads += 1
    thread.join()
    assert not errors
    assert seen_prompts == sorted(seen_prompts)  # never goes back: each read is a committed snapshot
    assert len(q.per_prompt(reader_store, rid)) == 40
    assert q.run_summary(reader_store, rid)["rounds"].iloc[0] == 40 * 30
    writer_store.dispose()
    reader_store.dispose()


def test_plain_makes_strict_json():
    import numpy as np
    import pandas as pd

    assert plain({"a": np.int64(3), "b": float("nan"), "c": [np.float64(0.5), pd.NA]}) == {
        "a": 3,
        "b": None,
        "c": [0.5, None],
    }
