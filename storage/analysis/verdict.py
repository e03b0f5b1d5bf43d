"""The verdict: which configuration an experiment measured best, which are statistically tied with it, whether the
interval is too wide to choose by, and which one to deploy. The one place that decides "which run is best": the
headline of the detail page, the findings, validation, deploy (`draftlab export --format deploy` and the "Use these
settings" panel), the Theory page's default run, focus weights and the CLI all read it.

    v = verdict(store, experiment_id)
    v.best      the choosable run with the highest measured speedup (a Choice, None before one finished)
    v.tied      the other choosable runs whose 95 % interval overlaps the best's (engine/metrics/stats.py's tied_with)
    v.too_wide  the best's interval is wider than stats.TOO_WIDE (hi / lo): too wide to choose by
    v.chosen    what to serve, deploy and validate: `serve`, the one rule (SPEC "One answer"): the cheapest of the
                best and its ties that is itself measurably faster than the target alone (engine/config/variables.py's
                cost: a smaller k, a smaller draft, no draft model); None when none is: serve the target alone
    v.k         the k that serves: chosen's, 0 = the target alone, None = nothing finished to judge
    v.text      all of it in one sentence
    v.as_dict() the JSON form (exports, the run document, cached by the pages)

Which runs can be chosen and their order is one SQL rule, queries.CHOOSABLE and queries.RANK (a run that failed,
and a greedy one that is not lossless, queries.lossy, even one stored as done, are never among them; the text names
the latter); the k schedule (storage/analysis/schedule.py) is this
verdict at each batch size of a grid and the experiments listing takes its best columns from `verdicts`; a run's swept
value is engine/config/variables.py's `run_value` (the name for a draft or drafter sweep, the number otherwise). No
torch, no streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from engine.config.variables import Variable, variable
from engine.metrics.stats import TOO_WIDE, tied_with
from engine.wording import plural
from storage.db.store import Store
from storage.records import queries as q


@dataclass(frozen=True)
class Choice:
    """One choosable run: its swept value and what it measured."""

    run_id: int
    value: int | float | str | None  # None: a run without a swept value (engine/config/variables.py's run_value)
    speedup: float
    ci: tuple[float, float]
    k: int | None
    cost: float | None  # engine/config/variables.py's cost of serving its value (None: not comparable)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "value": self.value,
            "speedup": self.speedup,
            "speedup_ci": list(self.ci),
            "k": self.k,
        }


@dataclass(frozen=True)
class Verdict:
    experiment_id: int
    variable: str
    best: Choice | None = None
    tied: tuple[Choice, ...] = ()
    too_wide: bool = False
    chosen: Choice | None = None
    pending: int = 0  # speculative runs still queued or running
    text: str = ""
    candidates: tuple[Choice, ...] = field(default=(), repr=False)  # every choosable run, best first

    @property
    def k(self) -> int | None:
        """The k to serve: the chosen run's, 0 = the target alone (no configuration is measurably faster), None =
        nothing finished to judge yet."""
        if self.best is None:
            return None
        return 0 if self.chosen is None else self.chosen.k

    @property
    def target_alone(self) -> bool:
        """Judged, and no configuration is measurably faster than the target alone: serve it without speculation."""
        return self.best is not None and self.chosen is None

    @property
    def cheaper(self) -> Choice | None:
        """The cheaper tied choice when there is one (then `chosen`), else None."""
        return (
            self.chosen
            if self.chosen is not None and self.best is not None and _cheaper(self.chosen, self.best)
            else None
        )

    def show(self, value: Any) -> str:
        """A swept value as the verdict's sentences write it: 2, 0.7, demo-draft, prompt-lookup:3."""
        return variable(self.variable).show(value)

    def run(self, runs: pd.DataFrame, which: str = "best") -> pd.Series | None:
        """The queries.runs() row of the best (or `chosen`) run; None before there is one."""
        choice = getattr(self, which)
        if choice is None:
            return None
        rows = runs[runs["run_id"] == choice.run_id]
        return rows.iloc[0] if len(rows) else None

    def as_dict(self) -> dict[str, Any]:
        """best, speedup, speedup_ci, tied_with (values), too_wide, text, and best_run_id, chosen (the value to
        deploy; None: the target alone), chosen_run_id, k (the k to serve, 0: the target alone), cheaper (the
        cheaper tied value or None), cheaper_because, variable, pending."""
        b, c = self.best, self.chosen
        return {
            "variable": self.variable,
            "best": b.value if b else None,
            "best_run_id": b.run_id if b else None,
            "speedup": b.speedup if b else None,
            "speedup_ci": list(b.ci) if b else None,
            "tied_with": [t.value for t in self.tied],
            "too_wide": self.too_wide,
            "chosen": c.value if c else None,
            "chosen_run_id": c.run_id if c else None,
            "k": self.k,
            "cheaper": self.cheaper.value if self.cheaper else None,
            "cheaper_because": variable(self.variable).cheaper_because if self.cheaper else None,
            "pending": self.pending,
            "text": self.text,
        }


def verdict(store: Store, experiment_id: int) -> Verdict:
    """The experiment's verdict (an unknown experiment, or one with nothing finished: no best, a sentence why).
    A grid's is the verdict at its smallest batch size; its schedule (storage/analysis/schedule.py) has one per batch
    size."""
    exp = q.experiment(store, experiment_id) or {}
    return _judged(experiment_id, exp, q.verdict_rows(store, experiment_id))


def verdicts(rows: pd.DataFrame) -> dict[int, Verdict]:
    """The verdict of every experiment in queries.verdict_rows(store) (all experiments from one query: the
    experiments listing, storage/analysis/catalog.py): the same as verdict(store, id) for each."""
    return {
        int(eid): _judged(int(eid), group.iloc[0].to_dict(), group)
        for eid, group in rows.groupby("experiment_id", sort=False)
    }


def _judged(experiment_id: int, experiment: dict[str, Any], rows: pd.DataFrame) -> Verdict:
    """The verdict from queries.verdict_rows (choosable runs first, best first) of one experiment."""
    judged = judged_runs(experiment, rows)
    ranked = [int(rid) for rid in judged.loc[judged["choosable"] == 1, "run_id"]]
    v = judge(experiment_id, experiment.get("sweep_variable") or "k", judged, ranked)
    sizes = q.grid_sizes(experiment)
    return replace(v, text=f"at batch {min(sizes)}: {v.text}") if sizes else v


def judged_runs(experiment: dict[str, Any], runs: pd.DataFrame) -> pd.DataFrame:
    """The runs an experiment's one verdict judges: all of them, or a grid's at its smallest batch size
    (storage/analysis/schedule.py judges each batch size)."""
    sizes = q.grid_sizes(experiment)
    return runs[runs["batch_size"] == min(sizes)] if sizes else runs


def verdict_dict(store: Store, experiment_id: int) -> dict[str, Any]:
    """verdict(...).as_dict(): what the pages cache and the exports carry."""
    return verdict(store, experiment_id).as_dict()


def judge(experiment_id: int, sweep_variable: str, runs: pd.DataFrame, ranked: list[int]) -> Verdict:
    """The verdict from an experiment's runs (queries.runs) and its choosable run ids, best first
    (queries.choosable)."""
    swept = variable(sweep_variable)
    spec = runs[runs["kind"] == "speculative"]
    pending = int(spec["status"].isin(["queued", "running"]).sum())
    rows = spec.set_index("run_id", drop=False)
    candidates = tuple(_choice(swept, rows.loc[rid]) for rid in ranked if rid in rows.index)
    lossy = _lossy(swept, spec)
    if not candidates:
        text = "no finished run to choose from yet" if pending else "no run finished with a usable speedup"
        return Verdict(experiment_id, swept.name, pending=pending, text=text + lossy)
    best, others = candidates[0], candidates[1:]
    tied_keys = set(tied_with(best.ci, {c.run_id: c.ci for c in others}))
    tied = tuple(sorted((c for c in others if c.run_id in tied_keys), key=lambda c: _order(c.value)))
    too_wide = best.ci[1] / best.ci[0] > TOO_WIDE if best.ci[0] > 0 else True
    chosen = serve(best, tied, candidates)
    show = swept.show
    text = f"best {swept.name} {show(best.value)} at {_interval(best)}"
    if tied:
        text += f", tied with {_words([show(c.value) for c in tied])}"
    if too_wide:
        text += (
            f"; the interval is too wide to choose by (more than {100 * (TOO_WIDE - 1):.0f} % from end to end): "
            f"rerun with more --repeats or more prompts"
        )
    elif tied and len(tied) == len(others):
        text += "; no configuration is measurably better than the others"
    if chosen is None:
        text += (
            "; serve the target alone (k = 0): speculation is measurably slower"
            if best.ci[1] < 1.0
            else f"; serve the target alone (k = 0): no {swept.name} is measurably faster than it"
        )
    elif _cheaper(chosen, best):
        text += f"; take the cheaper tied {swept.name} = {show(chosen.value)} ({swept.cheaper_because})"
    elif chosen is not best:
        text += (
            f"; serve the tied {swept.name} = {show(chosen.value)} at {_interval(chosen)}: measurably faster "
            f"than the target alone, which the best is not"
        )
    text += lossy
    if pending:
        text += f" ({plural(pending, 'run')} still to finish)"
    return Verdict(experiment_id, swept.name, best, tied, bool(too_wide), chosen, pending, text, candidates)


def _lossy(swept: Variable, spec: pd.DataFrame) -> str:
    """The sentence naming finished runs that are not lossless (queries.lossy: CHOOSABLE leaves them out), or ""."""
    if "outputs_match_baseline" not in spec:
        return ""
    lossy = [
        i
        for i, (same, status) in enumerate(zip(spec["outputs_match_baseline"].tolist(), spec["status"].tolist()))
        if same is False and status == "done"
    ]  # plain lists: the listing judges every experiment at once
    if not lossy:
        return ""
    named = _words(
        [
            f"run {int(r['run_id'])} ({swept.name} = {swept.show(swept.run_value(r))})"
            for _, r in spec.iloc[lossy].iterrows()
        ]
    )
    return (
        f"; {named} {'is' if len(lossy) == 1 else 'are'} not lossless (greedy outputs differ from the "
        f"baseline's): never chosen"
    )


def serve(best: Choice, tied: tuple[Choice, ...], candidates: tuple[Choice, ...]) -> Choice | None:
    """What to serve, the one rule (SPEC "One answer") that the verdict, the k schedule, findings and deploy read:
    the cheapest of the best and its ties that is itself measurably faster than the target alone (its 95 % interval
    wholly above 1; among equally cheap ones, or where costs cannot be compared, the faster); None when none is:
    the target alone, cheaper than any of them, is served (k = 0)."""
    faster = sorted((c for c in (best, *tied) if c.ci[0] > 1.0), key=candidates.index)
    if not faster:
        return None
    top = faster[0]
    if top.cost is None:
        return top
    cheaper = [c for c in faster if c.cost is not None and c.cost < top.cost]
    return min(cheaper, key=lambda c: (c.cost, candidates.index(c))) if cheaper else top


def _cheaper(choice: Choice, than: Choice) -> bool:
    return choice.cost is not None and than.cost is not None and choice.cost < than.cost


def _choice(swept: Variable, row: Any) -> Choice:
    k = row.get("k")
    return Choice(
        int(row["run_id"]),
        swept.run_value(row),
        float(row["speedup"]),
        (float(row["speedup_ci_lo"]), float(row["speedup_ci_hi"])),
        int(k) if k is not None and pd.notna(k) else None,
        swept.run_cost(row),
    )


def _order(value: int | float | str | None) -> tuple[int, int | float, str]:
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def _interval(c: Choice) -> str:
    return f"{c.speedup:.2f}× ({c.ci[0]:.2f}–{c.ci[1]:.2f})"


def _words(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
