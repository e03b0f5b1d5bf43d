"""Names that break code built by pasting text: quotes, apostrophes, `<`, `&`, non-ASCII. What the chart tests
(test_pages_charts.py without a browser, test_browser_charts.py in one) put in every name, label and prompt, and
the database the browser test seeds with them: one finished experiment of each kind, from crafted records (no
model is loaded), production counters beside one, a vLLM confirm of the grid's schedule, and a finished training
job."""

from __future__ import annotations

import os
from typing import Any

NASTY = 'it\'s "quoted" <b>x</b> & 中文 é'  # one string that closes a quote of either kind and opens a tag
NAMES = {
    "k": f"k sweep · {NASTY}",
    "validation": 'held-out check: the draft\'s "best" <k> & é',
    "draft": "draft sweep: 'a' vs \"b\" <&> 中文",
    "drafter": 'drafter sweep — it\'s <all> & "more" é',
    "auto": "k auto: O'Brien's \"guess\" < 5 & 中文",
    "temperature": 'temperature sweep: l\'été "chaud" <hot> &amp;',
    "grid": 'batch × k grid: it\'s "served" <B> & 中文',
}
TARGET = 'target\'s "big" <model> & 中文'
DRAFT = 'draft\'s "small" <model> & é'
DRAFTS = ['d\'raft "one" <1> & 中', "draft 'two' \"2\" <&> é"]  # a draft sweep's values: its runs' labels
PROMPTS_NAME = 'prompts: it\'s "mine" <set> & é.txt'
PROMPT_TEXTS = [f'He said "it\'s <fine> & done" 中文 é {i}' for i in range(3)] + ["x < y && y > 'z' \\ \" é"]
TOKEN_TEXTS = ["it's", ' "q"', " <b>", " &", " 中文", " é", "'", "\\", "</script>", " ${x}"]
TAGS = ("it's", "<b>", "中文")


def _prompt(prompt_index: int, rounds_k: list[int], accepts: list[int], draft_s: float, verify_s: float, length: int):
    """A speculative prompt (engine invariants kept: wall time is the rounds' draft + verify time) whose round r
    drafts rounds_k[r] tokens and accepts accepts[r] of them (both repeated as needed) until its output holds
    `length` tokens, 0, 1, 2, ... as the baseline's (lossless), the last round cut there; token texts from
    TOKEN_TEXTS."""
    from engine.decoding.records import (
        ACCEPTED,
        BONUS,
        CORRECTION,
        DISCARDED,
        REJECTED,
        DraftToken,
        PromptResult,
        Round,
    )

    rounds, next_id, index = [], 0, 0
    while next_id < length:
        k, room = rounds_k[index % len(rounds_k)], length - next_id
        a = min(accepts[index % len(accepts)], k, room)
        texts = [(next_id + i) % len(TOKEN_TEXTS) for i in range(k)]
        outcomes = [ACCEPTED if i < a else REJECTED if i == a < room else DISCARDED for i in range(k)]
        drafts = [
            DraftToken(
                i + 1,
                10 + texts[i],
                TOKEN_TEXTS[texts[i]],
                "english" if i % 2 else "code",
                0.6,
                0.5,
                0.5,
                0.1,
                outcomes[i],
            )
            for i in range(k)
        ]
        emitted = [next_id + i for i in range(min(a + 1, room))]
        next_id += len(emitted)
        rounds.append(
            Round(
                prompt_index,
                index,
                k,
                a,
                emitted,
                [ACCEPTED] * a + [BONUS if a == k else CORRECTION] * (len(emitted) - a),
                draft_s * k,
                verify_s,
                k,
                drafts,
            )
        )
        index += 1
    output = [t for r in rounds for t in r.emitted_ids]
    wall = sum(r.draft_seconds + r.verify_seconds for r in rounds)
    return PromptResult(prompt_index, PROMPT_TEXTS[prompt_index % len(PROMPT_TEXTS)], output, "x", wall, rounds=rounds)


def _baseline(prompt_index: int, tokens: int, step: float = 0.010):
    from engine.decoding.records import PromptResult

    return PromptResult(
        prompt_index,
        PROMPT_TEXTS[prompt_index % len(PROMPT_TEXTS)],
        list(range(tokens)),
        "x",
        tokens * step,
        decode_steps=tokens,
        decode_seconds=tokens * step,
    )


PROMPTS = len(PROMPT_TEXTS)
GRID_VERIFY = 0.25  # a verify forward's extra cost per extra row and draft token (batch 1: none)
ACCEPTS = [3, 1, 2, 0, 4, 2]  # per round, cut at the round's k


def _fill(store, experiment_id: int, varying_k: bool = False) -> dict[int, str]:
    """Record every queued run of an experiment from crafted prompts and close it as done; a drafter that varies
    k drafts 1..k tokens round by round; a speculative run's verify forward costs more the larger its batch size
    and k (GRID_VERIFY), so a grid's schedule switches speculation off at its largest batch size. Returns
    {run_id: its label}."""
    from storage.jobs import run_state
    from storage.records import queries as q
    from storage.records.recording import record_prompt

    runs = q.runs(store, experiment_id)
    todo = runs[runs["status"] == "queued"]
    labels = {}
    run_state.claim_group(store, experiment_id, "seed")  # every queued run of the experiment, as a worker does
    for run in todo.itertuples():
        run_state.start_run(store, int(run.run_id), PROMPTS, "cpu")
        if run.kind == "baseline":  # prompt i: 14 + i tokens, which every speculative run reproduces
            results = [_baseline(i, 14 + i) for i in range(PROMPTS)]
        else:
            k = int(run.k)
            varies = varying_k and str(run.drafter).split(":")[0] != "model"
            rounds_k = [max(1, k - (r % k)) if varies else k for r in range(6)]
            verify = 0.011 * (1 + GRID_VERIFY * (int(run.batch_size) - 1) * k)
            results = [_prompt(i, rounds_k, ACCEPTS, 0.001, verify * (1 + 0.1 * i), 14 + i) for i in range(PROMPTS)]
        with store.write() as conn:
            for result in results:
                texts = [TOKEN_TEXTS[t % len(TOKEN_TEXTS)] for t in range(len(result.output_ids))]
                record_prompt(conn, int(run.run_id), run.kind, result, texts)
        run_state.finish_run(store, int(run.run_id), "done")
        labels[int(run.run_id)] = run.sweep_label
    return labels


def seed(store, models_dir) -> dict:
    """One finished experiment of each kind, every name, label, draft, target, prompt and token text holding
    NASTY's characters; and a finished training job. Returns {kind: experiment id, "job": job id}."""
    from storage.jobs import training
    from storage.jobs.experiments import add_k_runs, enqueue_experiment, set_predicted_curve

    common: dict[str, Any] = dict(
        target=TARGET,
        prompts=PROMPTS_NAME,
        sampling={"max_new_tokens": 16},
        prompt_texts=PROMPT_TEXTS,
        tags=TAGS,
        notes=f"notes: {NASTY}",
        device="cpu",
    )
    ids = {}
    ids["k"] = enqueue_experiment(
        store, **{**common, "prompts": "code:tune"}, name=NAMES["k"], draft=DRAFT, sweep_values=[1, 2, 4]
    )
    ids["validation"] = enqueue_experiment(
        store,
        **{**common, "prompts": "code:validation"},
        name=NAMES["validation"],
        draft=DRAFT,
        sweep_values=[2],
        validates=ids["k"],
    )
    ids["draft"] = enqueue_experiment(
        store, **common, name=NAMES["draft"], draft=DRAFT, sweep_variable="draft", sweep_values=DRAFTS, k=2
    )
    ids["drafter"] = enqueue_experiment(
        store,
        **common,
        name=NAMES["drafter"],
        draft=DRAFT,
        sweep_variable="drafter",
        sweep_values=["model", "confidence:0.3", "prompt-lookup:3"],
        k=3,
    )
    ids["temperature"] = enqueue_experiment(
        store,
        **common,
        name=NAMES["temperature"],
        draft=DRAFT,
        sweep_variable="temperature",
        sweep_values=[0.0, 0.7],
        k=2,
    )
    # A batch × k grid: the k sweep at batch sizes 1, 2 and 4, each with its own baseline (k schedule).
    ids["grid"] = enqueue_experiment(
        store, **common, name=NAMES["grid"], draft=DRAFT, sweep_values=[1, 2, 4], batch_sizes=[1, 2, 4]
    )
    for kind in ("k", "validation", "draft", "drafter", "temperature", "grid"):
        _fill(store, ids[kind], varying_k=kind == "drafter")
    # Predicted curves per batch size, as `--k auto --batch-size 1,2,4` stores them: the k schedule draws them dashed.
    by_size: dict[int, tuple[dict[int, float], list[int]]] = {
        b: ({k: 1.6 - 0.2 * b - 0.05 * k for k in range(1, 5)}, []) for b in (1, 2, 4)
    }
    set_predicted_curve(store, ids["grid"], by_size[1][0], [], by_batch_size=by_size)
    # `--k auto`: k = 4 measured first, the predicted curve, then the confirmations at k = 2 and 3.
    ids["auto"] = enqueue_experiment(store, **common, name=NAMES["auto"], draft=DRAFT, sweep_values=[4], k_auto=4)
    _fill(store, ids["auto"])
    set_predicted_curve(store, ids["auto"], {1: 1.3, 2: 1.9, 3: 2.2, 4: 2.3}, [2, 3])
    add_k_runs(store, ids["auto"], [2, 3])
    _fill(store, ids["auto"])

    # Production counters imported against the k sweep's k = 4 run (`draftlab import-metrics`), named by people.
    from storage.records import production

    for label, accepted in ((f"vLLM prod: {NASTY}", (80, 50, 30, 12)), ("canary 'b' <2> & é", (70, 40, 20, 8))):
        production.add_series(
            store,
            ids["k"],
            drafts=100,
            draft_tokens=400,
            accepted=sum(accepted),
            per_position=dict(enumerate(accepted, start=1)),
            label=label,
            source="http://server/metrics?q='x'&y=<z>",
            engine="vllm",
            seconds=60.0,
        )

    ids["confirm"] = seed_confirm(store, ids["grid"])

    job = training.enqueue_training(
        store,
        name="browser-draft",
        target=TARGET,
        draft=DRAFT,
        prompts=PROMPTS_NAME,
        validation=f"held-out: {NASTY}",
        steps=4,
        models=models_dir,
        notes=f"notes: {NASTY}",
    )
    assert training.claim_job(store, job, "seed")
    training.report(
        store,
        job,
        "seed",
        points=[
            {"step": s, "loss": 1.0 / s, "lr": 3e-4, "seconds": 0.1 * s, "kl": 0.9 / s if s % 2 == 0 else None}
            for s in range(1, 5)
        ],
        step=4,
        progress=1.0,
    )
    training.finish_job(
        store,
        job,
        "done",
        worker_id="seed",
        kl_before=1.2,
        kl_after=0.4,
        alpha_before=0.5,
        alpha_after=0.7,
        tokens_per_round_before=1.8,
        tokens_per_round_after=2.4,
        eval_k=4,
    )
    ids["job"] = job
    return ids


def seed_confirm(store, experiment_id: int, concurrency=(1, 2, 4), passes: int = 2) -> int:
    """A finished confirm of the experiment (its schedule if it has one, else its chosen run) as `draftlab confirm`
    stores it, from crafted passes: the speculative server twice as fast at concurrency 1 and slower from 4 on, its
    counters per position, outputs equal to its target-only ones. Returns the confirm id."""
    import json

    from app.serving.completions_load import PassRecord, RequestRecord
    from app.serving.production_scrape import SpecCounters
    from storage.records.confirms import add_measurement, finish_confirm, pass_speedup, start_confirm, summarize
    from storage.serving.deploy import deploy_document

    doc = deploy_document(store, experiment_id)
    label = "schedule" if "schedule" in doc else "chosen"
    config = doc["engines"]["vllm"]["speculative_config"]
    k = int(json.loads(config)["num_speculative_tokens"])

    def passes_of(step: float, per_chunk: int) -> list:
        records = []
        for p in range(passes):
            requests = [
                RequestRecord(
                    prompt_index=i,
                    sent=0.0,
                    arrivals=[step * (j + 1) * (1 + 0.05 * p) for j in range(8)],
                    counts=[per_chunk] * 8,
                    token_ids=list(range(8 * per_chunk)),
                )
                for i in range(PROMPTS)
            ]
            records.append(PassRecord(1, step * 8 * (1 + 0.05 * p), requests))
        return records

    cid = start_confirm(
        store, experiment_id, configs=label, concurrency=list(concurrency), repeats=passes, launched_by=f"local {NASTY}"
    )
    for c in concurrency:
        base = passes_of(0.02, 1)
        spec = passes_of(0.01 * (1 + 0.4 * (c - 1)), 1)
        counters = SpecCounters(
            drafts=100,
            draft_tokens=100 * k,
            accepted=70 + 30 * (k - 1),
            per_position={j: max(1, 80 - 25 * (j - 1)) for j in range(1, k + 1)},
        )
        add_measurement(
            store,
            cid,
            experiment_id,
            label=label,
            k=k,
            run_id=int(doc["run_id"]),
            speculative_config=config,
            concurrency=c,
            passes=spec,
            figures=summarize(spec),
            speedup=pass_speedup(base, spec),
            counters=counters,
            matches={
                "outputs_match_server_baseline": 1.0,
                "outputs_match_lab": 0.5,
                "first_divergence": f"prompt 1 differs from the lab at token 3 ({NASTY})",
            },
        )
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
    finish_confirm(store, cid, engine_version="0.32.0", wall_seconds=95.0, errors=[])
    return cid


def idle_worker(store) -> None:
    """Register this process as a live worker, so `draftlab ui` starts no local worker of its own (nothing is
    queued: it would only load its libraries on the shared CPU)."""
    from storage.jobs import liveness

    liveness.register_worker(store, "chart-test (idle)", liveness.host_identity(), os.getpid())
