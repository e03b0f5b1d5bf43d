"""A server cost profile stored from crafted passes, as `draftlab profile` stores one (storage/records/confirms.py),
without a server: the target alone at each concurrency and the run's drafter at each k beside it, every pass with
its decode seconds and engine steps. Each step of the target alone takes STEP · (1 + 0.5 · (c − 1) / 4) seconds at
concurrency c and a speculative one ratio(c) · k more, so the cost ratio a prediction uses is
t_k / t_0 = 1 + ratio(c) · k exactly: RATIO at concurrency 1, twice that at 4 (speculation costs more the more
requests share a step)."""

from __future__ import annotations

import json

STEP = 0.02  # seconds of a target-alone step at concurrency 1
RATIO = 0.3  # a speculative step at k costs (1 + RATIO · k) target steps
STEPS_PER_REQUEST = 7  # engine steps after each request's first chunk


def ratio(concurrency: int) -> float:
    """A speculative step's extra cost per draft token, in target-alone steps, at this concurrency."""
    return RATIO * (1 + (concurrency - 1) / 3)


def step_seconds(concurrency: int, k: int) -> float:
    return STEP * (1 + 0.5 * (concurrency - 1) / 4) * (1 + ratio(concurrency) * k)


def _passes(concurrency: int, k: int, passes: int, prompts: int, per_step: int) -> list:
    from app.serving.completions_load import PassRecord, RequestRecord

    records = []
    for p in range(passes):
        step = step_seconds(concurrency, k) * (1 + 0.02 * p)  # the same pass-to-pass drift on every server
        requests = [
            RequestRecord(
                prompt_index=i,
                sent=0.0,
                arrivals=[step * j for j in range(1, STEPS_PER_REQUEST + 2)],
                counts=[1] + [per_step] * STEPS_PER_REQUEST,
                token_ids=list(range(1 + per_step * STEPS_PER_REQUEST)),
            )
            for i in range(prompts)
        ]
        records.append(
            PassRecord(
                concurrency,
                step * (STEPS_PER_REQUEST + 1) * prompts / concurrency,
                requests,
                decode_steps=STEPS_PER_REQUEST * prompts,
            )
        )
    return records


def filled_sweep(store, ks, prompts: int = 3, seed: int = 5, **kw) -> tuple[int, dict]:
    """A finished greedy k sweep (tests/test_storage.py's enqueue, its keyword arguments: drafter, target, ...),
    every run lossless: (experiment id, {(kind, k): run id})."""
    import random

    from benchmarks.bench_queries import synthetic_baseline, synthetic_prompt
    from storage.jobs import run_state
    from tests.test_storage import enqueue, record, run_ids

    rng = random.Random(seed)
    eid = enqueue(store, ks, prompts, **kw)
    ids = run_ids(store, eid)
    baseline = [synthetic_baseline(rng, i, 12) for i in range(prompts)]
    assert sorted(run_state.claim_group(store, eid, "test-worker")) == sorted(ids.values())
    for (kind, k), rid in sorted(ids.items(), key=lambda kv: kv[0][0] != "baseline"):
        run_state.start_run(store, rid, prompts, "cpu")
        for i, base in enumerate(baseline):
            row = base if kind == "baseline" else synthetic_prompt(rng, i, k, rounds=6, follow=base.output_ids)
            record(store, rid, kind, row)
        run_state.finish_run(store, rid, "done")
    return eid, ids


def store_profile(
    store,
    experiment_id: int,
    run_id: int,
    *,
    concurrency=(1, 4),
    ks=(1, 2, 3, 4),
    passes: int = 3,
    prompts: int = 3,
    hardware: str = "test CPU × 2",
    engine_version: str = "0.32.0",
) -> int:
    """A finished profile of `run_id`'s drafter (its deploy settings' speculative config, as `draftlab profile
    --run` serves it) for its experiment's target; returns its id."""
    from storage.records import queries as q
    from storage.records.confirms import add_measurement, describe_confirm, finish_confirm, start_confirm, summarize
    from storage.serving.deploy import deploy_document

    spec = json.loads(deploy_document(store, experiment_id, run_id)["engines"]["vllm"]["speculative_config"])
    target = str((q.experiment(store, experiment_id) or {})["target"])
    cid = start_confirm(store, experiment_id, configs="profile", concurrency=list(concurrency), repeats=passes)
    describe_confirm(store, cid, hardware=hardware, target=target)
    for c in concurrency:
        base = _passes(c, 0, passes, prompts, 1)
        add_measurement(
            store,
            cid,
            experiment_id,
            label="target-only",
            k=0,
            run_id=None,
            speculative_config=None,
            concurrency=c,
            passes=base,
            figures=summarize(base),
        )
        for k in ks:
            served = _passes(c, k, passes, prompts, 2)
            add_measurement(
                store,
                cid,
                experiment_id,
                label=f"k={k}",
                k=k,
                run_id=run_id,
                speculative_config=json.dumps({**spec, "num_speculative_tokens": k}),
                concurrency=c,
                passes=served,
                figures=summarize(served),
            )
    finish_confirm(store, cid, engine_version=engine_version, wall_seconds=60.0, errors=[])
    return cid
