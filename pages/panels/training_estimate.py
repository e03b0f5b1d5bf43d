"""How long a training job will take, before it is queued: a figure with its range and what it is from.

A job's time is three parts, each scaled from measured jobs (storage.jobs.training.job_timings) by what it does:

    steps     its optimiser steps: steps x one step's time, which grows with the tokens per step (batch size x new
              tokens) and the size of the model a step runs (the draft for a distillation; the target, whose
              states a head reads, for a head). Measured per step from a finished job's curve.
    held-out  the evaluations along the run (EVAL_POINTS of them, whatever the step count), each over the
              validation prompts' responses with the target.
    outside   loading the models (fixed: their weights at LOAD_BYTES_PER_SECOND), then the target's responses to
              the training prompts (one by one for a distillation's greedy ones; sampled ones, and a head's, in
              batches, about BATCH_GAIN times cheaper each) and the held-out measurements before and after.

The steps and held-out parts come from finished jobs of the same kind; the outside part (the same target's
loading and responses) from finished jobs of either kind. Without a finished job of the kind, from the shipped
demo's recorded run of that kind (its card: another machine, so a wider range), at this lab's pace when a job of
the other kind finished here (its step time against its own kind's card: `paced`). Each finished job gives one
prediction; the estimate is their median, its range from the lowest to the highest, each widened by NOISE (run to
run on a shared machine) and more the further the job's shape is from the measured one's (ratio ** SPREAD).

Plain Python over storage's rows and files on disk: pages never load a model.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, replace

import pandas as pd

from engine.wording import plural
from pages.panels.estimate import duration, weight_bytes

EVAL_POINTS = 8  # held-out evaluations along a run (engine/training/distill.py DistillConfig.eval_points, HeadConfig's)
BEFORE_PROMPTS = 8  # a fresh head's before-figures decode this many held-out prompts (engine/training/head_training.py)
BATCH_GAIN = 4.0  # per token, one response decoded 32 at a time costs ~1/4 of one decoded alone (demo-target, CPU:
#                   228 against 53 tokens/s measured here); a GPU gains more, so its estimate errs long
LOAD_BYTES_PER_SECOND = 200e6  # reading and placing weights
NOISE = 1.25  # run-to-run spread of one job's time on a shared machine
SPREAD = 0.1  # the range widens by ratio ** SPREAD when a part is scaled by `ratio` from the measured job
OTHER_MACHINE = 2.0  # a shipped card was measured elsewhere: its range is this much wider each way
Part = tuple[float, float, float]  # seconds: central, low, high
SHIPPED = {"distill": ("demo-draft-distilled", "distill.json"), "head": ("demo-eagle3", "train_head.json")}


@dataclass(frozen=True)
class Shape:
    """What a training job does, as far as its time goes."""

    kind: str  # "distill" or "head"
    target: str
    draft: str  # "" for a head
    steps: int
    batch_size: int
    max_new_tokens: int
    samples: int
    train_prompts: int | None  # None: the prompt set is not readable here
    validation_prompts: int | None


@dataclass(frozen=True)
class Measured:
    """One finished job's (or a shipped card's) times and shape."""

    shape: Shape
    name: str  # "job 3", "the shipped demo-eagle3's recorded run"
    wall: float  # seconds, all of it
    train: float  # seconds of steps and held-out evaluations
    step: float  # seconds of one optimiser step
    where: str  # its device
    wider: float = 1.0  # its range, this much wider each way (a shipped card: measured on another machine)
    pace: float = 1.0  # its times, multiplied by this (a shipped card, at the pace of the jobs run here: paced)


@dataclass(frozen=True)
class Estimate:
    seconds: float
    low: float
    high: float
    basis: str

    def text(self) -> str:
        return f"about {duration(self.seconds)} ({duration(self.low)}–{duration(self.high)}), {self.basis}"


def evaluations(steps: int) -> int:
    """How many held-out evaluations a run of `steps` makes (engine/training/distill.py train(): every ceil(steps / 8)
    steps and at the last)."""
    every = max(1, math.ceil(steps / EVAL_POINTS))
    return steps // every + (1 if steps % every else 0)


def responses(shape: Shape) -> float:
    """The target's responses a job decodes outside its steps, in one-by-one equivalents (BATCH_GAIN): a
    distillation decodes its greedy training responses one by one, then its sampled ones in batches, and the
    held-out ones three times (their responses, before, after); a head decodes every training response in
    batches, the held-out ones twice (responses, after) and BEFORE_PROMPTS of them with the fresh head."""
    train, held_out = shape.train_prompts or 0, shape.validation_prompts or 0
    if shape.kind == "head":
        return train * shape.samples / BATCH_GAIN + 2 * held_out + min(BEFORE_PROMPTS, held_out)
    return train + train * (shape.samples - 1) / BATCH_GAIN + 3 * held_out


def _ratio(new, old) -> float:
    return new / old if new and old else 1.0


def _part(seconds: float, ratio: float, m: Measured) -> Part:
    """(central, low, high) of a part `m` measured, scaled by `ratio` (and by `m`'s pace)."""
    wide = NOISE * max(ratio, 1 / ratio) ** SPREAD * m.wider
    return seconds * m.pace, seconds * m.pace / wide, seconds * m.pace * wide


def _load(shape: Shape, sizes) -> float:
    return sum(sizes(name) or 0 for name in (shape.target, shape.draft) if name) / LOAD_BYTES_PER_SECOND


def step_ratio(shape: Shape, old: Shape, sizes) -> float:
    """How much longer one optimiser step of `shape` takes than one of `old` (same kind): tokens per step x the
    size of the model a step trains through (a distillation's draft; a head's target)."""
    stepper = (lambda s: s.target) if shape.kind == "head" else (lambda s: s.draft)
    return _ratio(shape.batch_size * shape.max_new_tokens, old.batch_size * old.max_new_tokens) * _ratio(
        sizes(stepper(shape)), sizes(stepper(old))
    )


def training_part(shape: Shape, m: Measured, sizes) -> Part:
    """The steps and held-out evaluations of `shape`, scaled from `m` (same kind)."""
    old = m.shape
    steps = step_ratio(shape, old, sizes)
    held_out = max(m.train - m.step * old.steps, 0.0) / evaluations(old.steps)
    evals = _ratio(
        (shape.validation_prompts or 1) * shape.max_new_tokens, (old.validation_prompts or 1) * old.max_new_tokens
    ) * _ratio(sizes(shape.target), sizes(old.target))
    parts = [
        _part(shape.steps * m.step * steps, steps, m),
        _part(evaluations(shape.steps) * held_out * evals, evals, m),
    ]
    return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)


def outside_part(shape: Shape, m: Measured, sizes) -> Part:
    """Loading, the target's responses and the before/after measurements of `shape`, scaled from `m` (either
    kind): the fixed load, plus the rest by responses x new tokens x the target's size."""
    old = m.shape
    rest = max(m.wall - m.train - _load(old, sizes), 0.0)
    counted = shape.train_prompts is not None and old.train_prompts is not None
    ratio = (
        (_ratio(responses(shape), responses(old)) if counted else 1.0)
        * _ratio(shape.max_new_tokens, old.max_new_tokens)
        * _ratio(sizes(shape.target), sizes(old.target))
    )
    central, low, high = _part(rest * ratio, ratio, m)
    load = _load(shape, sizes)
    return central + load, low + load, high + load


def _combine(predictions: list[Part]) -> Part:
    return (
        statistics.median(p[0] for p in predictions),
        min(p[1] for p in predictions),
        max(p[2] for p in predictions),
    )


def paced(card: Measured, jobs: list[Measured], sizes) -> Measured:
    """A shipped card's run at this lab's pace: how much longer one step of the finished jobs here took than
    their own kind's card predicts for their shape (the median), so a head's first estimate after a distillation job has
    finished runs at the speed that job measured. The card itself when no job here has a card to compare."""
    paces = []
    for job in jobs:
        theirs = shipped(job.shape.kind)
        if theirs is not None:
            paces.append(job.step / (theirs.step * step_ratio(job.shape, theirs.shape, sizes)))
    if not paces:
        return card
    pace = statistics.median(paces)
    how = f"how {plural(len(paces), 'job')} here ran against the shipped runs"
    return replace(card, pace=pace, wider=NOISE, name=f"{card.name}, at {pace:.2g}× its time ({how})")


def measured_jobs(timings: pd.DataFrame, count) -> list[Measured]:
    """The finished jobs of storage.jobs.training.job_timings that say how long they took (`count`: prompt spec ->
    number of prompts, or None)."""
    out = []
    for job in timings.itertuples():
        if not (job.wall_seconds and job.train_seconds and job.steps):
            continue
        step = (
            job.step_seconds
            if job.step_seconds == job.step_seconds and job.step_seconds
            else (job.train_seconds / job.steps)
        )
        shape = Shape(
            job.kind,
            job.target,
            job.draft or "",
            int(job.steps),
            int(job.batch_size),
            int(job.max_new_tokens),
            int(job.samples),
            count(job.prompts),
            count(job.validation),
        )
        out.append(
            Measured(
                shape,
                f"job {job.id}",
                float(job.wall_seconds),
                float(job.train_seconds),
                float(step),
                job.device_name or "a worker",
            )
        )
    return out


def shipped(kind: str) -> Measured | None:
    """The shipped demo's recorded run of `kind` (its card), as a measured job from another machine."""
    from engine.zoo import ZOO_DIR

    name, card = SHIPPED[kind]
    try:
        c = json.loads((ZOO_DIR / name / card).read_text(encoding="utf-8"))
        shape = Shape(
            kind,
            c["target"],
            c.get("draft") or "",
            int(c["steps"]),
            int(c["batch_size"]),
            int(c["max_new_tokens"]),
            int(c["samples"]),
            int(c["train_prompts"]),
            int(c["validation_prompts"]),
        )
        return Measured(
            shape,
            f"the shipped {name}'s recorded run",
            float(c["total_seconds"]),
            float(c["train_seconds"]),
            float(c["train_seconds"]) / int(c["steps"]),
            c["hardware"],
            wider=OTHER_MACHINE,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def training_estimate(shape: Shape, timings: pd.DataFrame, count, sizes=weight_bytes) -> Estimate | None:
    """How long a job of `shape` takes (module docstring), from the finished jobs in `timings`
    (storage.jobs.training.job_timings) and, where none of its kind finished, the shipped card of its kind (at this
    lab's pace when other jobs finished here); None when neither is there."""
    sizes = functools.cache(sizes)  # each model's files are measured once
    jobs = measured_jobs(timings, count)
    card = shipped(shape.kind)
    same = [m for m in jobs if m.shape.kind == shape.kind] or ([paced(card, jobs, sizes)] if card else [])
    if not same:
        return None
    either = jobs or same
    train = _combine([training_part(shape, m, sizes) for m in same])
    outside = _combine([outside_part(shape, m, sizes) for m in either])
    step = statistics.median(m.step * m.pace * step_ratio(shape, m.shape, sizes) for m in same)
    return Estimate(
        train[0] + outside[0],
        train[1] + outside[1],
        train[2] + outside[2],
        _basis(shape, same, either, step, outside[0]),
    )


def _basis(shape: Shape, same: list[Measured], either: list[Measured], step: float, outside: float) -> str:
    what = "distillation" if shape.kind == "distill" else "head training"
    if same[0].wider > 1.0:  # a shipped card
        source = f"no {what} job has finished here yet: scaled from {same[0].name} on {same[0].where}" + (
            " (another machine, so a wide range)" if same[0].pace == 1.0 else ""
        )
    else:
        places = ", ".join(sorted({m.where for m in same}))
        source = f"from {plural(len(same), f'finished {what} job')} on {places}"
    others = [m for m in either if m.shape.kind != shape.kind]
    also = f"; loading and responses from {plural(len(others), 'job')} of the other kind too" if others else ""
    return (
        f"{source}{also}: {step:.2g} s per step of {shape.batch_size} × {shape.max_new_tokens} tokens, "
        f"{duration(outside)} outside the steps (loading the models, the target's responses, the held-out "
        f"figures)"
    )
