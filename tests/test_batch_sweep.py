"""Batch size as a swept variable (issue 20, items 2, 3 and 7): a batch-size sweep executed end to end by the
worker through the batched decoders on SQLite and PostgreSQL (protocol v2 batch by batch, every row's rounds
logged as at batch 1, greedy outputs at batch 4 equal batch 1), the serving metrics checked against a hand
computation from the engine's own arrival times, and the refusals (too few prompts, a batch that cannot fit, bad
batch sizes) as one `error:` line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import text

from engine.config.variables import VARIABLES
from storage import open_store
from storage.analysis import catalog
from storage.db.errors import QueueError
from storage.jobs.experiments import enqueue_experiment
from storage.records import queries as q
from storage.serving.export import run_document
from tests.meaning import missing
from tests.test_worker import RecordingWorker

PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13", "t30 t31 t32 t33 t34", "t8 t9", "t40 t41 t42", "t2 t3 t4 t5", "t20"]


def enqueue(store, models, sizes, prompts=PROMPTS, repeats=2, **kw):
    return enqueue_experiment(
        store,
        name="batch",
        target=models["target"],
        draft=models["draft"],
        prompts="inline",
        sampling={"temperature": 0.0, "max_new_tokens": 10, "seed": 3},
        device="cpu",
        sweep_variable="batch_size",
        sweep_values=list(sizes),
        k=3,
        prompt_texts=prompts,
        repeats=repeats,
        **kw,
    )


def _percentile(values, q):
    """Linear interpolation between the two nearest ranks, written out (rank (n - 1) q / 100 from 0)."""
    ranked = sorted(values)
    rank = (len(ranked) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ranked) - 1)
    return ranked[low] + (ranked[high] - ranked[low]) * (rank - low)


def test_a_batch_size_sweep_runs_through_the_worker(store, model_dirs):
    eid = enqueue(store, model_dirs, [1, 4])
    worker = RecordingWorker(store)
    with worker:
        worker.work(until_idle=True)
    runs = q.runs(store, eid).set_index("run_id")
    assert (runs["status"] == "done").all(), runs["error"].tolist()
    assert sorted(runs["batch_size"].tolist()) == [1, 1, 4, 4]  # one baseline per batch size
    by = {(r.kind, int(r.batch_size)): rid for rid, r in runs.iterrows()}
    for size in (1, 4):
        assert runs.loc[by[("speculative", size)], "baseline_run_id"] == by[("baseline", size)]
    # Greedy rows are lossless at any batch size: batch 4 equals batch 1 (and its own baseline) token for token.
    outputs = {
        key: [
            json.loads(x)
            for x in q.outputs(store, rid)
            .sort_values("prompt_index")["token_ids"]
            .map(lambda ids: json.dumps(list(ids)))
        ]
        for key, rid in by.items()
    }
    assert outputs[("speculative", 4)] == outputs[("speculative", 1)] == outputs[("baseline", 4)]
    assert bool(runs.loc[by[("speculative", 4)], "outputs_match_baseline"]) is True
    with store.read() as conn:
        for size in (1, 4):
            rid = by[("speculative", size)]
            # Every row's rounds and draft tokens are logged as at batch 1: one rounds row per engine round.
            stored = conn.execute(text("SELECT COUNT(*) FROM rounds WHERE run_id = :r"), {"r": rid}).scalar()
            assert stored == sum(len(res.rounds) for res in worker.results[rid])
            tokens = conn.execute(text("SELECT COUNT(*) FROM draft_tokens WHERE run_id = :r"), {"r": rid}).scalar()
            assert tokens == sum(len(rd.draft_tokens) for res in worker.results[rid] for rd in res.rounds)
            # Protocol v2: every repeat of every row timed, repeats interleaved with its baseline (slots 0..3).
            timings = conn.execute(
                text("SELECT prompt_index, repeat, slot FROM timings WHERE run_id = :r"), {"r": rid}
            ).all()
            assert len(timings) == len(PROMPTS) * 2 and {s for _, _, s in timings} <= {0, 1, 2, 3}
            if size == 4:  # the rows of a batch share their slots: they decoded in one forward
                slots = {}
                for prompt, repeat, slot in timings:
                    slots.setdefault((prompt // 4, repeat), set()).add(slot)
                assert all(len(s) == 1 for s in slots.values())
    # The median repeat of each batch is recorded, all its rows from that one repeat (2 repeats: the lower one).
    for (_kind, size), rid in by.items():
        recorded, repeats = worker.results[rid], worker.repeats[rid]
        for first in range(0, len(PROMPTS), size):
            rows = range(first, min(first + size, len(PROMPTS)))
            walls = [max(repeats[j][0][r].wall_seconds for j in rows) for r in range(2)]
            chosen = walls.index(min(walls))
            assert all(recorded[j] is repeats[j][0][chosen] for j in rows)
    # Serving metrics, by hand from the engine's own arrival times of the recorded (median) repeats.
    for key, rid in by.items():
        results = worker.results[rid]
        assert all(r.token_seconds is not None and len(r.token_seconds) == len(r.output_ids) for r in results)
        first = [r.token_seconds[0] for r in results]
        gaps = [b - a for r in results for a, b in zip(r.token_seconds, r.token_seconds[1:])]
        latency = [r.wall_seconds for r in results]
        row = runs.loc[rid]
        for name, values in (("ttft_seconds", first), ("itl_seconds", gaps), ("request_latency_seconds", latency)):
            for pct in (50, 95):
                assert row[f"{name}_p{pct}"] == pytest.approx(_percentile(values, pct), rel=1e-9, abs=1e-12), name
        # Throughput over the batch: tokens over the sum of the batches' walls (each its longest row's).
        size = key[1]
        walls = [max(r.wall_seconds for r in results[i : i + size]) for i in range(0, len(results), size)]
        assert row["tokens_per_second"] == pytest.approx(sum(len(r.output_ids) for r in results) / sum(walls), rel=1e-9)
    # A speculative round's tokens arrive together: a round of several tokens gives gaps of 0.
    spec = worker.results[by[("speculative", 4)]]
    assert any(len(rd.emitted_ids) > 1 for r in spec for rd in r.rounds)
    assert min(b - a for r in spec for a, b in zip(r.token_seconds, r.token_seconds[1:])) == 0.0
    # The JSON carries the batch size and the serving metrics of every run, the baselines' too.
    doc = run_document(store, eid, with_outputs=False)
    for entry in doc["runs"] + doc["baselines"]:
        row = runs.loc[entry["run_id"]]
        for name in (
            "batch_size",
            "ttft_seconds_p50",
            "ttft_seconds_p95",
            "itl_seconds_p50",
            "itl_seconds_p95",
            "request_latency_seconds_p50",
            "request_latency_seconds_p95",
        ):
            assert entry[name] == row[name], name


def test_paired_speedup_resamples_batches(store, model_dirs):
    """At batch B the speedup pairs batches, not rows: the stored figure is the ratio of per-batch sums, the batch's
    time its longest row's."""
    from engine.metrics import stats

    eid = enqueue(store, model_dirs, [4], repeats=1)
    with RecordingWorker(store) as worker:
        worker.work(until_idle=True)
    runs = q.runs(store, eid).set_index("run_id")
    spec = runs[runs["kind"] == "speculative"].iloc[0]
    run, base = worker.results[int(spec.name)], worker.results[int(spec.baseline_run_id)]
    batches = [
        (sum(len(r.output_ids) for r in b[i : i + 4]), max(r.wall_seconds for r in b[i : i + 4]))
        for b in (base, run)
        for i in (0, 4)
    ]
    expected = stats.paired_speedup(
        [batches[0][0], batches[1][0]],
        [batches[0][1], batches[1][1]],
        [batches[2][0], batches[3][0]],
        [batches[2][1], batches[3][1]],
    )
    assert spec["speedup"] == pytest.approx(expected, rel=1e-9)
    rowwise = stats.paired_speedup(
        [len(r.output_ids) for r in base],
        [r.wall_seconds for r in base],
        [len(r.output_ids) for r in run],
        [r.wall_seconds for r in run],
    )
    assert spec["speedup"] != pytest.approx(rowwise, rel=1e-12)


def test_too_few_prompts_for_the_batch_is_refused(tmp_path, model_dirs):
    store = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    with pytest.raises(QueueError) as err:
        enqueue(store, model_dirs, [1, 16])
    assert not missing(str(err.value), "batch size 16", "16 prompts", "has 8"), err.value
    assert catalog.experiments(store).empty  # nothing stored


def test_cli_refusals_are_one_line_exit_2(tmp_path, model_dirs, capsys, monkeypatch):
    from app.cli import main

    db = f"sqlite:///{tmp_path / 'cli.db'}"
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS[:3]) + "\n")
    base = [
        "run",
        "--target",
        model_dirs["target"],
        "--draft",
        model_dirs["draft"],
        "--prompts",
        str(prompt_file),
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
        "--db",
        db,
    ]

    def refused(*extra):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, err  # one error line (model loading may print progress bars above it)
        return errors[0]

    for bad in ("0", "-2", "1.5", "४", "257", "1,,4", "4,4"):
        line = refused("--batch-size", bad)
        assert "batch" in line
    line = refused("--batch-size", "1,4")
    assert not missing(line, "--batch-size 4", "4 prompts", "has 3"), line
    import engine.decoding.memory

    monkeypatch.setattr(engine.decoding.memory, "available_bytes", lambda device: 1024)
    line = refused("--batch-size", "2")
    assert "KV cache" in line and "smaller --batch-size" in line
    monkeypatch.undo()
    assert catalog.experiments(open_store(db)).empty  # nothing stored by any refusal


def test_the_worker_refuses_a_batch_that_cannot_fit(tmp_path, model_dirs, monkeypatch):
    import app.worker.timing

    store = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    eid = enqueue(store, model_dirs, [1, 8], repeats=1)
    real = app.worker.timing.check_batch_fits

    def tight(models, device, size, *rest):  # the device has room for batch 1 only
        if size == 1:
            return real(models, device, size, *rest)
        with monkeypatch.context() as m:
            m.setattr("engine.decoding.memory.available_bytes", lambda device: 1024)
            return real(models, device, size, *rest)

    monkeypatch.setattr(app.worker.timing, "check_batch_fits", tight)
    with RecordingWorker(store) as worker:
        worker.work(until_idle=True)
    runs = q.runs(store, eid).set_index("run_id")
    big = runs[runs["batch_size"] == 8]
    assert (big["status"] == "failed").all()
    assert all("KV cache" in e and "smaller --batch-size" in e and "\n" not in e for e in big["error"])
    assert (runs[runs["batch_size"] == 1]["status"] == "done").all()
    with store.read() as conn:  # refused before it ran: not one row decoded
        assert (
            conn.execute(
                text(
                    f"SELECT COUNT(*) FROM prompt_results WHERE run_id IN ({','.join(str(int(i)) for i in big.index)})"
                )
            ).scalar()
            == 0
        )


def test_the_description_bounds_batch_sizes():
    v = VARIABLES["batch_size"]
    assert v.per_value_baseline and v.flag == "--batch-size" and v.parse_list("16,1,4") == [1, 4, 16]
    for bad in ("0", "-1", "2.5", "x", "٣", "257"):
        with pytest.raises(Exception, match="batch"):
            v.parse(bad)


def test_the_kv_estimate_follows_the_config(model_dirs):
    from engine.decoding.memory import batch_kv_bytes, kv_bytes_per_token
    from engine.models.loading import load_pair

    pair = load_pair(model_dirs["target"], model_dirs["draft"], "cpu", "float32", False)
    config = pair.target.model.config
    per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    assert kv_bytes_per_token(pair.target.model) == per_token
    both = per_token + kv_bytes_per_token(pair.draft.model)
    assert batch_kv_bytes([pair.target.model, pair.draft.model], 4, 10, 20, 3) == both * 33 * 4
    assert np.isfinite(both)


def test_an_older_database_gains_the_batch_columns(tmp_path):
    """Schema v9's step: an older database's runs and experiments get batch_size (1: what they ran at) and the
    serving columns, output_tokens its arrival times."""
    import sqlite3

    from tests.test_storage import V1_DDL

    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_DDL)
    store = open_store(f"sqlite:///{path}")
    with store.read() as conn:
        runs = {row[1] for row in conn.execute(text("PRAGMA table_info(runs)"))}
        experiments = {row[1] for row in conn.execute(text("PRAGMA table_info(experiments)"))}
        tokens = {row[1] for row in conn.execute(text("PRAGMA table_info(output_tokens)"))}
        assert conn.execute(text("SELECT batch_size FROM runs")).scalars().all() == [1]
    # the database columns keep their first names (queries.runs gives them SPEC's names with units)
    assert {"batch_size", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "latency_p50", "latency_p95"} <= runs
    assert "batch_size" in experiments and "seconds" in tokens


def test_cli_k_sweep_at_a_fixed_batch_size(tmp_path, model_dirs, capsys):
    """`--batch-size 2 --k 1,2`: every run (the shared baseline too) decodes in batches of 2 and reports its
    serving metrics in the JSON; the outputs equal the baseline's (greedy)."""
    from app.cli import main

    db = f"sqlite:///{tmp_path / 'cli.db'}"
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS[:4]) + "\n")
    assert (
        main(
            [
                "run",
                "--target",
                model_dirs["target"],
                "--draft",
                model_dirs["draft"],
                "--prompts",
                str(prompt_file),
                "--k",
                "1,2",
                "--batch-size",
                "2",
                "--max-new-tokens",
                "8",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--db",
                db,
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert q.experiment(open_store(db), doc["experiment_id"])["batch_size"] == 2
    for entry in [doc["baseline"], *doc["runs"]]:
        assert entry["batch_size"] == 2
        assert 0 < entry["ttft_seconds_p50"] <= entry["ttft_seconds_p95"] <= entry["request_latency_seconds_p95"]
        assert entry["request_latency_seconds_p50"] <= entry["request_latency_seconds_p95"]
        assert entry["itl_seconds_p50"] <= entry["itl_seconds_p95"]
    assert all(entry["outputs_match_baseline"] is True for entry in doc["runs"])
    from app.report import format_table

    lines = format_table(doc).splitlines()  # the human table names each run's batch and serving figures
    assert sum(1 for line in lines if "batch 2: TTFT p50" in line and "latency p95" in line) == 2


def test_the_detail_page_shows_the_serving_table(tmp_path, model_dirs, monkeypatch):
    """The experiment page's Serving table holds each run's stored serving figures."""
    from tests.test_pages import app, assert_clean

    url = f"sqlite:///{tmp_path / 'pages.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    store = open_store(url)
    eid = enqueue(store, model_dirs, [1, 4], repeats=1)
    with RecordingWorker(store) as worker:
        worker.work(until_idle=True)
    at = app("experiment", experiment=eid, section="Serving")
    assert_clean(at)
    assert any(s.value.startswith("Serving") for s in at.subheader)
    shown = next(d.value for d in at.dataframe if "ttft_seconds_p50" in d.value.columns)
    runs = q.runs(store, eid).set_index("run_id")
    for _, row in shown.iterrows():
        for name in (
            "batch_size",
            "tokens_per_second",
            "ttft_seconds_p50",
            "itl_seconds_p95",
            "request_latency_seconds_p95",
        ):
            assert row[name] == pytest.approx(runs.loc[row["run_id"], name]), name


def test_the_worker_refuses_a_model_the_batched_cache_cannot_decode_exactly(tmp_path):
    """MPT's ALiBi is counted in cache columns (engine/attention_masks.batch_support): its batch-2 runs fail with
    that one line before a row decodes; batch 1 runs."""
    from tests import tiny_models
    from tests.test_engine_batched_sliding import ALIBI

    paths = {}
    target = ALIBI["mpt"]()
    for name, model in (("target", target), ("draft", tiny_models.noisy_copy(target, seed=1, noise=0.15))):
        model.save_pretrained(tmp_path / name)
        tiny_models.tokenizer().save_pretrained(tmp_path / name)
        paths[name] = str(tmp_path / name)
    store = open_store(f"sqlite:///{tmp_path / 'q.db'}")
    eid = enqueue(store, paths, [1, 2], repeats=1)
    with RecordingWorker(store) as worker:
        worker.work(until_idle=True)
    runs = q.runs(store, eid).set_index("run_id")
    big = runs[runs["batch_size"] == 2]
    assert (big["status"] == "failed").all() and (runs[runs["batch_size"] == 1]["status"] == "done").all()
    assert all("uses ALiBi" in e and e.endswith("run it at batch size 1") and "\n" not in e for e in big["error"])
    with store.read() as conn:  # refused before it started (app/timing._check_batch): no device, no row decoded
        ids = ",".join(str(int(i)) for i in big.index)
        started = f"SELECT COUNT(*) FROM runs WHERE id IN ({ids}) AND device_name IS NOT NULL"
        assert conn.execute(text(started)).scalar() == 0
        assert conn.execute(text(f"SELECT COUNT(*) FROM prompt_results WHERE run_id IN ({ids})")).scalar() == 0
