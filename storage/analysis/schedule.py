"""The k schedule of a grid experiment (`--batch-size 1,4,16 --k 1,2,3,4`): at each batch size, the verdict among
that batch size's runs (storage/analysis/verdict.py's one rule: best, ties, too wide), and what to serve there.

What to serve is the verdict's `chosen` at that batch size (storage/analysis/verdict.py's `serve`, the one rule of SPEC
"One answer", which "Use these settings", findings and deploy read too):
- the cheapest configuration among the best and those tied with it that is itself measurably faster than the
  target alone (`gains`: its whole 95 % interval above 1; a tied k whose interval reaches 1 is tied with the target
  alone too, which is cheaper still);
- if none is, the target alone (k = 0, `off`): where the best's interval lies wholly below 1 speculation measurably
  loses (`loses`), and where it includes 1 the target alone is tied with the best and cheaper (more repeats or
  prompts could still show a gain: the step says so).

    s = schedule(store, experiment_id)     None unless the experiment is a grid
    s.steps       one Step per batch size, smallest first
    s.ranges      vLLM's num_speculative_tokens_per_batch_size entries [start_bs, end_bs, k]
    s.off_from    the batch size from which every measured batch size is served without speculation
    s.text        the schedule in one sentence; each step's own sentence is step.text

Each batch size's runs are paired with their own target-only baseline at that batch size, so a step's speedups
are that batch size's. Only a k grid has a schedule to serve as k; a grid over another variable has the same
choice per batch size (its `value`). No torch, no streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from engine.config.variables import variable
from engine.errors import DraftLabError
from storage.analysis.verdict import Choice, Verdict, judge
from storage.db.store import Store
from storage.records import queries as q


@dataclass(frozen=True)
class Step:
    """One batch size of the schedule."""

    batch_size: int
    verdict: Verdict
    served: Choice | None  # the run whose configuration to serve; None when off or nothing finished
    k: int | None  # the k to serve: the served run's, 0 = the target alone, None = nothing finished to choose from
    loses: bool  # the best run's interval lies wholly below 1: speculation measurably loses here
    gains: bool  # a configuration is served: its interval lies wholly above 1
    text: str

    @property
    def off(self) -> bool:
        """Served without speculation (the target alone)."""
        return self.k == 0

    @property
    def value(self) -> int | float | str | None:
        """The served swept value (a k, a drafter, ...); None when off or nothing finished."""
        return None if self.served is None else self.served.value

    def as_dict(self) -> dict[str, Any]:
        best, shown = self.verdict.best, self.served or self.verdict.best
        return {
            "batch_size": self.batch_size,
            "k": self.k,
            "value": self.value,
            "off": self.off,
            "loses": self.loses,
            "gains": self.gains,
            "run_id": self.served.run_id if self.served else None,
            "speedup": shown.speedup if shown else None,
            "speedup_ci": list(shown.ci) if shown else None,
            "best": best.value if best else None,
            "best_run_id": best.run_id if best else None,
            "tied_with": [t.value for t in self.verdict.tied],
            "too_wide": self.verdict.too_wide,
            "text": self.text,
        }


@dataclass(frozen=True)
class Schedule:
    experiment_id: int
    variable: str
    steps: tuple[Step, ...]

    def at(self, batch_size: int | None = None) -> Step:
        """The step of a batch size (None: the smallest); a DraftLabError names the batch sizes measured."""
        if batch_size is None and self.steps:
            return self.steps[0]
        for step in self.steps:
            if step.batch_size == batch_size:
                return step
        sizes = ", ".join(str(s.batch_size) for s in self.steps)
        raise DraftLabError(f"experiment {self.experiment_id} measured no batch size {batch_size}; pick one of {sizes}")

    @property
    def ranges(self) -> list[list[int]]:
        """vLLM's `num_speculative_tokens_per_batch_size`: [start_bs, end_bs, k] entries, the first from batch size
        1, each measured batch size's k until the next measured one (vLLM keeps the last entry's k above its end).
        Batch sizes without a finished choice are left out; empty for a grid over something other than k."""
        known = [s for s in self.steps if s.k is not None]
        if self.variable != "k" or not known:  # (known: k is the served k, 0 when off)
            return []
        out: list[list[int]] = []
        for i, step in enumerate(known):
            start = 1 if i == 0 else step.batch_size
            end = known[i + 1].batch_size - 1 if i + 1 < len(known) else step.batch_size
            assert step.k is not None  # known
            if out and out[-1][2] == step.k:  # the same k as the range before: one range
                out[-1][1] = end
            else:
                out.append([start, end, step.k])
        return out

    @property
    def off_from(self) -> int | None:
        """The smallest batch size from which every measured batch size is served without speculation."""
        first = None
        for step in self.steps:
            if step.off:
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
            best = s.verdict.best
            if s.k is None or best is None:  # (best is None: k is None)
                parts.append(f"batch {s.batch_size}: {s.verdict.text}")
            elif s.loses:
                parts.append(f"batch {s.batch_size}: off (slower: {_interval(best)} at best)")
            elif s.off:
                parts.append(f"batch {s.batch_size}: off (not measurably faster: {_interval(best)} at best)")
            else:
                assert s.served is not None  # served: neither off nor undecided
                parts.append(
                    f"batch {s.batch_size}: {swept.name} = {swept.show(s.served.value)} ({_interval(s.served)})"
                )
        text = ("k schedule: " if self.variable == "k" else f"best {swept.name} per batch size: ") + "; ".join(parts)
        off = self.off_from
        if off is not None:
            text += f". Switch speculation off from batch {off}"
        return text

    def k_schedule(self) -> list[dict[str, Any]]:
        """SPEC's `k_schedule` of a grid's run JSON: per batch size the k served (0: the target alone), its speedup
        and interval (null when off), the values tied with the best, and a sentence where it is off or undecided."""
        out = []
        for step in self.steps:
            served = step.served
            entry: dict[str, Any] = {
                "batch_size": step.batch_size,
                "k": step.k,
                "speedup": served.speedup if served else None,
                "speedup_ci": list(served.ci) if served else None,
                "tied_with": [t.value for t in step.verdict.tied],
            }
            if served is None:
                entry["text"] = step.text
            out.append(entry)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "variable": self.variable,
            "steps": [s.as_dict() for s in self.steps],
            "num_speculative_tokens_per_batch_size": self.ranges or None,
            "off_from": self.off_from,
            "text": self.text,
        }


def schedule(store: Store, experiment_id: int) -> Schedule | None:
    """The experiment's schedule, None when it is not a grid."""
    exp = q.experiment(store, experiment_id) or {}
    sizes = q.grid_sizes(exp)
    if sizes is None:
        return None
    return judge_schedule(
        experiment_id,
        exp.get("sweep_variable") or "k",
        sizes,
        q.runs(store, experiment_id),
        q.choosable(store, experiment_id),
    )


def schedule_dict(store: Store, experiment_id: int) -> dict[str, Any] | None:
    s = schedule(store, experiment_id)
    return None if s is None else s.as_dict()


def judge_schedule(
    experiment_id: int, sweep_variable: str, sizes: list[int], runs: pd.DataFrame, ranked: list[int]
) -> Schedule:
    """The schedule from a grid's runs (queries.runs) and its choosable run ids, best first (queries.choosable)."""
    steps = []
    for size in sorted(sizes):
        v = judge(experiment_id, sweep_variable, runs[runs["batch_size"] == size], ranked)
        steps.append(_step(size, v, sweep_variable))
    return Schedule(experiment_id, variable(sweep_variable).name, tuple(steps))


def _step(size: int, v: Verdict, sweep_variable: str) -> Step:
    """What to serve at one batch size: the verdict's `chosen` (storage/analysis/verdict.py's `serve`, the one rule),
    with its sentence."""
    swept = variable(sweep_variable)
    best, served = v.best, v.chosen
    if best is None:
        return Step(size, v, None, None, False, False, f"at batch {size}: {v.text}")
    if best.ci[1] < 1.0:
        cost = 100 * (1 - best.speedup)
        text = (
            f"at batch {size} speculation costs {cost:.0f} % ({_interval(best)} at the best {swept.name}, "
            f"{swept.show(best.value)}): switch it off (k = 0) at batch {size}"
        )
        return Step(size, v, None, 0, True, False, text)
    if served is None:
        text = (
            f"at batch {size} no {swept.name} is measurably faster than the target alone (the best, "
            f"{swept.name} = {swept.show(best.value)}, at {_interval(best)}): serve the target alone there "
            f"(k = 0: tied with the best, and cheaper); more --repeats or prompts could still show a gain"
        )
        return Step(size, v, None, 0, False, False, text)
    name, show = swept.name, swept.show
    text = f"at batch {size}: serve {name} = {show(served.value)} at {_interval(served)}"
    if served is not best:
        text += f", tied with the best, {name} = {show(best.value)} at {_interval(best)}, and " + (
            f"cheaper ({swept.cheaper_because})"
            if v.cheaper is not None
            else "measurably faster than the target alone, which the best is not"
        )
    slower = [c for c in v.tied if c.ci[0] <= 1.0 and c is not served]
    if slower:
        text += (
            f"; {name} = {', '.join(show(c.value) for c in slower)} also tied with the best but not measurably "
            f"faster than the target alone"
        )
    if v.too_wide:
        text += "; the best's interval is too wide to choose by: rerun with more --repeats or more prompts"
    return Step(size, v, served, int(served.k) if served.k is not None else None, False, True, text)


def _interval(c: Choice) -> str:
    return f"{c.speedup:.2f}× ({c.ci[0]:.2f}–{c.ci[1]:.2f})"
