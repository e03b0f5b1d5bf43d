"""The timing executor: one experiment's claimed runs timed together, prompt-major (timing protocol v2,
docs/metrics.md), on the job's models, each prompt's rows committed in one transaction fenced to the worker
that owns the runs. The Worker (app/worker/worker.py) claims the runs, calls time_group, and closes them.
"""

from __future__ import annotations

import traceback

import torch

from app.runtime.job_context import JobContext
from app.runtime.model_cache import LoadedPair, SetupError
from app.runtime.placement import device_name, gpus_of
from engine.config.drafter_specs import DEFAULT_DRAFTER, needs_draft_model
from engine.config.run_config import RunConfig
from engine.decoding.attention_masks import batch_support
from engine.decoding.baseline import TargetOnlyDecoder
from engine.decoding.memory import check_batch_fits, model_bytes
from engine.decoding.profile import batched_verify_profile, verify_profile
from engine.decoding.protocol import interleaved_order
from engine.decoding.records import PromptResult
from engine.decoding.runs import WARMUP_TOKENS, baseline_decoder, encode_prompts, speculative_decoder
from engine.decoding.sampling import SamplingConfig
from engine.decoding.speculative import SpeculativeDecoder
from engine.errors import DraftLabError, RunCancelled
from engine.models.loading import ModelPair
from engine.models.vocab_bridge import stamp
from engine.text.chat import render
from engine.text.prompt_sets import load_prompts
from engine.text.token_types import TokenTyper, code_prompts
from storage.db.schema import BASELINE, CANCELLED, FAILED
from storage.jobs import run_state
from storage.jobs.experiments import (
    load_experiment_prompts,
    load_verify_profiles,
    store_prompts,
    store_verify_profile,
    store_verify_profiles,
)
from storage.records.queries import grid_sizes
from storage.records.recording import clear_from, record_prompt

LOST = "lost"  # a run this worker no longer owns (swept as stale and taken over): nothing of it is written


def _reset_peak(pair: ModelPair, decoder) -> None:
    for gpu in gpus_of(pair):
        torch.cuda.reset_peak_memory_stats(gpu)
    decoder.reset_peak_cache_bytes()


def _peak_mb(pair: ModelPair, decoder) -> float:
    """One decode's peak memory: torch's peak allocation on CUDA, summed over the GPUs the pair is on (reset
    before each decode, so runs of an experiment do not inherit each other's peaks); on CPU, where RSS cannot be
    reset, the bytes of the models the arm uses plus its peak KV caches."""
    if pair.device.type == "cuda":
        return sum(torch.cuda.max_memory_allocated(gpu) for gpu in gpus_of(pair)) / 2**20
    return arm_memory_bytes(pair, decoder) / 2**20


def arm_memory_bytes(pair: ModelPair, decoder) -> int:
    """Parameters and buffers of the target (and of the draft when the arm drafts with it), plus the peak
    KV-cache bytes of the decode."""
    models = [pair.target.model]
    drafter_lm = getattr(getattr(decoder, "drafter", None), "lm", None)
    if drafter_lm is not None:
        models.append(drafter_lm.model)
    return sum(model_bytes(m) for m in models) + decoder.peak_cache_bytes()


def _draft_parameters(decoder) -> int | None:
    """Parameters of the draft model a decoder drafts with (None: a baseline, or a drafter with no model)."""
    lm = getattr(getattr(decoder, "drafter", None), "lm", None)
    return sum(p.numel() for p in lm.model.parameters()) if lm is not None else None


def _with_vocab(decoder, results: list[PromptResult]) -> list[PromptResult]:
    """A speculative decoder's results stamped with its pair's vocabulary (engine/models/vocab_bridge.py's `stamp`)."""
    if not isinstance(decoder, SpeculativeDecoder):
        return results
    lm = getattr(decoder.drafter, "lm", None)
    return stamp(results, lm.model if lm is not None else None)


def _drafter_of(run: dict, experiment: dict) -> str:
    return run.get("drafter") or experiment.get("drafter") or DEFAULT_DRAFTER


def _draft_of(run: dict, experiment: dict) -> str | None:
    """The run's draft model: None when its drafter drafts without one (engine/config/drafter_specs.py's needs_model);
    runs stored before drafts were recorded per run use the experiment's."""
    if not needs_draft_model(_drafter_of(run, experiment)):
        return None
    return run.get("draft") or experiment["draft"]


def primary_draft(experiment: dict, runs) -> str | None:
    """The draft loaded with the target: the first speculative run's that needs one (None if none does)."""
    for run in runs:
        if run["kind"] != BASELINE and needs_draft_model(_drafter_of(run, experiment)):
            return _draft_of(run, experiment)
    if experiment.get("sweep_variable") == "draft" or not experiment.get("draft"):
        return None
    return experiment["draft"] if needs_draft_model(experiment.get("drafter") or DEFAULT_DRAFTER) else None


def run_label(run: dict) -> str:
    """How the worker's log names a run: `run 7 (speculative, k=4, batch 2)`; the batch size always, since a grid's
    runs differ by nothing else."""
    batch = run.get("batch_size")
    return (
        f"run {run['id']} ({run['kind']}"
        + (f", k={run['k']}" if run["k"] else "")
        + (f", batch {int(batch)})" if batch is not None else ")")
    )


def time_group(job: JobContext, experiment: dict, group: dict[int, dict], outcome: dict, memory: dict) -> None:
    """Time the claimed runs of one experiment together, prompt-major (timing protocol v2): load the pair, encode
    the prompts, one untimed warm-up per arm, then per prompt every arm's repeats in the protocol's order, each
    prompt committed in one fenced transaction. Writes each run's end into `outcome` (run id -> (status, error,
    detail)) and its peak memory into `memory`; SetupError for what every run would hit."""
    loaded = job.models.pair(experiment, primary_draft(experiment, group.values()), job.gpus)
    prompts = _prompts(job, experiment, loaded.pair.tokenizer)
    typer = loaded.typer.with_code_prompts(_code_prompts(experiment))
    repeats = int(experiment["repeats"] or 1)
    batched = is_batched(experiment, group)
    decoders: dict[int, TargetOnlyDecoder | SpeculativeDecoder] = {}
    budgets = {}
    for rid, run in group.items():
        try:  # the run's own configuration (engine/config/run_config.py): every parameter the engine's sampling takes
            config = RunConfig.of_run(run, experiment)
            cfg, draft_dtype = config.sampling(), config.value("draft_dtype")  # the draft's precision: how it loads
        except DraftLabError as exc:
            outcome[rid] = (FAILED, str(exc), None)
            continue
        encoded_key = (experiment["id"], cfg.max_new_tokens)
        if encoded_key not in loaded.encoded:
            try:
                loaded.encoded[encoded_key] = encode_prompts(loaded.pair, prompts, cfg.max_new_tokens)
            except DraftLabError as exc:
                raise SetupError(str(exc)) from exc
        try:
            if batched:
                _check_batch(loaded, job, experiment, run, prompts, loaded.encoded[encoded_key], cfg, draft_dtype)
            if run["kind"] == BASELINE:
                decoders[rid] = baseline_decoder(loaded.pair, cfg)
            else:
                drafter = _drafter_of(run, experiment)
                pair = job.models.pair_for(loaded, _draft_of(run, experiment), experiment, draft_dtype)
                decoders[rid] = speculative_decoder(pair, cfg, run["k"], typer, drafter=drafter)
        except DraftLabError as exc:
            outcome[rid] = (FAILED, str(exc), None)
            continue
        budgets[rid] = (loaded.encoded[encoded_key], cfg.max_new_tokens)
    start = {rid: group[rid]["prompts_done"] or 0 for rid in decoders}  # resume: first unfinished prompt

    def prepare():
        with job.store.write() as conn:
            for rid in decoders:
                clear_from(conn, rid, start[rid])
        for rid in decoders:
            run_state.start_run(
                job.store,
                rid,
                len(prompts),
                device_name(loaded.pair.device, job.device, job.leased),
                draft_parameters=_draft_parameters(decoders[rid]),
            )

    job.retry(prepare)
    if experiment["k_auto"] and decoders:
        _profile_verify(job, experiment, loaded, next(iter(budgets.values()))[0], batched)

    _time_units(job, group, outcome, memory, loaded, prompts, repeats, decoders, budgets, start)


def _code_prompts(experiment: dict) -> frozenset[int]:
    """The experiment's prompts from a code set (their draft tokens are typed as code); none when its prompt spec no
    longer loads (its frozen prompts still run): the context then comes from code fences alone."""
    try:
        return code_prompts(experiment["prompts"] or "")
    except DraftLabError:
        return frozenset()


def batch_size_of(run: dict) -> int:
    return int(run.get("batch_size") or 1)


def is_batched(experiment: dict, group: dict[int, dict]) -> bool:
    """Whether an experiment measures batch sizes: a batch-size sweep or grid, or a fixed batch size above 1 (its
    batch sizes are checked against the prompt count and memory, and its verify profile is kept per batch size).
    Every experiment decodes through the same loop; batch 1 is its one-row case."""
    return (
        experiment.get("sweep_variable") == "batch_size"
        or bool(experiment.get("batch_sizes"))
        or any(batch_size_of(r) > 1 for r in group.values())
    )


def _check_batch(
    loaded: LoadedPair,
    job: JobContext,
    experiment: dict,
    run: dict,
    prompts: list[str],
    prompt_ids: list,
    cfg: SamplingConfig,
    draft_dtype: str,
) -> None:
    """Refuse a batch size before it runs: more rows than prompts (never silently a smaller batch), a model the
    batched cache cannot decode exactly (engine/decoding/attention_masks.py), or KV caches that cannot fit in what the
    device has free (engine/decoding/memory.py)."""
    size = batch_size_of(run)
    if size > len(prompts):
        raise DraftLabError(
            f"batch size {size} needs at least {size} prompts but the prompt set has {len(prompts)}; "
            f"use --batch-size {len(prompts)} or less, or more prompts"
        )
    models = [loaded.pair.target.model]
    if run["kind"] != BASELINE and needs_draft_model(_drafter_of(run, experiment)):
        draft = job.models.pair_for(loaded, _draft_of(run, experiment), experiment, draft_dtype).draft
        if draft is not None:
            models.append(draft.model)
    for model in models if size > 1 else ():
        if why := batch_support(model):
            raise DraftLabError(why)
    longest = max(int(ids.shape[-1]) for ids in prompt_ids)
    check_batch_fits(
        models,
        loaded.pair.device,
        size,
        longest,
        cfg.max_new_tokens,
        int(run["k"] or 0) if run["kind"] != BASELINE else 0,
    )


def _time_units(
    job: JobContext,
    group: dict[int, dict],
    outcome: dict,
    memory: dict,
    loaded: LoadedPair,
    prompts: list[str],
    repeats: int,
    decoders: dict,
    budgets: dict,
    start: dict,
) -> None:
    """Timing protocol v2, the unit being a batch of B prompts (one prompt at batch 1; prompts grouped in order into
    batches of B, the last batch holding what is left): the arms of one batch size (its baseline and speculative runs)
    decode each unit `repeats` times, interleaved in the protocol's rotated order, one untimed warm-up per arm; the
    median repeat (by the unit's wall time, its longest row's) is recorded row by row, every repeat's timings kept, and
    each unit is committed in one fenced transaction (every arm's rows, or none). Batch sizes run one after another."""
    total = len(prompts)
    warmed: set[int] = set()
    for size in sorted({batch_size_of(group[rid]) for rid in decoders}):
        members = [rid for rid in decoders if batch_size_of(group[rid]) == size]
        for unit, first in enumerate(range(0, total, size)):
            last = min(first + size, total)
            arms = [rid for rid in members if rid not in outcome and start[rid] <= first]
            if not arms:
                continue
            indices = list(range(first, last))
            timed: dict[int, list] = {rid: [] for rid in arms}
            slots: dict[int, list] = {rid: [] for rid in arms}
            for slot, (repeat, rid) in enumerate(interleaved_order(arms, unit, repeats)):
                if rid in outcome:
                    continue
                prompt_ids, budget = budgets[rid]
                decoder = decoders[rid]
                unit_args = (prompts[first:last], prompt_ids[first:last], indices)
                try:
                    if rid not in warmed:  # one untimed warm-up per arm (SPEC timing protocol)
                        decoder.generate_batch(*unit_args, max_new_tokens=min(WARMUP_TOKENS, budget))
                        warmed.add(rid)
                    tick = _unit_progress(job, group[rid], first, last, repeat, repeats, total, budget)
                    _reset_peak(loaded.pair, decoder)
                    timed[rid].append(_with_vocab(decoder, decoder.generate_batch(*unit_args, on_progress=tick)))
                    memory[rid] = max(memory.get(rid, 0.0), _peak_mb(loaded.pair, decoder))
                    slots[rid].append(slot)
                except RunCancelled:
                    outcome[rid] = (CANCELLED, None, None)
                except torch.cuda.OutOfMemoryError:
                    fix = (
                        f"at batch size {size}; use a smaller --batch-size or fewer --max-new-tokens"
                        if size > 1
                        else "; lower max-new-tokens, use dtype bfloat16/float16 or a smaller model"
                    )
                    outcome[rid] = (
                        FAILED,
                        f"CUDA out of memory in {run_label(group[rid])}{' ' if size > 1 else ''}{fix}",
                        traceback.format_exc(),
                    )
                    torch.cuda.empty_cache()
                except DraftLabError as exc:
                    outcome[rid] = (FAILED, str(exc), traceback.format_exc())
                finally:
                    job.live_progress.pop(rid, None)
            finished = [rid for rid in arms if rid not in outcome and len(timed[rid]) == repeats]

            def commit(first=first, finished=finished, timed=timed, slots=slots):
                # Only runs this worker still owns are written, and a unit already committed (a commit whose
                # answer was lost) is not written again, so the retry of a failed commit never duplicates a row.
                with job.store.write() as conn:
                    owned = run_state.fence(conn, finished, job.worker_id)
                    stored = run_state.committed_prompts(conn, list(owned), first)
                    for rid in finished:
                        if rid in owned and rid not in stored:
                            runs = timed[rid]
                            median = runs.index(median_batch(runs))
                            for row in range(len(runs[median])):
                                (job.record or record)(
                                    conn,
                                    group[rid],
                                    runs[median][row],
                                    [r[row] for r in runs],
                                    slots[rid],
                                    loaded.typer,
                                )
                    return owned

            owned = job.retry(commit)  # a refused write is retried; the results wait here meanwhile
            for rid in finished:
                if rid not in owned:
                    outcome[rid] = (LOST, None, None)
                elif owned[rid] or rid in job.cancelled:
                    outcome[rid] = (CANCELLED, None, None)


def median_batch(repeats: list[list[PromptResult]]) -> list[PromptResult]:
    """The repeat of a unit whose wall time (its longest row's) is the median (the lower middle one): at batch 1,
    engine/decoding/protocol.py's median_repeat of the prompt."""
    ranked = sorted(repeats, key=lambda rows: max(r.wall_seconds for r in rows))
    return ranked[(len(ranked) - 1) // 2]


def _unit_progress(
    job: JobContext, run: dict, first: int, last: int, repeat: int, repeats: int, total: int, budget: int
):
    """on_progress(prompt index, tokens) for a unit of prompts first..last-1 (one prompt at batch 1): each row
    reports its own prompt to the progress hook (`draftlab run`'s bar counts every row's tokens), and the run's live
    progress counts the unit's rows by their own tokens."""
    rows: dict[int, int] = {}

    def on_progress(index: int, tokens: int) -> None:
        rows[index] = min(tokens, budget)
        if job.progress_hook is not None:
            job.progress_hook(run, index, tokens, repeat)
        batch = (repeat * (last - first) + sum(rows.values()) / budget) / repeats
        job.live_progress[run["id"]] = (first + batch) / total
        if run["id"] in job.cancelled:
            raise RunCancelled(f"run {run['id']} cancelled")

    return on_progress


def _profile_verify(
    job: JobContext, experiment: dict, loaded: LoadedPair, prompt_ids: list[torch.Tensor], batched: bool
) -> None:
    """`--k auto`: the target's verify-cost profile, once per experiment, under the device lease, through the
    cache path its runs verify with, at each of its batch sizes (batch 1 for an experiment that measures none)."""
    if job.retry(load_verify_profiles, job.store, experiment["id"], write=False):
        return
    n_max = int(experiment["k_auto"]) + 1
    cfg = RunConfig.from_experiment(experiment).sampling()
    model, vocab = loaded.pair.target.model, loaded.pair.vocab_size
    if batched:
        sizes = grid_sizes(experiment) or [int(experiment.get("batch_size") or 1)]
        profiles = batched_verify_profile(model, vocab, prompt_ids, sizes, n_max, cfg)
        job.retry(store_verify_profiles, job.store, experiment["id"], profiles)
    else:
        job.retry(
            store_verify_profile, job.store, experiment["id"], verify_profile(model, vocab, prompt_ids[0], n_max, cfg)
        )


def record(
    conn, run: dict, result: PromptResult, repeats: list[PromptResult], slots: list[int], typer: TokenTyper
) -> None:
    """Write one timed prompt's rows of a run: the median repeat's tokens and rounds, every repeat's timings."""
    texts = [typer.describe(int(t))[0] for t in result.output_ids]
    record_prompt(conn, run["id"], run["kind"], result, texts, repeats=repeats, slots=slots)


def _prompts(job: JobContext, experiment: dict, tokenizer) -> list[str]:
    """The experiment's frozen prompt texts; the first run freezes them: its prompt spec loaded, conversations
    rendered by the target tokenizer's chat template (engine/text/chat.py), so what is stored is what the models see."""

    def load_stored():
        with job.store.read() as conn:
            return load_experiment_prompts(conn, experiment["id"])

    stored = job.retry(load_stored, write=False)
    if stored is not None:
        return stored
    try:
        prompts = render(load_prompts(experiment["prompts"]), tokenizer, experiment.get("chat_template") or "auto")
    except DraftLabError as exc:
        raise SetupError(str(exc)) from exc
    if not prompts:
        raise SetupError(f"prompt set {experiment['prompts']!r} has no prompts; add some or pick another set")
    return job.retry(store_prompts, job.store, experiment["id"], prompts)
