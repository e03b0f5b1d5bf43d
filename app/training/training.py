"""A worker's training job ("Train a draft" on the dashboard): `draftlab distill` or `draftlab train-head` run from
the queue, one loop for both kinds (app/training/training_kinds.py says what differs: settings, models, trainer, end).

The job reports its phase, step, progress and curve points (train loss every step, held-out KL at the eval
points; for a head also its held-out acceptance length and acceptance by draft position) about once a second, in
one fenced transaction whose answer carries a pending cancel. Checkpoints go to `<out>/.checkpoint`: the prepared
data once (the target's continuations, so a resume never regenerates them), then the training state every
CHECKPOINT_SECONDS (the drivers `draftlab distill` and `train-head` run too) and at a cancel, always between two
steps. Cancel stops after the current step; resume continues from the checkpoint with the next step, exactly as
an uninterrupted job would (a killed worker's steps after its last checkpoint are dropped and redone). When
training ends the draft or head is saved, reloaded and measured on the held-out prompts (card and figures), and a
timed experiment is queued: the starting draft against the trained one, or the trained head against the target
alone (app/training/training_kinds.py says why).
"""

from __future__ import annotations

import time
import traceback

import torch

from app.db_errors import DatabaseUnavailable
from app.runtime.job_context import JobContext
from app.runtime.placement import device_name, load_device, place
from app.training import distill_driver as driver
from app.training.training_kinds import DistillJob, kind_of
from engine.decoding.runs import encode_prompts
from engine.errors import DraftLabError
from engine.text.chat import AUTO, render
from engine.text.prompt_sets import load_prompts
from engine.training import distill as ds
from engine.wording import plural
from storage.analysis.focus import focus_weights
from storage.db.schema import CANCELLED, DONE, FAILED, INTERRUPTED
from storage.jobs import training
from storage.jobs.experiments import enqueue_experiment

REPORT_SECONDS = 1.0  # curve points and progress reach the dashboard this often
EVAL_REPEATS = 3  # timed decodes per prompt and draft in the before/after experiment
RESULTS = ("kl_after", "alpha_after", "tokens_per_round_after", "acceptance_length_after")  # the card's, stored


class _Lost(Exception):
    """The job is no longer this worker's (swept as stale and taken over)."""


def execute(job_ctx: JobContext, job_id: int) -> str:
    """Run a claimed training job to its end state (done / failed / cancelled / interrupted); return it."""
    store = job_ctx.store
    job = job_ctx.retry(training.get_job, store, job_id, write=False)
    label = f"training job {job_id} ({job['name']})"
    kind = kind_of(job)
    job_ctx.log(f"{label}: {kind.subject} on {job['prompts']}, {plural(job['steps'], 'step')}")
    try:
        status, results = _train(job_ctx, job, kind, label)
        error = detail = None
    except _Lost:
        job_ctx.log(f"{label} is no longer this worker's (swept as stale and taken over); left as it is")
        return "lost"
    except (KeyboardInterrupt, SystemExit):
        try:  # one attempt: if the database refuses, the dead-worker sweep marks it interrupted
            training.finish_job(
                store,
                job_id,
                INTERRUPTED,
                "the worker was stopped; resume the job to continue from its last checkpoint",
                worker_id=job_ctx.worker_id,
            )
        except Exception:  # noqa: BLE001
            pass
        raise
    except torch.cuda.OutOfMemoryError:
        status, results = FAILED, {}
        error = (
            f"CUDA out of memory training {kind.subject}; lower the batch size or max new tokens, or train on "
            f"a larger GPU"
        )
        detail = traceback.format_exc()
        torch.cuda.empty_cache()
    except DraftLabError as exc:
        status, results, error, detail = FAILED, {}, str(exc), traceback.format_exc()
    except Exception as exc:  # noqa: BLE001 - a bug or an environment problem: record it, keep serving the queue
        if isinstance(exc, DatabaseUnavailable):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        status, results, error, detail = FAILED, {}, f"{type(exc).__name__}: {first}", traceback.format_exc()
    closed = job_ctx.retry(training.finish_job, store, job_id, status, error, detail, job_ctx.worker_id, **results)
    job_ctx.log(
        f"{label} {status}" + (f": {error}" if error else "") + ("" if closed else " (no longer this worker's)")
    )
    return status


def _train(job_ctx: JobContext, job: dict, kind: DistillJob, label: str) -> tuple[str, dict]:
    store, job_id, started = job_ctx.store, job["id"], time.perf_counter()

    def report(points=(), **fields) -> dict:
        answer = job_ctx.retry(training.report, store, job_id, job_ctx.worker_id, list(points), **fields)
        if not answer["owned"]:
            raise _Lost()
        return answer

    job_ctx.models.release()  # the training pair is its own (its draft is trained in place): free the cached one first
    report(phase="loading models and prompts")
    cfg = kind.config()
    focus = None
    if job["focus_from"] is not None:
        focus = job_ctx.retry(focus_weights, store, int(job["focus_from"]), write=False)
        kind.focus_on(cfg, focus)
    out = ds.check_out_dir(job["out"])
    ckpt = driver.checkpoint_of(out)
    train_set, val_set = load_prompts(job["prompts"]), load_prompts(job["validation"])
    device = load_device(place(job["device"], job_ctx.device))
    # The GPU count the worker leased for this job (its placement plan), so the load spreads over exactly those; a
    # plan that found no set of GPUs holding the pair raises its DraftLabError here.
    spread = job_ctx.spread(device)
    pair = job_ctx.models.loader(job["target"], kind.draft, device, "float32", False, **spread)
    # conversations (a chat JSONL captured from production) through the target's own chat template
    train_prompts = render(train_set, pair.tokenizer, AUTO, what=job["prompts"])
    val_prompts = render(val_set, pair.tokenizer, AUTO, what=job["validation"])
    encode_prompts(pair, train_prompts, cfg.max_new_tokens)
    encode_prompts(pair, val_prompts, cfg.max_new_tokens)
    report(device_name=device_name(pair.device, job_ctx.device, job_ctx.leased), eval_k=cfg.k)

    run, continued = kind.trainer(pair, train_prompts, val_prompts, cfg, focus, ckpt)
    if continued:
        job_ctx.retry(training.rewind, store, job_id, job_ctx.worker_id, run.step)
        job_ctx.log(f"{label}: continuing from its checkpoint at step {run.step}")
        report(
            phase=f"training (continued from the checkpoint at step {run.step})",
            checkpoint_step=run.step,
            progress=run.step / cfg.steps,
        )
    else:
        job_ctx.retry(training.rewind, store, job_id, job_ctx.worker_id, 0)
    pending, last, last_report, last_checkpoint, done = [], 0.0, time.monotonic(), time.monotonic(), None
    for rec in driver.records(run, ckpt, continued):
        if rec["kind"] == "phase":
            report(phase=rec["phase"])
            continue
        elif rec["kind"] == "generated":
            if time.monotonic() - last >= REPORT_SECONDS:
                last = time.monotonic()
                if report(phase=f"target continuations ({rec['split']}): prompt {rec['prompt'] + 1} of {rec['of']}")[
                    "cancel"
                ]:
                    return CANCELLED, {"phase": "cancelled while generating the target's continuations"}
            continue
        elif rec["kind"] == "before":  # the curve's step 0 (the trainer's first point) and the greedy figures
            report(
                [_point(run.curve[0])],
                kl_before=rec["kl"],
                alpha_before=rec["alpha"],
                tokens_per_round_before=rec["tokens_per_round"],
                acceptance_length_before=rec.get("acceptance_length"),
            )
            continue
        elif rec["kind"] == "prepared_saved":  # the prepared data: a resume never regenerates it
            report(phase="training", checkpoint_step=0)
            last_report = last_checkpoint = time.monotonic()
            continue
        elif rec["kind"] == "step":
            pending.append({"step": rec["step"], "loss": rec["loss"], "lr": rec["lr"], "seconds": rec["seconds"]})
        elif rec["kind"] == "eval":
            pending.append(_point(rec))
        elif rec["kind"] == "trained":
            done = rec
            break
        else:
            continue
        now = time.monotonic()
        if rec["kind"] == "step" and now - last_report < REPORT_SECONDS and run.step < cfg.steps:
            continue
        answer = report(pending, step=run.step, progress=run.step / cfg.steps, phase="training")
        pending, last_report = [], now
        if answer["cancel"] or now - last_checkpoint >= driver.CHECKPOINT_SECONDS:
            driver.checkpoint(run, ckpt)
            last_checkpoint = now
            report(checkpoint_step=run.step)
            if answer["cancel"]:
                return CANCELLED, {"phase": f"cancelled at step {run.step}; resume continues from its checkpoint"}
    report(pending, step=run.step, phase=f"saving and measuring the trained {kind.made}")
    if done is None:
        raise RuntimeError(f"the {kind.made}'s training ended without its final record")

    validation_note = " — the same prompts as training: not held out" if job["validation"] == job["prompts"] else ""
    record = kind.finish(
        run,
        out,
        cfg,
        done,
        focus,
        started,
        ckpt,
        name=job["name"],
        target=job["target"],
        prompts=job["prompts"],
        validation=job["validation"],
        validation_note=validation_note,
        train_prompts=train_prompts,
        val_prompts=val_prompts,
        command=kind.command(run, store.safe_url if job["focus_from"] is not None else None),
    )
    eval_id = job_ctx.retry(enqueue_experiment, store, **kind.evaluation(out, cfg, EVAL_REPEATS, job_id))
    length = record.get("acceptance_length_after")
    job_ctx.log(
        f"{label}: saved {out}; held-out alpha {record['alpha_before']:.3f} -> {record['alpha_after']:.3f}"
        + (f", acceptance length {length:.2f}" if length is not None else "")
        + f"; experiment {eval_id} times it"
    )
    return DONE, {
        "phase": "done",
        "step": run.step,
        "train_seconds": record["train_seconds"],
        **{key: record.get(key) for key in RESULTS},
        "eval_experiment_id": eval_id,
        "checkpoint_step": None,
    }


def _point(p: dict) -> dict:
    """A curve point as stored (storage.jobs.training.report): the held-out KL, and for a head its acceptance length
    and its acceptance and accuracy by draft position."""
    return {
        "step": p["step"],
        "kl": p.get("kl"),
        "acceptance_length": p.get("acceptance_length"),
        "per_position": p.get("per_position"),
        "accuracy": p.get("accuracy"),
    }
