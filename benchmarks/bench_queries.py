"""Times every storage query on a SQLite database holding 1M synthetic draft-token rows.

    python benchmarks/bench_queries.py [--db PATH] [--tokens 1000000] [--repeats 5]

The database is filled through storage.records.recording.record_prompt (the worker's own write path), one
transaction per prompt. Each query must take < 1 s (median of --repeats); the exit status is 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.decoding.records import ACCEPTED, BONUS, CORRECTION, DISCARDED, REJECTED, DraftToken, PromptResult, Round  # noqa: E402

TOKEN_TYPES = ("code", "english", "whitespace", "number", "punctuation", "chinese", "special", "other")
LIMIT_SECONDS = 1.0


def synthetic_prompt(
    rng: random.Random,
    prompt_index: int,
    k: int,
    rounds: int,
    vocab: int = 4000,
    alpha: float = 0.7,
    nan_kl: float = 0.05,
    follow: list[int] | None = None,
) -> PromptResult:
    """A speculative PromptResult with the engine's invariants: a_r accepted drafts, then one rejected
    (unless all k were accepted: a bonus), the rest discarded; a round emits a_r + 1 tokens. `follow`: the
    target-only output a lossless greedy run reproduces token for token: rounds go on until it is complete, and the
    last one is cut at its length as max_new_tokens cuts it (drafts past the cut discarded)."""
    output = [follow[0] if follow else rng.randrange(vocab)]
    round_list = []
    round_index = 0
    while round_index < rounds if follow is None else len(output) < len(follow):
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        room = k + 1 if follow is None else len(follow) - len(output)  # slots left before the cut
        target = follow[len(output) : len(output) + room] if follow else []
        accepted = min(accepted, room)
        drafts = []
        for position in range(1, k + 1):
            token = target[position - 1] if follow and position <= accepted else rng.randrange(vocab)
            outcome = ACCEPTED if position <= accepted else REJECTED if position == accepted + 1 <= room else DISCARDED
            drafts.append(
                DraftToken(
                    position,
                    token,
                    f"tok{token}",
                    TOKEN_TYPES[token % len(TOKEN_TYPES)],
                    rng.random(),
                    rng.random(),
                    rng.random(),
                    float("nan") if rng.random() < nan_kl else rng.random() * 2,
                    outcome,
                    target_entropy=(position + token % 5) / 3,  # not from rng: the draws stay as they were
                )
            )
        last = [] if accepted == room else [target[accepted] if follow else rng.randrange(vocab)]
        emitted = [d.token_id for d in drafts[:accepted]] + last
        kinds = [ACCEPTED] * accepted + ([CORRECTION if accepted < k else BONUS] if last else [])
        round_list.append(
            Round(
                prompt_index,
                round_index,
                k,
                accepted,
                emitted,
                kinds,
                rng.uniform(1e-3, 5e-3),
                rng.uniform(5e-3, 2e-2),
                k,
                drafts,
            )
        )
        output += emitted
        round_index += 1
    return PromptResult(
        prompt_index,
        f"synthetic prompt {prompt_index}",
        output,
        " ".join(f"tok{t}" for t in output),
        rng.uniform(0.5, 2.0),
        rounds=round_list,
    )


def synthetic_baseline(rng: random.Random, prompt_index: int, new_tokens: int, vocab: int = 4000) -> PromptResult:
    output = [rng.randrange(vocab) for _ in range(new_tokens)]
    wall = rng.uniform(1.0, 3.0)
    return PromptResult(
        prompt_index,
        f"synthetic prompt {prompt_index}",
        output,
        " ".join(f"tok{t}" for t in output),
        wall,
        decode_steps=new_tokens - 1,
        decode_seconds=wall * 0.95,
    )


def record(store, run_id: int, kind: str, result: PromptResult) -> None:
    from storage.records.recording import record_prompt

    with store.write() as conn:
        record_prompt(conn, run_id, kind, result, [f"tok{t}" for t in result.output_ids])


def fill(store, tokens: int, k: int = 8, prompts: int = 500, other_experiments: int = 50, seed: int = 0) -> dict:
    """One experiment whose k=8 run holds `tokens` draft tokens, plus small experiments for the list views."""
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q

    rng = random.Random(seed)
    rounds_per_prompt = max(1, tokens // (prompts * k))
    prompt_texts = [f"synthetic prompt {i}" for i in range(prompts)]
    experiment_id = enqueue_experiment(
        store,
        name="bench",
        target="bench-target",
        draft="bench-draft",
        prompts="synthetic",
        sampling={"temperature": 0.0, "max_new_tokens": 4096},
        sweep_values=[k],
        prompt_texts=prompt_texts,
        tags=["bench"],
    )
    run_ids = {r.kind: int(r.run_id) for r in q.runs(store, experiment_id).itertuples()}
    assert sorted(run_state.claim_group(store, experiment_id, "bench")) == sorted(run_ids.values())
    for kind, run_id in run_ids.items():
        run_state.start_run(store, run_id, prompts, "cpu")
        for i in range(prompts):
            result = (
                synthetic_prompt(rng, i, k, rounds_per_prompt)
                if kind == "speculative"
                else synthetic_baseline(rng, i, rounds_per_prompt * 4)
            )
            record(store, run_id, kind, result)
        run_state.finish_run(store, run_id, "done")
    for e in range(other_experiments):
        eid = enqueue_experiment(
            store,
            name=f"small {e}",
            target="t",
            draft="d",
            prompts="synthetic",
            sampling={},
            sweep_values=[1, 2, 4],
            prompt_texts=prompt_texts[:4],
            tags=["small", f"group{e % 5}"],
        )
        run_state.claim_group(store, eid, "bench")
        for r in q.runs(store, eid).itertuples():
            for i in range(4):
                result = (
                    synthetic_prompt(rng, i, int(r.k), 5) if r.kind == "speculative" else synthetic_baseline(rng, i, 20)
                )
                record(store, int(r.run_id), r.kind, result)
            run_state.finish_run(store, int(r.run_id), "done")
    return {
        "experiment_id": experiment_id,
        "run_id": run_ids["speculative"],
        "baseline_id": run_ids["baseline"],
        "rounds_per_prompt": rounds_per_prompt,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="/tmp/draftlab-bench.db", help="SQLite file (recreated)")
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    from sqlalchemy import text

    from storage import open_store
    from storage.analysis import catalog
    from storage.records import queries as q

    path = Path(args.db)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    store = open_store(f"sqlite:///{path}")
    t0 = time.perf_counter()
    ids = fill(store, args.tokens)
    fill_seconds = time.perf_counter() - t0
    with store.read() as conn:
        n_tokens = conn.execute(text("SELECT COUNT(*) FROM draft_tokens")).scalar_one()
        n_rounds = conn.execute(text("SELECT COUNT(*) FROM rounds")).scalar_one()
    with store.engine.connect() as conn:  # fold the WAL into the file so the size below is real
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    print(
        f"filled {n_tokens:,} draft-token rows, {n_rounds:,} rounds in {fill_seconds:.1f}s "
        f"({n_tokens / fill_seconds:,.0f} rows/s); database {path.stat().st_size / 2**20:.0f} MiB"
    )

    eid, rid = ids["experiment_id"], ids["run_id"]
    cases = [
        ("experiments()", lambda: catalog.experiments(store)),
        ("experiments(tag=)", lambda: catalog.experiments(store, tag="group3")),
        ("experiment(id)", lambda: q.experiment(store, eid)),
        ("runs(experiment)", lambda: q.runs(store, eid)),
        ("run_summary(run)", lambda: q.run_summary(store, rid)),
        ("sweep_curve(experiment)", lambda: q.sweep_curve(store, eid)),
        ("acceptance_by_position", lambda: q.acceptance_by_position(store, rid)),
        ("acceptance_by_type", lambda: q.acceptance_by_type(store, rid)),
        ("top_rejected_tokens", lambda: q.top_rejected_tokens(store, rid, limit=20)),
        ("per_prompt", lambda: q.per_prompt(store, rid)),
        ("prompt_output", lambda: q.prompt_output(store, rid, 250)),
        ("round_proposals", lambda: q.round_proposals(store, rid, 250, ids["rounds_per_prompt"] // 2)),
        ("outputs(run)", lambda: q.outputs(store, rid)),
    ]
    print(f"{'query':<26} {'rows':>6} {'median ms':>10} {'max ms':>8}  (< {LIMIT_SECONDS * 1000:.0f} ms each)")
    slow = []
    for name, call in cases:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            frame = call()
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        rows = len(frame) if hasattr(frame, "__len__") else 1
        flag = "" if median < LIMIT_SECONDS else "  SLOW"
        print(f"{name:<26} {rows:>6} {median * 1000:>10.1f} {max(times) * 1000:>8.1f}{flag}")
        if median >= LIMIT_SECONDS:
            slow.append(name)
    start = time.perf_counter()
    exported = q.draft_token_rows(store, eid)
    print(f"(export, not interactive) draft_token_rows: {len(exported):,} rows in {time.perf_counter() - start:.1f}s")
    if slow:
        print(f"over {LIMIT_SECONDS:g}s: {', '.join(slow)}")
        return 1
    print("all queries under 1 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
