"""The one distillation driver, shared by `draftlab distill` (app/commands/distill.py) and the worker's training jobs
(app/training/training.py): the settings and their command line, the focus weights' effect on the config, the Distiller
with its checkpoint (prepared data once, then training state between two steps), the sequence of records
(prepare, checkpoint of the prepared data, train), and the end: save the trained draft, reload it, measure it on
the held-out prompts and write its model card (MODEL_CARD.md + distill.json).

Each caller shows the records its own way (a progress bar; curve points and a cancel flag in the database); the
steps, checkpoints and the card are the same for both.
"""

from __future__ import annotations

import platform
import shlex
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from engine.models.loading import ModelPair, load_model
from engine.training import distill as ds
from engine.wording import plural
from storage.jobs.training import CHECKPOINT_DIR

CHECKPOINT_SECONDS = 30.0  # an interrupted distillation loses at most this much training


def distill_command(settings: Mapping) -> str:
    """The exact `draftlab distill` command of these settings, every one explicit (a --db password masked).
    Keys: target, draft, prompts, steps, out, lr, max_new_tokens, batch_size, samples, seed, device (auto / cpu /
    cuda), focus_from (an experiment id or None), db (the URL --focus-from reads, or None)."""
    cmd = [
        "draftlab",
        "distill",
        "--target",
        settings["target"],
        "--draft",
        settings["draft"],
        "--prompts",
        settings["prompts"],
        "--steps",
        str(settings["steps"]),
        "--out",
        str(settings["out"]),
        "--lr",
        f"{settings['lr']:g}",
        "--max-new-tokens",
        str(settings["max_new_tokens"]),
        "--batch-size",
        str(settings["batch_size"]),
        "--samples",
        str(settings["samples"]),
        "--seed",
        str(settings["seed"]),
    ]
    if settings["device"] != "auto":
        cmd += ["--device", settings["device"]]
    if settings["focus_from"] is not None:
        cmd += ["--focus-from", str(settings["focus_from"])]
        if settings.get("db"):
            from storage.db.store import safe_url

            cmd += ["--db", safe_url(settings["db"])]
    return " ".join(shlex.quote(str(c)) for c in cmd)


def distill_config(
    steps: int, lr: float, max_new_tokens: int, batch_size: int, seed: int, samples: int
) -> ds.DistillConfig:
    """The Distiller's settings, checked (DraftLabError)."""
    return ds.DistillConfig(
        steps=int(steps),
        lr=float(lr),
        max_new_tokens=int(max_new_tokens),
        batch_size=int(batch_size),
        seed=int(seed),
        samples=int(samples),
    )


def focus_on(cfg: ds.DistillConfig, focus: dict) -> None:
    """With focus weights (storage.analysis.focus.focus_weights), the position profile is read at the k of the run the
    weights came from."""
    cfg.profile_k = focus["k"] if focus["k"] > 0 else cfg.k


def checkpoint_of(out: str | Path) -> Path:
    """Where a distillation writing `out` keeps its checkpoint (removed once the model is saved)."""
    return Path(out) / CHECKPOINT_DIR


JOB_CHECKPOINT_FIX = "resume the job that wrote it, or queue this one under another name"


def distiller(
    pair: ModelPair,
    train_prompts: list[str],
    val_prompts: list[str],
    cfg: ds.DistillConfig,
    focus: dict | None,
    ckpt: Path,
    **resume,
) -> tuple[ds.Distiller, bool]:
    """The Distiller, and whether it continues from the checkpoint in `ckpt` (same settings, interrupted before);
    a checkpoint of other settings is refused in one line (`resume`: Distiller.load_checkpoint's discard_other
    and fix)."""
    run = ds.Distiller(
        pair,
        train_prompts,
        val_prompts,
        cfg,
        focus["type_weights"] if focus else None,
        focus["position_weights"] if focus else None,
    )
    return run, run.load_checkpoint(ckpt, **resume)


def checkpoint(run: ds.Distiller, ckpt: Path) -> int:
    """Save the run's state between two steps; return the step it holds."""
    run.save_checkpoint(ckpt)
    return run.step


def records(run: ds.Distiller, ckpt: Path, continued: bool) -> Iterator[dict]:
    """The run's records: a fresh run prepares (the target's continuations), checkpoints that data (a rerun never
    regenerates it: a {"kind": "prepared_saved"} record), then trains; a continued one trains from its step."""
    if not continued:
        yield from run.prepare()
        checkpoint(run, ckpt)
        yield {"kind": "prepared_saved"}
    yield from run.train()


def finish(
    pair: ModelPair,
    out: Path,
    cfg: ds.DistillConfig,
    prepared: dict,
    done: dict,
    focus: dict | None,
    started: float,
    ckpt: Path,
    **card,
) -> dict:
    """Save, measure and describe the trained draft (finish_distilled), then drop the checkpoint."""
    record = finish_distilled(pair, out, cfg, prepared, done, focus, started, **card)
    shutil.rmtree(ckpt, ignore_errors=True)
    return record


def run_facts(pair: ModelPair, samples: int, done: dict, started: float) -> dict:
    """What a training card records of how the job ran, the same for a distilled draft and a head: its data
    (continuations), hardware, times and curve."""
    hardware = (
        torch.cuda.get_device_name(pair.device)
        if pair.device.type == "cuda"
        else f"CPU, {plural(torch.get_num_threads(), 'thread')} ({platform.machine()})"
    )
    return {
        "continuations": "greedy" + (f" + {samples - 1} sampled (temperature 1)" if samples > 1 else ""),
        "hardware": hardware,
        "train_seconds": done["seconds"],
        "total_seconds": time.perf_counter() - started,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "curve": done["curve"],
        "weights": done["weights"],
    }


def finish_distilled(
    pair: ModelPair,
    out: Path,
    cfg: ds.DistillConfig,
    prepared: dict,
    done: dict,
    focus: dict | None,
    started: float,
    *,
    name: str,
    target: str,
    draft: str,
    prompts: str,
    validation: str,
    validation_note: str,
    train_prompts: list[str],
    val_prompts: list[str],
    command: str,
) -> dict:
    """Save pair.draft (in the dtype its source directory records) to `out`, measure the saved weights (KL, alpha,
    tokens/round, lossless) and write the card; return the card's record. `done` is the Distiller's "trained"
    record, `prepared` its "prepared" one; `started` the perf_counter time the whole job began."""
    assert pair.draft is not None, "distillation trains a draft model"
    dtype = ds.saved_dtype(pair.draft.source)
    params = pair.draft.parameters
    ds.save_model(pair.draft.model, pair.draft.tokenizer, out, dtype)
    saved = load_model(str(out), pair.device, pair.dtype)
    after = ds.evaluate_saved(pair, saved, val_prompts, done["validation"], cfg.max_new_tokens, cfg.k)
    before = done["before"]
    record = {
        "name": name,
        "target": target,
        "draft": draft,
        "parameters": params,
        "prompts": prompts,
        "train_prompts": len(train_prompts),
        "train_tokens": prepared["train_tokens"],
        "validation": validation,
        "validation_note": validation_note,
        "validation_prompts": len(val_prompts),
        "validation_tokens": prepared["validation_tokens"],
        **ds.config_record(cfg),
        "train_sequences": prepared["train_sequences"],
        "dtype": str(dtype).removeprefix("torch."),
        **run_facts(pair, cfg.samples, done, started),
        "focus": focus,
        "kl_before": done["kl_before"],
        "kl_after": after["kl"],
        "alpha_before": before["alpha"],
        "alpha_after": after["alpha"],
        "tokens_per_round_before": before["tokens_per_round"],
        "tokens_per_round_after": after["tokens_per_round"],
        "acceptance_length_before": before["acceptance_length"],
        "acceptance_length_after": after["acceptance_length"],
        "lossless_before": before.get("lossless"),
        "lossless_after": after.get("lossless"),
        "command": command,
    }
    ds.write_card(out, record)
    return record
