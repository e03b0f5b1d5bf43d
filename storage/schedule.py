"""The k schedule of a grid experiment (`--batch-size 1,4,16 --k 1,2,3,4`): at each batch size, the verdict among
that batch size's runs (storage/verdict.py's one rule: best, ties, too wide, the cheaper tied choice), and what to
serve there: the chosen k, or k = 0 where speculation measurably loses (the best run's whole 95 % interval below
1: every k is slower than the target alone at that batch size).

    s = schedule(store, experiment_id)     None unless the experiment is a grid
    s.steps       one Step per batch size, smallest first
    s.ranges      vLLM's num_speculative_tokens_per_batch_size entries [start_bs, end_bs, k]
    s.text        the schedule in one sentence; each step's own sentence is step.text

Each batch size's runs are paired with their own target-only baseline at that batch size, so a step's speedups
are that batch size's. Only a k grid has a schedule to serve; a grid over another variable still has one verdict
per batch size (its `value`). No torch, no streamlit.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from engine.variables import variable

from . import queries as q
from .store import Store
from .verdict import Verdict, judge


@dataclass(frozen=True)
class Step:
    """One batch size of the schedule."""
    batch_size: int
    verdict: Verdict
    k: int | None  # what to serve: the chosen k, 0 = do not speculate, None = nothing finished to choose from
    loses: bool  # the best run's interval lies wholly below 1: speculation measurably loses here
    gains: bool  # the chosen run's interval lies wholly above 1: measurably faster than the target alone
    text: str

    @property
    def value(self):
        """The chosen swept value (a k, a drafter, ...); None when speculation loses or nothing finished."""
        return None if self.loses or self.verdict.chosen is None else self.verdict.chosen.value

    def as_dict(self) -> dict:
        chosen = None if self.loses else self.verdict.chosen
        best = self.verdict.best
        return {"batch_size": self.batch_size, "k": self.k, "value": self.value, "loses": self.loses,
                "gains": self.gains, "run_id": chosen.run_id if chosen else None,
                "speedup": chosen.speedup if chosen else best.speedup if best else None,
                "speedup_ci": list((chosen or best).ci) if (chosen or best) else None,
                "best": best.value if best else None, "tied_with": [t.value for t in self.verdict.tied],
                "too_wide": self.verdict.too_wide, "text": self.text}


@dataclass(frozen=True)
class Schedule:
    experiment_id: int
    variable: str
    steps: tuple[Step, ...]

    @property
    def ranges(self) -> list[list[int]]:
        """vLLM's `num_speculative_tokens_per_batch_size`: [start_bs, end_bs, k] entries, the first from batch size
        1, each measured batch size's k until the next measured one (vLLM keeps the last entry's k above its end).
        Batch sizes without a finished choice are left out; empty for a grid over something other than k."""
        known = [s for s in self.steps if s.k is not None]
        if self.variable != "k" or not known:
            return []
        out = []
        for i, step in enumerate(known):
            start = 1 if i == 0 else step.batch_size
            end = known[i + 1].batch_size - 1 if i + 1 < len(known) else step.batch_size
            if out and out[-1][2] == step.k:  # the same k as the range before: one range
                out[-1][1] = end
            else:
                out.append([start, end, step.k])
        return out

    @property
    def off_from(self) -> int | None:
        """The smallest batch size from which speculation measurably loses at every measured batch size."""
        first = None
        for step in self.steps:
            if step.loses:
                first = step.batch_size if first is None else first
            elif step.k is not None:
                first = None
        return first

    @property
    def text(self) -> str:
        if not self.steps:
            return "no batch size has a finished run yet"
        swept = variable(self.variable)
        parts = []
        for s in self.steps:
            if s.k is None:
                parts.append(f"batch {s.batch_size}: {s.verdict.text}")
            elif s.loses:
                parts.append(f"batch {s.batch_size}: off ({_interval(s.verdict.best)} at best)")
            else:
                c = s.verdict.chosen
                parts.append(f"batch {s.batch_size}: {swept.name} = {swept.show(c.value)} ({_interval(c)})"
                             + ("" if s.gains else ", not measurably faster than the target alone"))
        text = ("k schedule: " if self.variable == "k" else f"best {swept.name} per batch size: ") + "; ".join(parts)
        off = self.off_from
        if off is not None:
            text += f". Switch speculation off from batch {off}"
        return text

    def as_dict(self) -> dict:
        return {"variable": self.variable, "steps": [s.as_dict() for s in self.steps],
                "num_speculative_tokens_per_batch_size": self.ranges or None, "off_from": self.off_from,
                "text": self.text}


def schedule(store: Store, experiment_id: int) -> Schedule | None:
    """The experiment's schedule, None when it is not a grid."""
    exp = q.experiment(store, experiment_id) or {}
    sizes = q.grid_sizes(exp)
    if sizes is None:
        return None
    return judge_schedule(experiment_id, exp.get("sweep_variable") or "k", sizes, q.runs(store, experiment_id),
                          q.choosable(store, experiment_id))


def schedule_dict(store: Store, experiment_id: int) -> dict | None:
    s = schedule(store, experiment_id)
    return None if s is None else s.as_dict()


def judge_schedule(experiment_id: int, sweep_variable: str, sizes: list[int], runs: pd.DataFrame,
                   ranked: list[int]) -> Schedule:
    """The schedule from a grid's runs (queries.runs) and its choosable run ids, best first (queries.choosable)."""
    steps = []
    for size in sorted(sizes):
        v = judge(experiment_id, sweep_variable, runs[runs["batch_size"] == size], ranked)
        steps.append(_step(size, v, sweep_variable))
    return Schedule(experiment_id, variable(sweep_variable).name, tuple(steps))


def _step(size: int, v: Verdict, sweep_variable: str) -> Step:
    if v.best is None:
        return Step(size, v, None, False, False, f"at batch {size}: {v.text}")
    loses = v.best.ci[1] < 1.0
    chosen = v.chosen
    gains = not loses and chosen.ci[0] > 1.0
    swept = variable(sweep_variable)
    if loses:
        cost = 100 * (1 - v.best.speedup)
        text = (f"at batch {size} speculation costs {cost:.0f} % ({_interval(v.best)} at the best {swept.name}, "
                f"{swept.show(v.best.value)}): switch it off (k = 0) at batch {size}")
        return Step(size, v, 0, True, False, text)
    text = f"at batch {size}: {v.text}"
    if not gains:
        text += (f"; {swept.name} = {swept.show(chosen.value)} is not measurably faster than the target alone at "
                 f"this batch size (its interval includes 1×): serving without speculation costs nothing measurable")
    return Step(size, v, int(chosen.k) if chosen.k is not None else None, False, gains, text)


def _interval(c) -> str:
    return f"{c.speedup:.2f}× ({c.ci[0]:.2f}–{c.ci[1]:.2f})"
