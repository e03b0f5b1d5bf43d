"""A worker's training job ("Train a draft" on the dashboard): `draftlab distill` run from the queue.

The job reports its phase, step, progress and curve points (train loss every step, held-out KL at the eval
points) about once a second, in one fenced transaction whose answer carries a pending cancel. Checkpoints go
to `<out>/.checkpoint`: the prepared data once (the target's continuations and top-k distributions, so a resume
never regenerates them), then the training state every CHECKPOINT_SECONDS and at a cancel, always between two
steps. Cancel stops after the current step; resume continues from the checkpoint with the next step, exactly as
an uninterrupted job would (a killed worker's steps after its last checkpoint are dropped and redone). When
training ends the draft is saved, reloaded and measured on the held-out prompts (card and figures), and a
before/after experiment is queued: the starting draft against the trained one, timed by the protocol.
"""
from __future__ import annotations

import argparse
import shutil
import time
import traceback

import torch

from engine import distill as ds
from engine.errors import DraftLabError
from engine.prompt_sets import load_prompts
from engine.runs import encode_prompts
from storage import queue, training
from storage.schema import CANCELLED, DONE, FAILED, INTERRUPTED

CHECKPOINT_SECONDS = 30.0  # a killed worker loses at most this much training
REPORT_SECONDS = 1.0  # curve points and progress reach the dashboard this often
EVAL_REPEATS = 3  # timed decodes per prompt and draft in the before/after experiment


class _Lost(Exception):
    """The job is no longer this worker's (swept as stale and taken over)."""


def job_command(job: dict, db_url: str | None = None) -> str:
    """The `draftlab distill` command equivalent to a job (for its model card)."""
    from app.cli import _distill_command

    args = argparse.Namespace(target=job["target"], draft=job["draft"], prompts=job["prompts"], steps=job["steps"],
                              out=job["out"], lr=job["lr"], max_new_tokens=job["max_new_tokens"],
                              batch_size=job["batch_size"], samples=job["samples"], seed=job["seed"],
                              device=job["device"] if job["device"] in ("cpu", "cuda") else "auto",
                              focus_from=job["focus_from"], db=db_url)
    return _distill_command(args)


def execute(worker, job_id: int) -> str:
    """Run a claimed training job to its end state (done / failed / cancelled / interrupted); return it."""
    store = worker.store
    job = worker._db(training.get_job, store, job_id, write=False)
    label = f"training job {job_id} ({job['name']})"
    worker.log(f"{label}: {job['draft']} toward {job['target']} on {job['prompts']}, {job['steps']} steps")
    try:
        status, results = _train(worker, job, label)
        error = detail = None
    except _Lost:
        worker.log(f"{label} is no longer this worker's (swept as stale and taken over); left as it is")
        return "lost"
    except (KeyboardInterrupt, SystemExit):
        try:  # one attempt: if the database refuses, the dead-worker sweep marks it interrupted
            training.finish_job(store, job_id, INTERRUPTED, "the worker was stopped; resume the job to continue "
                                "from its last checkpoint", worker_id=worker.id)
        except Exception:  # noqa: BLE001
            pass
        raise
    except torch.cuda.OutOfMemoryError:
        status, results = FAILED, {}
        error = (f"CUDA out of memory training {job['draft']}; lower the batch size or max new tokens, or train on "
                 f"a larger GPU")
        detail = traceback.format_exc()
        torch.cuda.empty_cache()
    except DraftLabError as exc:
        status, results, error, detail = FAILED, {}, str(exc), traceback.format_exc()
    except Exception as exc:  # noqa: BLE001 - a bug or an environment problem: record it, keep serving the queue
        if queue_unavailable(exc):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        status, results, error, detail = FAILED, {}, f"{type(exc).__name__}: {first}", traceback.format_exc()
    closed = worker._db(training.finish_job, store, job_id, status, error, detail, worker.id, **results)
    worker.log(f"{label} {status}" + (f": {error}" if error else "") + ("" if closed else " (no longer this worker's)"))
    return status


def queue_unavailable(exc: BaseException) -> bool:
    from app.db_errors import DatabaseUnavailable

    return isinstance(exc, DatabaseUnavailable)


def _train(worker, job: dict, label: str) -> tuple[str, dict]:
    from app.cli import focus_weights
    from app.distill_card import finish_distilled
    from app.worker import _device_name, load_device, place

    store, job_id, started = worker.store, job["id"], time.perf_counter()

    def report(points=(), **fields) -> dict:
        answer = worker._db(training.report, store, job_id, worker.id, list(points), **fields)
        if not answer["owned"]:
            raise _Lost()
        return answer

    worker._release()  # the training pair is its own (its draft is trained in place): free the cached one first
    report(phase="loading models and prompts")
    cfg = ds.DistillConfig(steps=int(job["steps"]), lr=float(job["lr"]), max_new_tokens=int(job["max_new_tokens"]),
                           batch_size=int(job["batch_size"]), seed=int(job["seed"]), samples=int(job["samples"]))
    focus = None
    if job["focus_from"] is not None:
        focus = worker._db(focus_weights, store, int(job["focus_from"]), write=False)
        cfg.profile_k = focus["k"] if focus["k"] > 0 else cfg.k
    out = ds.check_out_dir(job["out"])
    ckpt = training.checkpoint_dir(job)
    train_prompts, val_prompts = load_prompts(job["prompts"]), load_prompts(job["validation"])
    device = load_device(place(job["device"], worker.device))
    if isinstance(worker._gpus, DraftLabError):  # the placement plan found no set of GPUs that holds the pair
        raise worker._gpus
    # The GPU count the worker leased for this job (its placement plan), so the load spreads over exactly those.
    spread = {"gpus": worker._gpus} if isinstance(worker._gpus, int) and device == "auto" else {}
    pair = worker.loader(job["target"], job["draft"], device, "float32", False, **spread)
    encode_prompts(pair, train_prompts, cfg.max_new_tokens)
    encode_prompts(pair, val_prompts, cfg.max_new_tokens)
    report(device_name=_device_name(pair.device, worker.device, worker.leased), eval_k=cfg.k)

    run = ds.Distiller(pair, train_prompts, val_prompts, cfg, focus["type_weights"] if focus else None,
                       focus["position_weights"] if focus else None)
    if run.load_checkpoint(ckpt):
        worker._db(training.rewind, store, job_id, worker.id, run.step)
        worker.log(f"{label}: continuing from its checkpoint at step {run.step}")
        report(phase=f"training (continued from the checkpoint at step {run.step})", checkpoint_step=run.step,
               progress=run.step / cfg.steps)
    else:
        worker._db(training.rewind, store, job_id, worker.id, 0)
        last = 0.0
        for rec in run.prepare():
            if rec["kind"] == "phase":
                report(phase=rec["phase"])
            elif rec["kind"] == "generated" and time.monotonic() - last >= REPORT_SECONDS:
                last = time.monotonic()
                if report(phase=f"target continuations ({rec['split']}): prompt {rec['prompt'] + 1} of {rec['of']}")["cancel"]:
                    return CANCELLED, {"phase": "cancelled while generating the target's continuations"}
            elif rec["kind"] == "before":
                report([{"step": 0, "kl": rec["kl"]}], kl_before=rec["kl"], alpha_before=rec["alpha"],
                       tokens_per_round_before=rec["tokens_per_round"])
        run.save_checkpoint(ckpt)  # the prepared data: a resume never regenerates it
        report(phase="training", checkpoint_step=0)

    pending, last_report, last_checkpoint, done = [], time.monotonic(), time.monotonic(), None
    for rec in run.train():
        if rec["kind"] == "step":
            pending.append({"step": rec["step"], "loss": rec["loss"], "lr": rec["lr"], "seconds": rec["seconds"]})
        elif rec["kind"] == "eval":
            pending.append({"step": rec["step"], "kl": rec["kl"]})
        elif rec["kind"] == "trained":
            done = rec
            break
        now = time.monotonic()
        if rec["kind"] == "step" and now - last_report < REPORT_SECONDS and run.step < cfg.steps:
            continue
        answer = report(pending, step=run.step, progress=run.step / cfg.steps, phase="training")
        pending, last_report = [], now
        if answer["cancel"] or now - last_checkpoint >= CHECKPOINT_SECONDS:
            run.save_checkpoint(ckpt)
            last_checkpoint = now
            report(checkpoint_step=run.step)
            if answer["cancel"]:
                return CANCELLED, {"phase": f"cancelled at step {run.step}; resume continues from its checkpoint"}
    report(pending, step=run.step, phase="saving and measuring the trained draft")

    validation_note = (" — the same prompts as training: not held out" if job["validation"] == job["prompts"]
                       else "")
    record = finish_distilled(pair, out, cfg, run.prepared, done, focus, started, name=job["name"],
                              target=job["target"], draft=job["draft"], prompts=job["prompts"],
                              validation=job["validation"], validation_note=validation_note,
                              train_prompts=train_prompts, val_prompts=val_prompts,
                              command=job_command(job, store.safe_url if job["focus_from"] is not None else None))
    shutil.rmtree(ckpt, ignore_errors=True)
    eval_id = worker._db(queue.enqueue_experiment, store,
                         name=f"{job['name']}: before/after training job {job_id}", target=job["target"],
                         draft=job["draft"], prompts=job["validation"],
                         sampling={"temperature": 0.0, "max_new_tokens": int(job["max_new_tokens"])},
                         device=job["device"], sweep_variable="draft", sweep_values=[job["draft"], str(out)],
                         k=cfg.k, repeats=EVAL_REPEATS, tags=["distill", f"training-job-{job_id}"],
                         notes=f"Before/after of training job {job_id}: {job['draft']} against the draft it trained "
                               f"({out}) on the held-out {job['validation']}, greedy, k={cfg.k}.")
    worker.log(f"{label}: saved {out}; held-out alpha {record['alpha_before']:.3f} -> {record['alpha_after']:.3f}; "
               f"experiment {eval_id} times before against after")
    return DONE, {"phase": "done", "step": run.step, "train_seconds": record["train_seconds"],
                  "kl_after": record["kl_after"], "alpha_after": record["alpha_after"],
                  "tokens_per_round_after": record["tokens_per_round_after"], "eval_experiment_id": eval_id,
                  "checkpoint_step": None}
