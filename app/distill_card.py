"""The end of a distillation, shared by `draftlab distill` and the worker's training jobs: save the trained draft,
reload it, measure it on the held-out prompts and write its model card (MODEL_CARD.md + distill.json)."""
from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from engine import distill as ds
from engine.loading import ModelPair, load_model


def finish_distilled(pair: ModelPair, out: Path, cfg: ds.DistillConfig, prepared: dict, done: dict, focus: dict | None,
                     started: float, *, name: str, target: str, draft: str, prompts: str, validation: str,
                     validation_note: str, train_prompts: list[str], val_prompts: list[str], command: str) -> dict:
    """Save pair.draft (in the dtype its source directory records) to `out`, measure the saved weights (KL, alpha,
    tokens/round, lossless) and write the card; return the card's record. `done` is the Distiller's "trained"
    record, `prepared` its "prepared" one; `started` the perf_counter time the whole job began."""
    dtype = ds.saved_dtype(pair.draft.source)
    params = pair.draft.parameters
    ds.save_model(pair.draft.model, pair.draft.tokenizer, out, dtype)
    saved = load_model(str(out), pair.device, pair.dtype)
    after = ds.evaluate_saved(pair, saved, val_prompts, done["validation"], cfg.max_new_tokens, cfg.k)
    before = done["before"]
    hardware = (torch.cuda.get_device_name(pair.device) if pair.device.type == "cuda" else
                f"CPU, {torch.get_num_threads()} thread(s) ({platform.machine()})")
    record = {
        "name": name, "target": target, "draft": draft, "parameters": params,
        "prompts": prompts, "train_prompts": len(train_prompts), "train_tokens": prepared["train_tokens"],
        "validation": validation, "validation_note": validation_note, "validation_prompts": len(val_prompts),
        "validation_tokens": prepared["validation_tokens"], **ds.config_record(cfg),
        "continuations": "greedy" + (f" + {cfg.samples - 1} sampled (temperature 1)" if cfg.samples > 1 else ""),
        "train_sequences": prepared["train_sequences"], "dtype": str(dtype).removeprefix("torch."),
        "hardware": hardware, "train_seconds": done["seconds"], "total_seconds": time.perf_counter() - started,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "curve": done["curve"], "weights": done["weights"], "focus": focus,
        "kl_before": done["kl_before"], "kl_after": after["kl"],
        "alpha_before": before["alpha"], "alpha_after": after["alpha"],
        "tokens_per_round_before": before["tokens_per_round"], "tokens_per_round_after": after["tokens_per_round"],
        "lossless_before": before.get("lossless"), "lossless_after": after.get("lossless"),
        "command": command,
    }
    ds.write_card(out, record)
    return record
