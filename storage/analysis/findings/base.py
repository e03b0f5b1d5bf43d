"""The findings' shared machinery: the shape of a finding, the thresholds the rules name, the context every rule
reads (the experiment, its runs, the verdict, a grid's schedule) and the words their sentences share.

Each finding is a dict (`_finding` builds it):

    kind          one of KINDS (below)
    severity      "error" (the experiment is broken: say it loudly), "warning" (a figure cannot be trusted) or "info"
    title         a few words
    detail        one sentence with the numbers it rests on
    chart         the experiment-detail chart that shows it: a key of CHARTS ("speedup", "by-position", ...)
    next          what to try next, in words
    prefill       the New-experiment form's fields for that next step (links.prefill_url() turns it into a link); a
                  "page" key names another page (links.DISTILL_PAGE)
    alternatives  other next steps, each a label and its prefill (the positions rule's drafters)
    data          the numbers themselves, for programs and tests

Everything is computed from stored rows when called: the aggregations are the SQL GROUP BY queries of
storage.records.queries (acceptance by position and by token type of one run, the runs' own aggregates), the verdict
(storage/analysis/verdict.py: which run is best, which are tied, the cheaper tied choice) and the join of each run
against its baseline (queries.sampling_mismatches); pandas only sifts the few rows those return: no SQL here. A finding
appears only when the data supports it; below the minimum sample (MIN_VERIFIED verified draft tokens) the
position and token-type findings are replaced by one that says the data is too thin. No torch, no streamlit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from engine.config.drafter_specs import example_specs
from engine.config.run_config import BASELINE_PARAMETERS, PARAMETERS, RunConfig
from engine.config.variables import variable
from storage.analysis import formula
from storage.analysis.schedule import Schedule
from storage.analysis.verdict import Verdict
from storage.db.store import Store

# --- thresholds (each rule's docstring names the ones it uses) ------------------------------------------------
MIN_VERIFIED = formula.MIN_VERIFIED  # verified draft tokens below which a share or a rate is not reported
LOW_ACCEPTANCE = 0.30  # a draft position accepting less than this (conditional) mostly wastes its draft step
MIN_REJECTIONS = 10  # rejections of the run below which no token type is blamed
MIN_TYPE_REJECTIONS = 5  # rejections of one token type below which it is not blamed
OVER_REPRESENTED = 1.5  # rejection share / draft share from which a token type is blamed ...
MIN_Z = 2.0  # ... when its rejection count is also this many binomial SDs above the run's rate
FORMULA_OFF = 0.10  # |formula / measured - 1| from which the formula is said to be off
LOW_SPEEDUP = 1.05  # the formula's best speedup under which a draft cannot pay
WORTH_IT = 1.2  # the speedup a faster draft is asked to reach (the c it would need is reported)
MORE_REPEATS = 5  # the least --repeats suggested when a measurement has to be repeated
SPREAD_NOTED = 0.05  # servings of one configuration this far apart (highest / lowest − 1) are the server's own spread

# What every arm must share with its own baseline: what the target's own decoding depends on
# (engine/config/run_config.py).
MISMATCH_KEYS = BASELINE_PARAMETERS
SAMPLING_KEYS = tuple(key for key in BASELINE_PARAMETERS if key != "batch_size")  # a run's sampling, for a link
KINDS = (
    "sampling_mismatch",
    "timing_warning",
    "validation",
    "positions",
    "token_type",
    "thin_data",
    "tie",
    "prediction",
    "formula",
    "low_c",
    "production",
    "schedule",
    "confirm",
    "server",
    "tree",
    "vocab",
)
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
# The experiment-detail page's charts a finding can point at (the panel maps each to its anchor on the page).
CHARTS = (
    "speedup",
    "predictions",
    "cost",
    "by-position",
    "by-type",
    "runs",
    "production",
    "schedule",
    "confirm",
    "server",
)
# Drafters to suggest, by their declared capabilities (engine/config/drafter_specs.py): those that draft with the model
# but fewer when unsure (k varies), and those that need no draft model at all.
ALTERNATIVE_DRAFTERS = tuple(example_specs(needs_model=True, constant_k=False))
MODEL_FREE_DRAFTERS = tuple(example_specs(needs_model=False))


# --- shared context ---------------------------------------------------------------------------------------------


class _Context:
    def __init__(
        self,
        store: Store,
        experiment: dict[str, Any],
        runs: pd.DataFrame,
        verdict: Verdict,
        grid: Schedule | None = None,
        every_run: pd.DataFrame | None = None,
    ) -> None:
        self.store, self.experiment, self.runs, self.verdict = store, experiment, runs, verdict
        self.grid = grid  # a grid's storage/analysis/schedule.py Schedule (then `runs` are its smallest batch size's)
        self.every_run = runs if every_run is None else every_run
        self.server: dict[str, Any] | None = None  # the server's answer, where a profile fits (findings' `server`)
        self.experiment_id = int(experiment["experiment_id"])
        self.variable = verdict.variable
        self.swept = variable(self.variable)
        spec = runs[runs["kind"] == "speculative"]
        self.spec = spec
        # What the verdict chooses from (queries.CHOOSABLE): finished, usable, never warned.
        self.done = spec[spec["run_id"].isin([c.run_id for c in verdict.candidates])]

    def value(self, v: Any) -> int | float | str:
        """A swept value (a stored number, or a name) as the variable's type."""
        return self.swept.coerce(v)

    def show(self, v: Any) -> str:
        return self.swept.show(v)

    def label(self, row: Any) -> str:
        """`k = 4` (a k sweep), `temperature = 0.7` or `drafter = prompt-lookup:3`."""
        value = self.swept.run_value(row)
        return f"run {row.run_id}" if value is None else f"{self.variable} = {self.show(value)}"

    def prefill(self, title: str, **fields: Any) -> dict[str, Any]:
        """The experiment's own configuration as a link (RunConfig.to_url: every parameter, a grid's batch sizes)
        with `fields` changed (a None value drops that field), so a follow-up measures where this one did."""
        base = {
            **RunConfig.from_experiment(self.experiment).to_url(),  # every parameter (engine/config/run_config.py)
            "notes": f"Follow-up to experiment #{self.experiment_id}: {title}",
        }
        base.update(fields)
        return {key: value for key, value in base.items() if value is not None}

    def run_sampling(self, row: Any) -> dict[str, Any]:
        """A run's own sampling settings (in a sampling sweep they differ from the experiment's defaults)."""
        return {key: PARAMETERS[key].coerce(row[key]) for key in SAMPLING_KEYS}

    def more_repeats(self) -> int:
        return max(MORE_REPEATS, 2 * int(self.experiment.get("repeats") or 1))


def _finding(
    kind: str,
    severity: str,
    title: str,
    detail: str,
    chart: str,
    next_: str,
    prefill: dict[str, Any] | None,
    data: dict[str, Any],
    alternatives: Iterable[Any] = (),
) -> dict[str, Any]:
    assert kind in KINDS and chart in CHARTS, (kind, chart)
    return {
        "kind": kind,
        "severity": severity,
        "title": title,
        "detail": detail,
        "chart": chart,
        "next": next_,
        "prefill": prefill,
        "alternatives": list(alternatives),
        "data": data,
    }


def _cap(s: str) -> str:
    """First letter up, the rest untouched (str.capitalize would lowercase model names)."""
    return s[:1].upper() + s[1:]


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _x(s: float) -> str:
    return f"{s:.2f}×"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ks(values: Iterable[Any], sep: str = ",") -> str:
    """Distinct k values in order: "1,2" for a form field, "1, 2" (sep=", ") for a sentence."""
    return sep.join(str(int(v)) for v in sorted(set(int(v) for v in values)))
