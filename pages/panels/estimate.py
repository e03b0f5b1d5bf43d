"""How long Launch (or a queued training job) will take, said before it is queued, with what the figure is from.

An experiment decodes tokens; its duration is those tokens at the target's own speed at the same batch size (a
batch's throughput is not one request's: a batch-2 baseline's 189 tokens/s is not a batch-1 follow-up's speed).
A target never measured at that batch size gets an estimate from model size: decoding a small batch is
memory-bound, each step reads every weight once, so tokens/s scales with 1 / (bytes of weights). It is scaled from
another target measured at that batch size whose weights are on this machine too, and says so. No estimate is
better than a made-up one: without any measured reference, none is given.

A training job's time: pages/panels/training_estimate.py (a figure with its range, scaled from finished jobs part by
part).

Plain Python over storage's queries (cached by the page); pages never load a model: weights are only measured on
disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from engine import zoo

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


@dataclass(frozen=True)
class Speed:
    """Tokens per second at one batch size, and what that figure is from, in words."""

    tokens_per_second: float
    source: str
    measured: bool  # this target's own baseline at this batch size (else scaled from model size)


def model_dir(name: str) -> Path | None:
    """Where a model's files are on this machine: a shipped demo model, a local directory, or an HF id's snapshot in
    the Hugging Face cache; None when not on disk here."""
    name = str(name or "").strip()
    if not name:
        return None
    shipped = zoo.resolve(name)
    if shipped is not None:
        return Path(shipped)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):  # an `org/name` hub id
        hub = Path(
            os.environ.get("HF_HUB_CACHE")
            or Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"
        )
        snapshots = sorted((hub / f"models--{name.replace('/', '--')}" / "snapshots").glob("*"))
        return snapshots[-1] if snapshots else None
    return None


def weight_bytes(name: str) -> int | None:
    """Bytes of a model's weight files on disk (what a decode step reads), None when they are not on disk here."""
    where = model_dir(name)
    if where is None:
        return None
    files = {f for pattern in WEIGHT_FILES for f in where.glob(pattern)}
    total = sum(f.stat().st_size for f in files if f.is_file())
    return total or None


def decode_speed(
    target: str, batch_size: int, measured: dict | None, others: pd.DataFrame, sizes=weight_bytes
) -> Speed | None:
    """The target's decoding speed at batch_size: `measured` (storage.records.queries.target_speed at that batch size),
    else scaled from model size from the newest of `others` (storage.records.queries.baseline_speeds at that batch size)
    whose weights are on disk, else None. `sizes`: name -> weight bytes."""
    if measured is not None:
        where = f" on {measured['device_name']}" if measured.get("device_name") else ""
        return Speed(
            float(measured["tokens_per_second"]),
            f"this target's last measured speed at batch size {batch_size} "
            f"({float(measured['tokens_per_second']):.1f} tokens/s{where}, experiment "
            f"#{measured['experiment_id']})",
            True,
        )
    mine = sizes(target)
    if not mine:
        return None
    for row in others.itertuples():
        if row.target == target:
            continue
        theirs = sizes(row.target)
        if theirs:
            speed = float(row.tokens_per_second) * theirs / mine
            return Speed(
                speed,
                f"an estimate from model size, as this target was never measured at batch size "
                f"{batch_size}: {row.target} decoded {float(row.tokens_per_second):.1f} tokens/s there "
                f"(experiment #{row.experiment_id}) and this target's weights are "
                f"{mine / theirs:.2g}× its size",
                False,
            )
    return None


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
