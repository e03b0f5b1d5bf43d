"""What an experiment's data says, in a few sentences with their numbers, each with what to try next.

    findings(store, experiment_id) -> list[dict]

Each finding is a dict:

    kind      one of KINDS (below)
    severity  "error" (the experiment is broken: say it loudly), "warning" (a figure cannot be trusted) or "info"
    title     a few words
    detail    one sentence with the numbers it rests on
    chart     the experiment-detail chart that shows it: a key of CHARTS ("speedup", "by-position", ...)
    next      what to try next, in words
    prefill   the New-experiment form's fields for that next step (prefill_url() turns it into a link); a
              "page" key names another page ("distill", which does not exist yet)
    data      the numbers themselves, for programs and tests

Everything is computed from stored rows when called: the aggregations are the SQL GROUP BY queries of
storage.records.queries (acceptance by position and by token type of one run, the runs' own aggregates), the verdict
(storage/analysis/verdict.py: which run is best, which are tied, the cheaper tied choice) and the join of each run
against its baseline (queries.sampling_mismatches); pandas only sifts the few rows those return: no SQL here. A finding
appears only when the data supports it; below the minimum sample (MIN_VERIFIED verified draft tokens) the
position and token-type findings are replaced by one that says the data is too thin. No torch, no streamlit.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

import pandas as pd

from engine.config.drafter_specs import example_specs
from engine.config.run_config import BASELINE_PARAMETERS, PARAMETERS, RunConfig
from engine.config.tree_shape import MAX_TREE_TOKENS, full_tree_nodes
from engine.config.variables import variable
from engine.metrics import theory
from storage.analysis import formula
from storage.analysis import validation as val
from storage.analysis.collapse import collapse
from storage.analysis.prediction_check import moved_words, prediction_check
from storage.analysis.schedule import Schedule, schedule
from storage.analysis.tree_findings import tree_against_chain
from storage.analysis.verdict import Verdict, judge, judged_runs
from storage.db.store import Store
from storage.records import production
from storage.records import queries as q
from storage.records.confirm_checks import predicted_cells, servings
from storage.records.confirms import beside_lab, confirmed_series, latest_measured, measurement_config

# --- thresholds (each rule below names the ones it uses) ------------------------------------------------------
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
NEW_PAGE = "new"  # pages/widgets/nav.py's URL path of the New-experiment page
DISTILL_PAGE = "train"  # pages/widgets/nav.py's Train-a-draft page: `focus_from` preselects the experiment to focus on
# Drafters to suggest, by their declared capabilities (engine/config/drafter_specs.py): those that draft with the model
# but fewer when unsure (k varies), and those that need no draft model at all.
ALTERNATIVE_DRAFTERS = tuple(example_specs(needs_model=True, constant_k=False))
MODEL_FREE_DRAFTERS = tuple(example_specs(needs_model=False))

_log = logging.getLogger(__name__)
# Set by the test suite (tests/conftest.py): a rule that raises fails the test instead of being logged and left out,
# so a bug in a rule cannot pass as "nothing to report".
STRICT_ENV = "DRAFTLAB_STRICT_RULES"


def findings(store: Store, experiment_id: int, server: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The findings of one experiment, most severe first (empty for an unknown experiment or one without data).
    `server`: the server's answer where a server cost profile fits (storage/serving/run_predictions.server_verdict,
    computed by the caller: the analysis reads no profile fit itself), for the `server` rule."""
    experiment = q.experiment(store, experiment_id)
    if experiment is None:
        return []
    runs = q.runs(store, experiment_id)
    grid = schedule(store, experiment_id)  # a grid: the rules below look at its smallest batch size, as its verdict
    judged = judged_runs(experiment, runs)
    verdict = judge(experiment_id, experiment.get("sweep_variable") or "k", judged, q.choosable(store, experiment_id))
    ctx = _Context(store, experiment, judged, verdict, grid, runs)
    ctx.server = server
    found: list[dict[str, Any]] = []
    for rule in (
        _sampling_mismatch,
        _timing_warnings,
        _validation,
        _schedule,
        _positions_and_types,
        _tie,
        _prediction,
        _formula,
        _low_c,
        _production,
        _confirm,
        _confirm_prediction,
        _server_spread,
        _server_answer,
        _tree,
    ):
        try:
            found += rule(ctx)
        except Exception:  # one rule's surprise (a label where a number was expected) must not hide the others
            if os.environ.get(STRICT_ENV) == "1":
                raise
            _log.exception("finding rule %s failed on experiment %s", rule.__name__, experiment_id)
    return sorted(found, key=lambda f: SEVERITY_ORDER[f["severity"]])  # stable: rule order within a severity


# --- links to the next experiment -------------------------------------------------------------------------------


def prefill_query(prefill: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(page URL path, query parameters as strings) of a finding's prefill."""
    page = str(prefill.get("page") or NEW_PAGE)
    return page, {key: _param(value) for key, value in prefill.items() if key != "page" and value is not None}


def prefill_url(prefill: dict[str, Any]) -> str:
    """A relative URL (`new?target=...&sweep=k&values=1%2C2`) that opens the page with the form prefilled; relative,
    so it works under any base URL path."""
    page, params = prefill_query(prefill)
    return f"{page}?{urlencode(params)}" if params else page


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)


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


# --- sampling settings differing between arms -------------------------------------------------------------------


def _sampling_mismatch(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: any speculative run whose temperature/top_k/top_p/seed/max_new_tokens differ from its own baseline's
    (storage/records/queries.py's sampling_mismatches: SQL join of each run with its baseline). Every arm of a
    comparison must decode alike, so this is an error."""
    rows = q.sampling_mismatches(ctx.store, ctx.experiment_id)
    if not rows:
        return []
    parts, data = [], []
    for r in rows:
        differ = {key: (r[key], r[f"b_{key}"]) for key in MISMATCH_KEYS if r[key] != r[f"b_{key}"]}
        what = ", ".join(f"{key} = {run:g} against {base:g}" for key, (run, base) in differ.items())
        value = ctx.swept.run_value(r)
        value = f" ({ctx.variable} = {ctx.show(value)})" if value is not None else ""
        parts.append(f"run {r['run_id']}{value} decoded with {what} in its baseline (run {r['baseline_run_id']})")
        data.append(
            {
                "run_id": int(r["run_id"]),
                "baseline_run_id": int(r["baseline_run_id"]),
                "differ": {key: [float(a), float(b)] for key, (a, b) in differ.items()},
            }
        )
    title = "Sampling settings differ between arms"
    detail = (
        f"{_cap(_join(parts))}: its speedup compares two different decodings, and this should never "
        f"happen (every arm of an experiment shares one sampling configuration)."
    )
    return [
        _finding(
            "sampling_mismatch",
            "error",
            title,
            detail,
            "runs",
            "Do not use these speedups; queue the experiment again and report this as a bug.",
            ctx.prefill(title),
            {"runs": data},
        )
    ]


# --- timing warnings --------------------------------------------------------------------------------------------


def _timing_warnings(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: any run with a timing_warning (its measured speedup exceeds its tokens per round)."""
    spec = ctx.every_run[ctx.every_run["kind"] == "speculative"]
    warned = spec[spec["timing_warning"].notna()]
    if warned.empty:
        return []
    parts = [
        f"the run at {ctx.label(r)} measured {_x(r.speedup)} with {r.tokens_per_round:.2f} tokens per round"
        for r in warned.itertuples()
    ]
    repeats = ctx.more_repeats()
    title = f"Timing drifted in {len(warned)} run{'s' if len(warned) > 1 else ''}"
    detail = (
        f"{_cap(_join(parts))}, faster than any round can be (each costs a target forward), so "
        f"{'these runs are' if len(warned) > 1 else 'this run is'} never picked as the best."
    )
    return [
        _finding(
            "timing_warning",
            "warning",
            title,
            detail,
            "speedup",
            f"Timing drifted: rerun with more --repeats ({repeats}) or on a quieter machine.",
            ctx.prefill(title, repeats=repeats),
            {"run_ids": [int(r) for r in warned["run_id"]], "repeats": repeats},
        )
    ]


# --- a validation experiment: does the gain hold on held-out prompts ---------------------------------------------


def _validation(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (a validation experiment whose run finished): storage/analysis/validation.py's result, the tuning run
    against the held-out one. Holds: info; does not hold (α dropped beyond sampling error, one-sided, or the speedup
    interval fell wholly below the tuning run's): a warning, and the next step tunes again on the held-out set."""
    if not ctx.experiment.get("validates"):
        return []
    result = val.validation_result(ctx.store, ctx.experiment_id)
    if result["holds"] is None:
        return []
    tuned, held = int(result["validates"]), result["validation_set"]
    k = int(result["configuration"]["k"])
    data = {
        "holds": bool(result["holds"]),
        "validates": tuned,
        "tune_set": result["tune_set"],
        "validation_set": held,
        "tune_run_id": int(result["tune"]["run_id"]),
        "validation_run_id": int(result["validation"]["run_id"]),
        "alpha": result["alpha"],
    }
    if result["holds"]:
        title = f"The gain of experiment #{tuned} holds on {held}"
        repeats = ctx.more_repeats()
        next_ = (
            f'Carry k = {k} to production ("Use these settings", in the Serving section), or confirm on more '
            f"prompts or --repeats ({repeats})."
        )
        prefill = ctx.prefill(title, repeats=repeats)
        return [_finding("validation", "info", title, _cap(result["reason"]) + ".", "speedup", next_, prefill, data)]
    title = f"The gain of experiment #{tuned} does not hold on {held}"
    around = sorted({max(1, k // 2), k, k + 1, 2 * k})
    next_ = (
        f"The tuned configuration does not carry over: sweep k again ({_ks(around, ', ')}) on prompts like "
        f"{held}, or tune on a set closer to what you serve."
    )
    prefill = ctx.prefill(title, sweep="k", values=_ks(around), k=None, k_auto=None)
    return [_finding("validation", "warning", title, _cap(result["reason"]) + ".", "speedup", next_, prefill, data)]


# --- a grid: the k schedule across batch sizes --------------------------------------------------------------------


def _schedule(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (a grid with two or more judged batch sizes, storage/analysis/schedule.py): where the schedule serves the
    target alone (speculation measurably slower, or not measurably faster) and from which batch size to switch it off,
    with a follow-up grid between the last batch size that gains and the first that does not; else the k to serve
    at each batch size. Separately, a warning for the batch sizes where no configuration is measurably faster or
    slower than the target alone (served without speculation; more --repeats could show a gain)."""
    grid = ctx.grid
    if grid is None:
        return []
    known = [step for step in grid.steps if step.k is not None]
    if len(known) < 2:
        return []
    out = []
    data = {
        "schedule": [{"batch_size": st.batch_size, "k": st.k} for st in known],
        "ranges": grid.ranges,
        "off_from": grid.off_from,
    }
    off = [st for st in known if st.off]
    if off:
        first = off[0]
        sizes = _join([str(st.batch_size) for st in off])
        title = (
            f"Switch speculation off from batch {grid.off_from}"
            if grid.off_from is not None
            else f"Speculation does not pay at batch {sizes}"
        )
        paying = [st for st in known if not st.off]
        detail = _cap("; ".join(st.text for st in off)) + "."
        if paying:
            detail += " Where it pays: " + "; ".join(st.text.split(": ", 1)[1] for st in paying) + "."
        gaining = [st.batch_size for st in paying if st.batch_size < first.batch_size]
        if gaining:
            low, high = gaining[-1], first.batch_size
            between = sorted(
                {
                    low,
                    *(
                        b
                        for b in (low + (high - low) // 4, (low + high) // 2, high - (high - low) // 4)
                        if low < b < high
                    ),
                    high,
                }
            )
            next_ = (
                f'Serve with the schedule ("Use these settings" carries it to vLLM as '
                f"num_speculative_tokens_per_batch_size), and locate the crossover: the same sweep at batch "
                f"sizes {_join([str(b) for b in between])}."
            )
            prefill = ctx.prefill(title, batch_sizes=",".join(map(str, between)))
        else:
            next_ = (
                "Speculation does not pay at any batch size measured from the smallest up: serve the target "
                f"alone there, or try a drafter without a draft model ({_join(list(MODEL_FREE_DRAFTERS))}) or a "
                f"smaller k."
            )
            prefill = ctx.prefill(
                title,
                sweep="drafter",
                values=",".join(("model", *MODEL_FREE_DRAFTERS)),
                k=1,
                batch_sizes=",".join(str(st.batch_size) for st in known),
            )
        out.append(_finding("schedule", "info", title, detail, "schedule", next_, prefill, data))
    else:
        ks = [st.k for st in known]
        title = (
            f"Serve k = {ks[0]} at every batch size measured"
            if len(set(ks)) == 1
            else "The best k changes with the batch size"
        )
        detail = _cap(grid.text) + "."
        next_ = (
            'Serve with the schedule ("Use these settings" carries it to vLLM as '
            "num_speculative_tokens_per_batch_size); measure larger batch sizes to find where it stops paying."
        )
        larger = [known[-1].batch_size * 2, known[-1].batch_size * 4]
        most = variable("batch_size").upper  # batch size's bound (engine/config/limits.py): always set
        prefill = ctx.prefill(title, batch_sizes=",".join(str(b) for b in larger if most is not None and b <= most))
        out.append(_finding("schedule", "info", title, detail, "schedule", next_, prefill, data))
    unsure = [st for st in known if not st.loses and not st.gains]
    if unsure:
        repeats = ctx.more_repeats()
        unsure_sizes = [str(st.batch_size) for st in unsure]
        title = f"No measurable gain at batch {_join(unsure_sizes)}"
        detail = _cap("; ".join(st.text for st in unsure)) + "."
        out.append(
            _finding(
                "schedule",
                "warning",
                title,
                detail,
                "schedule",
                f"Rerun those batch sizes with more --repeats ({repeats}) or more prompts to decide "
                f"between speculating and serving the target alone.",
                ctx.prefill(title, repeats=repeats, batch_sizes=",".join(unsure_sizes)),
                {"batch_sizes": [st.batch_size for st in unsure], "repeats": repeats},
            )
        )
    return out


# --- why drafts are rejected: positions and token types ---------------------------------------------------------


def _focus_run(ctx: _Context) -> tuple[Any, str | None]:
    """The run the rejection findings look at: the verdict's best, else (no best yet) the speculative run with
    the most verified draft tokens. (row, why) or (None, None)."""
    best = ctx.verdict.run(ctx.spec, "best")
    if best is not None:
        return best, "the best run"
    verified = ctx.spec["accepted"].fillna(0) + ctx.spec["rejected"].fillna(0)
    if verified.empty or verified.max() <= 0:
        return None, None
    return ctx.spec.loc[verified.idxmax()], "the run with the most verified drafts; no best run yet"


def _positions_and_types(ctx: _Context) -> list[dict[str, Any]]:
    row, why = _focus_run(ctx)
    if row is None:
        return []
    verified = int(row.accepted + row.rejected)
    where = f"run {row.run_id} ({ctx.label(row)}, {why})"
    if verified < MIN_VERIFIED:
        title = "Too few verified drafts to say why drafts are rejected"
        sampling = ctx.run_sampling(row)
        tokens = sampling["max_new_tokens"] * 2
        return [
            _finding(
                "thin_data",
                "info",
                title,
                f"{_cap(where)} has {verified} verified draft tokens, under the {MIN_VERIFIED} needed before "
                f"acceptance by position or by token type says anything.",
                "by-position",
                f"Run more prompts or more new tokens per prompt (e.g. max new tokens {tokens}).",
                ctx.prefill(title, **{**sampling, "max_new_tokens": tokens}),
                {"run_id": int(row.run_id), "verified": verified, "minimum": MIN_VERIFIED},
            )
        ]
    return _positions(ctx, row, where) + _token_type(ctx, row, where) + _vocab(ctx, row, where)


def _vocab(ctx: _Context, row: Any, where: str) -> list[dict[str, Any]]:
    """Rule (a draft of another vocabulary, SQL GROUP BY token_type's `outside_vocab`): how much of the target's
    vocabulary the focus run's draft can propose, and what share of its rejections were target tokens outside it
    (rejections no draft over that intersection could avoid; the rest are the draft's own misses)."""
    if getattr(row, "vocab", None) != "intersection":
        return []
    types = q.acceptance_by_type(ctx.store, int(row.run_id))
    verified = int(types["verified"].sum()) if not types.empty else 0
    rejected = verified - int(types["accepted"].sum()) if verified else 0
    if verified < MIN_VERIFIED or rejected == 0:
        return []
    outside = int(types["outside_vocab"].fillna(0).sum())
    coverage = float(row.vocab_coverage) if pd.notna(getattr(row, "vocab_coverage", None)) else math.nan
    shared = f"{_pct(coverage)} of the target's vocabulary" if math.isfinite(coverage) else "part of the vocabulary"
    title = f"The draft can propose {shared}; {_pct(outside / rejected)} of its rejections lie outside it"
    detail = (
        f"In {where}, the draft's tokenizer differs from the target's: it drafts over the tokens both share (vLLM's "
        f"use_heterogeneous_vocab serves the same). {outside} of its {rejected} rejections were target tokens outside "
        f"that set, which no draft over it could have proposed; the other {rejected - outside} are the draft's own."
    )
    next_ = (
        "A draft with the target's tokenizer avoids the first kind: sweep `draft` over it and this one; distilling "
        "needs one tokenizer."
        if outside
        else "The intersection costs nothing here: every rejection is the draft's own."
    )
    return [
        _finding(
            "vocab",
            "info",
            title,
            detail,
            "by-type",
            next_,
            None,
            {
                "run_id": int(row.run_id),
                "vocab_coverage": coverage if math.isfinite(coverage) else None,
                "outside_vocab": outside,
                "rejected": rejected,
                "verified": verified,
            },
        )
    ]


def _positions(ctx: _Context, row: Any, where: str) -> list[dict[str, Any]]:
    """Rule (conditional acceptance by draft position of the focus run, SQL GROUP BY position): the first position
    i with at least MIN_VERIFIED drafts reaching it that accepts under LOW_ACCEPTANCE, the positions from i on
    pooled also under it. Then k above i - 1 mostly wastes draft steps: try k up to i - 1 or a drafter that stops
    early."""
    pos = q.acceptance_by_position(ctx.store, int(row.run_id))
    pos = pos[pos["reached"] > 0].sort_values("position")
    for i in pos["position"]:
        here = pos[pos["position"] == i].iloc[0]
        tail = pos[pos["position"] >= i]
        pooled = tail["accepted"].sum() / tail["reached"].sum()
        if here.reached >= MIN_VERIFIED and here.conditional < LOW_ACCEPTANCE and pooled < LOW_ACCEPTANCE:
            break
    else:
        return []
    i, last = int(i), int(pos["position"].max())
    head = pos[pos["position"] < i]
    span = f"position {i}" if i == last else f"positions {i}–{last}"
    per_round = float(tail["unconditional"].sum())
    steps = last - i + 1
    detail = (
        f"In {where}, draft {span} accepted {int(tail['accepted'].sum())} of the {int(tail['reached'].sum())} "
        f"drafts that reached {'it' if i == last else 'them'} ({_pct(pooled)}; position {i}: "
        f"{int(here.accepted)}/{int(here.reached)}), adding {per_round:.2f} accepted tokens per round for "
        f"{steps} draft step{'s' if steps > 1 else ''} every round"
    )
    data = {
        "run_id": int(row.run_id),
        "position": i,
        "acceptance": float(pooled),
        "position_acceptance": float(here.conditional),
        "reached": int(tail["reached"].sum()),
        "accepted": int(tail["accepted"].sum()),
        "threshold": LOW_ACCEPTANCE,
    }
    # The next experiment sweeps k at this run's own sampling settings.
    sampling = ctx.run_sampling(row)
    if i == 1:
        title = f"Even the first draft position accepts only {_pct(pooled)}"
        detail += "."
        next_ = (
            f"Every draft step mostly wastes its time: keep k = 1 and try a better-aligned draft (distillation) "
            f"or a drafter that drafts less when unsure ({' or '.join(ALTERNATIVE_DRAFTERS)})."
        )
        prefill = ctx.prefill(title, sweep="k", values="1", k=None, k_auto=None, **sampling)
    else:
        head_rate = head["accepted"].sum() / head["reached"].sum()
        title = f"Draft positions {i}+ accept only {_pct(pooled)}"
        detail += f", while {'position 1' if i == 2 else f'positions 1–{i - 1}'} accepted {_pct(head_rate)}."
        data["head_acceptance"] = float(head_rate)
        next_ = (
            f"k above {i - 1} mostly wastes draft steps: try k = {_ks(range(1, i), ', ')}, or a drafter that "
            f"drafts less when unsure ({' or '.join(ALTERNATIVE_DRAFTERS)})."
        )
        prefill = ctx.prefill(title, sweep="k", values=_ks(range(1, i)), k=None, k_auto=None, **sampling)
    # A drafter that stops early keeps the run's k as its cap (heuristic: as its starting k).
    drafters = [
        {
            "label": f"the {d} drafter",
            "prefill": ctx.prefill(
                f"{title}: the {d} drafter",
                sweep="k",
                values=str(int(row.k)),
                k=None,
                k_auto=None,
                drafter=d,
                **sampling,
            ),
        }
        for d in ALTERNATIVE_DRAFTERS
    ]
    return [_finding("positions", "info", title, detail, "by-position", next_, prefill, data, drafters)]


def _token_type(ctx: _Context, row: Any, where: str) -> list[dict[str, Any]]:
    """Rule (acceptance by token type of the focus run, SQL GROUP BY token_type): per type, its share of the run's
    rejections over its share of verified drafts. Blamed: the type with the highest ratio, at least
    OVER_REPRESENTED, with at least MIN_TYPE_REJECTIONS rejections (of at least MIN_REJECTIONS in the run) and
    a rejection count MIN_Z binomial standard deviations above what the run's overall rejection rate predicts."""
    types = q.acceptance_by_type(ctx.store, int(row.run_id))
    if types.empty:
        return []
    types = types.assign(rejected=types["verified"] - types["accepted"])
    verified, rejected = int(types["verified"].sum()), int(types["rejected"].sum())
    if verified < MIN_VERIFIED or rejected < MIN_REJECTIONS or rejected == verified:
        return []
    rate = rejected / verified
    types = types.assign(
        draft_share=types["verified"] / verified,
        rejection_share=types["rejected"] / rejected,
        z=(types["rejected"] - types["verified"] * rate) / (types["verified"] * rate * (1 - rate)) ** 0.5,
    )
    types = types.assign(ratio=types["rejection_share"] / types["draft_share"])
    blamed = types[
        (types["ratio"] >= OVER_REPRESENTED) & (types["rejected"] >= MIN_TYPE_REJECTIONS) & (types["z"] >= MIN_Z)
    ]
    if blamed.empty:
        return []
    t = blamed.sort_values(["ratio", "rejected"], ascending=False).iloc[0]
    title = f"Tokens of type {t.token_type} draw {t.ratio:.1f}× their share of rejections"
    detail = (
        f"In {where}, {t.token_type} tokens are {_pct(t.rejection_share)} of the rejections "
        f"({int(t.rejected)} of {rejected}) but {_pct(t.draft_share)} of the verified drafts "
        f"({int(t.verified)} of {verified}): the target refuses {_pct(t.rejected / t.verified)} of them against "
        f"{_pct(rate)} overall."
    )
    prefill: dict[str, Any] | None = {
        "page": DISTILL_PAGE,
        "focus_from": ctx.experiment_id,
        "focus": str(t.token_type),
        "target": ctx.experiment["target"],
        "draft": ctx.experiment["draft"],
    }
    distil = f"Distil the draft with a focus on {t.token_type} tokens."
    if getattr(row, "vocab", None) == "intersection":  # distillation needs the target's tokenizer
        prefill = None
        distil = f"Distil a draft with the target's tokenizer, focused on {t.token_type} tokens."
    return [
        _finding(
            "token_type",
            "info",
            title,
            detail,
            "by-type",
            distil,
            prefill,
            {
                "run_id": int(row.run_id),
                "token_type": str(t.token_type),
                "ratio": float(t.ratio),
                "rejection_share": float(t.rejection_share),
                "draft_share": float(t.draft_share),
                "rejected": int(t.rejected),
                "verified": int(t.verified),
                "run_rejected": rejected,
                "run_verified": verified,
            },
        )
    ]


# --- statistically tied best configurations ---------------------------------------------------------------------


def _tie(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: the verdict ties other configurations with the best (95 % intervals overlapping the best one's); the
    next step takes the verdict's cheaper tied choice when there is one (what deploy carries)."""
    v = ctx.verdict
    if v.best is None or not v.tied:
        return []
    shown = [v.best, *v.tied]
    parts = [f"{ctx.variable} = {ctx.show(c.value)} at {_x(c.speedup)} ({c.ci[0]:.2f}–{c.ci[1]:.2f})" for c in shown]
    repeats = ctx.more_repeats()
    cheaper = v.cheaper
    title = f"{len(shown)} configurations are statistically tied"
    detail = (
        f"The 95 % intervals of {_join(parts)} overlap: the measurement cannot tell "
        f"{'them' if len(shown) > 2 else 'the two'} apart."
    )
    if cheaper is not None:
        next_ = (
            f"Take the cheaper {ctx.variable} = {ctx.show(cheaper.value)} ({ctx.swept.cheaper_because}; what "
            f'"Use these settings" deploys), or add prompts or --repeats ({repeats}) to separate them.'
        )
    else:
        next_ = f"Add prompts or --repeats ({repeats}) to separate them."
    tied_values: list[Any] = [c.value for c in shown]
    values = ",".join(ctx.show(value) for value in (tied_values if ctx.swept.categorical else sorted(tied_values)))
    prefill = ctx.prefill(
        title,
        sweep=ctx.variable,
        values=values,
        k_auto=None,
        repeats=repeats,
        k=None if ctx.variable == "k" else int(ctx.experiment["k"]),
    )
    return [
        _finding(
            "tie",
            "info",
            title,
            detail,
            "speedup",
            next_,
            prefill,
            {
                "best": v.best.value,
                "tied_with": [c.value for c in v.tied],
                "cheaper": cheaper.value if cheaper else None,
                "repeats": repeats,
            },
        )
    ]


def _tree(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (token trees): each finished tree run against the chain at the same k with every other setting equal
    (storage/analysis/tree_findings.py): which gained in speedup (95 % intervals apart, else neither) and what the
    tree's branches bought in tokens per round for the nodes it verified. The chain formula does not model trees:
    tree runs have no formula prediction (storage/records/queries.py)."""
    found = []
    for pair in tree_against_chain(ctx.done):
        tree, chain, k = pair.tree, pair.chain, pair.k
        shape = f"tree_topk {pair.topk}, {tree.nodes} nodes verified per round"
        title = (
            f"The token tree ({shape}) beats the chain at k = {k}"
            if pair.gained == "tree"
            else f"The chain beats the token tree ({shape}) at k = {k}"
            if pair.gained == "chain"
            else f"The token tree ({shape}) and the chain at k = {k} are tied"
        )
        detail = (
            f"Tree {tree.text()}; chain {chain.text()}: the branches bought {pair.extra_tokens:+.2f} tokens per "
            f"round for {tree.nodes} verified nodes against the chain's {chain.nodes}"
            + (
                "."
                if pair.gained != "neither"
                else f" and the speedup intervals {'overlap' if tree.ci and chain.ci else 'are not both measured'}."
            )
        )
        if pair.gained == "tree":
            sizes = sorted({0, k + 1, min(2 * (k + 1), full_tree_nodes(k, pair.topk), MAX_TREE_TOKENS)})
            next_ = (
                "Serve the tree (SGLang takes it: see deploy); sweep --tree-tokens for the smallest tree that keeps it."
            )
            prefill = ctx.prefill(
                title,
                sweep="tree_tokens",
                values=",".join(map(str, sizes)),
                k_auto=None,
                k=k,
                tree_topk=pair.topk,
                tree_tokens=None,
            )
        else:
            next_ = (
                "Keep the chain (--tree-topk 1, what every engine serves), or try a smaller tree (--tree-tokens) "
                "whose verify costs less."
            )
            prefill = None
        found.append(_finding("tree", "info", title, detail, "speedup", next_, prefill, pair.as_dict()))
    return found


# --- predictions against the measurement (k sweeps) -------------------------------------------------------------


def _k_runs(ctx: _Context) -> pd.DataFrame:
    """Finished, usable runs of a k sweep (at least two, else nothing to choose between)."""
    if ctx.variable != "k" or ctx.verdict.best is None:
        return ctx.done.iloc[:0]
    done = ctx.done[ctx.done["k"].notna()]
    return done if done["k"].nunique() >= 2 else done.iloc[:0]


def _prediction(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (k sweeps with two or more finished k): the k with the highest predicted_speedup_refined against the
    measured best k (the verdict's); the same k, or one tied with it, is agreement."""
    done = _k_runs(ctx)
    done = done[done["predicted_speedup_refined"].notna()]
    if done["k"].nunique() < 2:
        return []
    measured = ctx.verdict.run(done)
    top_k = formula.cost_aware_top(done)  # storage/analysis/formula.py: the one cost-aware best k (the Theory page's)
    if ctx.verdict.best is None or measured is None or top_k is None:  # the best has no cost-aware prediction
        return []
    best = int(ctx.verdict.best.value)  # type: ignore[arg-type]  # a k sweep: the value is a k
    k_ref = top_k[0]
    top = done[done["k"] == k_ref].sort_values("predicted_speedup_refined", ascending=False).iloc[0]
    data = {
        "measured_best": best,
        "refined_best": k_ref,
        "measured_speedup": float(measured.speedup),
        "refined_at_best": float(measured.predicted_speedup_refined),
    }
    if k_ref == best or k_ref in [c.value for c in ctx.verdict.tied]:
        tie = "" if k_ref == best else f" (k = {k_ref}, tied with the measured best k = {best})"
        title = f"The cost-aware prediction agrees: k = {best}"
        detail = (
            f"The cost-aware prediction picks the measured best{tie}: it puts k = {best} at "
            f"{_x(measured.predicted_speedup_refined)} where {_x(measured.speedup)} was measured."
        )
        k_max = int(done["k"].max())
        next_ = (
            f"On this pair, k auto (measure k = {k_max}, predict every smaller k, confirm the 3 best) can stand "
            f"in for a full sweep."
        )
        prefill = ctx.prefill(title, sweep="auto", values=None, k=None, k_auto=max(k_max, 2))
    else:
        title = f"The cost-aware prediction picks k = {k_ref}, the measurement k = {best}"
        detail = (
            f"The cost-aware prediction puts k = {k_ref} at {_x(top.predicted_speedup_refined)} and k = {best} "
            f"at {_x(measured.predicted_speedup_refined)}, but k = {k_ref} measured {_x(top.speedup)} and "
            f"k = {best} {_x(measured.speedup)}."
        )
        repeats = ctx.more_repeats()
        next_ = (
            f"The gap is timing noise or per-round overhead: measure k = {_ks([k_ref, best], ', ')} again "
            f"with more --repeats ({repeats})."
        )
        prefill = ctx.prefill(title, sweep="k", values=_ks([k_ref, best]), k=None, k_auto=None, repeats=repeats)
    return [_finding("prediction", "info", title, detail, "predictions", next_, prefill, data)]


def _formula(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (k sweeps with two or more finished k): the article's formula (storage/analysis/formula.py: α and c pooled
    over the finished constant-k runs, a grid's at its judged batch size only) picks its best k and predicts the
    measured best k's speedup from the same curve. Said when its best k differs from the measured one or it is off by
    FORMULA_OFF or more; the mean verify_cost says why (the formula assumes a verify pass costs 1 target step)."""
    done = _k_runs(ctx)
    if done.empty:
        return []
    # a grid: the judged (smallest) batch size's runs only, as the verdict judges (α and c differ per batch size)
    at = min(ctx.grid.steps, key=lambda s: s.batch_size).batch_size if ctx.grid is not None and ctx.grid.steps else None
    pooled = formula.pooled_inputs(ctx.store, ctx.experiment_id, at)
    if pooled is None:
        return []
    measured = ctx.verdict.run(done)
    if ctx.verdict.best is None or measured is None:
        return []
    best = int(ctx.verdict.best.value)  # type: ignore[arg-type]  # a k sweep: the value is a k
    alpha, c = pooled.alpha, pooled.c
    k_f, s_f = pooled.best_k()
    at_best = pooled.speedup(best)
    error = float(at_best / measured.speedup - 1)
    if k_f == best and abs(error) < FORMULA_OFF:
        return []
    verify = float(done["verify_cost"].mean()) if done["verify_cost"].notna().any() else math.nan
    if verify > 1.05:
        why = f"a verify pass costs {verify:.2f} target steps here, not the formula's 1"
    elif not math.isnan(verify):
        why = f"the verify pass costs {verify:.2f} target steps, so the gap is overhead outside draft and verify steps"
    else:
        why = "the verify cost was not measured"
    title = (
        f"Predicted from α and c alone, (1 − α^(k+1)) / ((1 − α)(1 + k/c)) picks k = {k_f}, the measurement k = {best}"
        if k_f != best
        else f"Predicted from α and c alone, (1 − α^(k+1)) / ((1 − α)(1 + k/c)) is off by {100 * error:+.0f} % at "
        f"k = {best}"
    )
    detail = (
        f"With {pooled.describe()}, the formula's best k is {k_f} at {_x(s_f)} and it puts k = {best} "
        f"at {_x(at_best)} against {_x(measured.speedup)} measured ({100 * error:+.0f} %): {why}."
    )
    k_max = max(int(done["k"].max()), k_f, 2)
    return [
        _finding(
            "formula",
            "info",
            title,
            detail,
            "speedup",
            "Choose k by the cost-aware prediction (k auto), not the formula.",
            ctx.prefill(title, sweep="auto", values=None, k=None, k_auto=k_max),
            {
                "formula_best": k_f,
                "formula_speedup": float(s_f),
                "measured_best": best,
                "error": error,
                "alpha": alpha,
                "c": c,
                "verify_cost": None if math.isnan(verify) else verify,
            },
        )
    ]


# --- a draft too slow to pay -------------------------------------------------------------------------------------


def _c_needed(alpha: float, goal: float = WORTH_IT) -> float | None:
    """The smallest c (to 2 digits) with which the formula's best k reaches `goal` at this α; None if no c can
    (the formula's limit as c grows is 1 / (1 - α))."""
    if alpha >= 1 or 1 / (1 - alpha) <= goal:
        return None
    lo, hi = 1.0, 1e6
    if theory.best_k(alpha, hi, k_max=64)[1] < goal:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if theory.best_k(alpha, mid, k_max=64)[1] < goal else (lo, mid)
    return math.ceil(hi * 100) / 100  # rounded up: the c returned does reach the goal


def _low_c(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: over the finished speculative runs with at least MIN_VERIFIED verified drafts and a measured c, the
    highest speedup the formula predicts at its best k (theory.best_k with the run's α and c) is under LOW_SPEEDUP.
    The formula is the optimistic bound (it ignores the verify pass's cost), so the draft cannot pay."""
    spec = ctx.spec[
        (ctx.spec["status"] == "done")
        & ctx.spec["c"].notna()
        & ctx.spec["alpha"].notna()
        & (ctx.spec["accepted"] + ctx.spec["rejected"] >= MIN_VERIFIED)
    ]
    if spec.empty:
        return []
    rows = [(theory.best_k(float(r.alpha), float(r.c)), r) for r in spec.itertuples() if r.c > 0]
    if not rows:
        return []
    (k_f, s_f), r = max(rows, key=lambda kv: kv[0][1])
    if s_f >= LOW_SPEEDUP:
        return []
    need = _c_needed(float(r.alpha))
    title = f"The draft is too slow to pay (c = {r.c:.2f})"
    detail = (
        f"With α = {r.alpha:.3f} and c = {r.c:.2f} ({ctx.label(r)}, the most promising run), even the formula's "
        f"best k ({k_f}) predicts only {_x(s_f)}, and the formula leaves out the verify pass's cost"
        + (
            f"; at this α the draft {ctx.experiment['draft']} would need c ≥ {need:.1f} to reach {_x(WORTH_IT)}."
            if need
            else f"; at this α no draft speed reaches {_x(WORTH_IT)}."
        )
    )
    prefill = ctx.prefill(title, sweep="k", values="2,4,8", k=None, k_auto=None, drafter=MODEL_FREE_DRAFTERS[0])
    return [
        _finding(
            "low_c",
            "info",
            title,
            detail,
            "cost",
            f"Try a faster (smaller) draft, or a drafter without a draft model "
            f"({_join(list(MODEL_FREE_DRAFTERS))}: no draft step to pay for).",
            prefill,
            {
                "run_id": int(r.run_id),
                "alpha": float(r.alpha),
                "c": float(r.c),
                "best_k": k_f,
                "predicted": float(s_f),
                "c_needed": need,
            },
        )
    ]


# --- production against the lab ----------------------------------------------------------------------------------


def _production(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: per imported production series (storage/records/production.py) with a lab run of its k, production α (or
    the draft acceptance rate when the server counts no positions) against the lab run's prompt-clustered 95 %
    interval; outside it, the traffic differs from the prompts tuned on (a warning); inside, the lab holds (info)."""
    found = []
    confirmed = confirmed_series(
        ctx.store, ctx.experiment_id
    )  # a confirm's counters are production series too: its own rule reads them
    for item in production.comparison(ctx.store, ctx.experiment_id):
        if item.get("metric") is None or item["series_id"] in confirmed:
            continue
        name = "α" if item["metric"] == "alpha" else "draft acceptance rate"
        figures = (
            f"production {name} {item['production']:.3f} vs lab {item['lab']:.3f} "
            f"({item['lo']:.3f}–{item['hi']:.3f}, run {item['run_id']})"
        )
        where = ""
        if item.get("position"):
            p = item["position"]
            where = (
                f"; the first position outside the lab's interval is {p['position']}: {p['production']:.3f} vs "
                f"{p['lab']:.3f} ({p['lo']:.3f}–{p['hi']:.3f})"
            )
        data = {
            key: item.get(key)
            for key in ("series_id", "run_id", "metric", "production", "lab", "lo", "hi", "outside", "position")
        }
        if item["outside"]:
            title = f"Production ({item['label']}) falls outside the lab's interval"
            detail = (
                f"{_cap(figures)}{where}: the traffic differs from the prompts tuned on ({ctx.experiment['prompts']})."
            )
            found.append(
                _finding(
                    "production",
                    "warning",
                    title,
                    detail,
                    "production",
                    "Capture prompts from production and distill the draft on them (Train a draft), "
                    "then validate on held-out production prompts.",
                    {"page": "train"},
                    data,
                )
            )
        else:
            title = f"Production ({item['label']}) matches the lab"
            detail = f"{_cap(figures)}{where}: the lab's verdict holds for this traffic."
            found.append(
                _finding(
                    "production",
                    "info",
                    title,
                    detail,
                    "production",
                    "Nothing to change; import again after the traffic changes.",
                    None,
                    data,
                )
            )
    return found


# --- confirmed in the serving engine -------------------------------------------------------------------------------


def _confirm(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: the newest confirm with speculative measurements (storage/records/confirms.py), per configuration and
    concurrency: greedy outputs with speculation that differ from the server's own target-only outputs (an error:
    the server's speculation is not lossless there); the server's speedup interval wholly above 1 (gains) or
    below 1 (loses), beside the lab's at the same batch size; and the first draft position where the server's
    conditional acceptance lies outside the lab run's 95 % interval (same prompts, so the engines draft
    differently, not the traffic); or, beyond that, the server's acceptance COLLAPSED against the lab's
    (`_collapse`: what to check instead)."""
    confirm_id = latest_measured(ctx.store, ctx.experiment_id)
    if confirm_id is None:
        return []
    found = []
    rows = beside_lab(ctx.store, confirm_id)
    by_series = {item["series_id"]: item for item in production.comparison(ctx.store, ctx.experiment_id)}
    seen: set[tuple[str, int]] = set()
    for r in rows.itertuples(index=False):
        if (r.speculative_config, int(r.concurrency)) in seen:
            continue  # the same configuration served twice in one confirm (before v20): `_server_spread` says it
        seen.add((r.speculative_config, int(r.concurrency)))
        where = f"{r.label} (k={r.k}) at concurrency {r.concurrency}"
        data = {"confirm_id": int(confirm_id), "label": r.label, "k": int(r.k), "concurrency": int(r.concurrency)}
        if (
            r.outputs_match_server_baseline == r.outputs_match_server_baseline
            and r.outputs_match_server_baseline is not None
            and r.outputs_match_server_baseline < 1
        ):
            found.append(
                _finding(
                    "confirm",
                    "error",
                    f"In vLLM, {where} changes the outputs",
                    f"Greedy, only {_pct(r.outputs_match_server_baseline)} of the prompts decode as the server's own "
                    f"target-only outputs ({r.first_divergence or 'no divergence stored'}): the server's speculation "
                    f"is not lossless here.",
                    "confirm",
                    "Report it to the engine with the speculative config; serve without speculation until it is fixed.",
                    None,
                    {**data, "outputs_match_server_baseline": float(r.outputs_match_server_baseline)},
                )
            )
        lo, hi = r.speedup_ci_lo, r.speedup_ci_hi
        lab_gains = (
            r.lab_speedup_ci_lo == r.lab_speedup_ci_lo and r.lab_speedup_ci_lo is not None and r.lab_speedup_ci_lo > 1
        )
        if lo == lo and hi == hi and lo is not None and lo <= 1 <= hi and lab_gains:
            found.append(
                _finding(
                    "confirm",
                    "warning",
                    f"In vLLM, {where} does not gain what the lab measured",
                    f"The server's speedup is {_x(r.speedup)} ({lo:.2f}–{hi:.2f}, over passes), tied with the target "
                    f"alone; the lab measured {_x(r.lab_speedup)} "
                    f"({r.lab_speedup_ci_lo:.2f}–{r.lab_speedup_ci_hi:.2f}) at batch size {r.concurrency}.",
                    "confirm",
                    "Confirm again with more passes, or serve the target alone at this concurrency.",
                    None,
                    {
                        **data,
                        "speedup": float(r.speedup),
                        "lo": float(lo),
                        "hi": float(hi),
                        "gains": None,
                        "lab_speedup": float(r.lab_speedup),
                    },
                )
            )
        elif lo == lo and hi == hi and lo is not None and (lo > 1 or hi < 1):
            gains = lo > 1
            lab = (
                f"; the lab measured {_x(r.lab_speedup)} ({r.lab_speedup_ci_lo:.2f}–{r.lab_speedup_ci_hi:.2f}) at "
                f"batch size {r.concurrency}"
                if r.lab_speedup == r.lab_speedup
                and r.lab_speedup is not None
                and r.lab_speedup_ci_lo == r.lab_speedup_ci_lo
                else f"; the lab's schedule serves the target alone at batch size {r.concurrency}, so vLLM drafts "
                f"nothing there and only its overhead is left"
                if r.k == 0
                else f"; the lab did not measure k = {r.k} at batch size {r.concurrency}"
            )
            disagree = not gains and lab_gains
            found.append(
                _finding(
                    "confirm",
                    "warning" if disagree else "info",
                    f"In vLLM, {where} {'gains' if gains else 'loses'}",
                    f"The server's speedup is {_x(r.speedup)} ({lo:.2f}–{hi:.2f}, over passes){lab}"
                    + (": the lab's gain does not carry over to the server here." if disagree else "."),
                    "confirm",
                    "Serve it at this concurrency."
                    if gains
                    else "Serve the target alone at this concurrency, or a smaller k (a k grid at this batch size and "
                    "--configs schedule give vLLM a k per batch size).",
                    None,
                    {
                        **data,
                        "speedup": float(r.speedup),
                        "lo": float(lo),
                        "hi": float(hi),
                        "gains": gains,
                        "lab_speedup": None if r.lab_speedup != r.lab_speedup else r.lab_speedup,
                    },
                )
            )
        withheld = _withheld(r, where, data)
        found += withheld
        if withheld and withheld[0]["severity"] == "error":
            continue  # the server's sampling changed the outputs: its acceptance says the same, nothing to check
        found += _collapse(ctx, r, where, data)
        item = by_series.get(r.series_id)
        if item and item.get("position") and item["position"]["position"] <= r.positions:
            p = item["position"]
            found.append(
                _finding(
                    "confirm",
                    "warning",
                    f"In vLLM, {where} accepts differently at position {p['position']}",
                    f"The server accepts {p['production']:.3f} at position {p['position']}, the lab {p['lab']:.3f} "
                    f"({p['lo']:.3f}–{p['hi']:.3f}, run {item['run_id']}): on the same prompts, the two engines draft "
                    f"differently (draft sampling, the prompt's rendering or numerics; this confirm does not tell "
                    f"which).",
                    "confirm",
                    "Compare the draft's sampling (vLLM drafts greedily by default) and the prompts' rendering "
                    "with the lab's; serve by the server's figures.",
                    None,
                    {**data, "series_id": int(r.series_id), "position": p},
                )
            )
    return found


def _confirm_prediction(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: a cell of the newest confirm whose measured speedup falls outside the interval predicted for it before it
    was measured (storage/records/confirm_checks.py: a server cost profile other than this confirm and the lab run's
    acceptance), naming which side moved (storage/analysis/prediction_check.py): acceptance (the lab's tokens per
    step against the server's counters' over the same passes) or cost (the profile's step ratio t_k / t_0 against
    this confirm's own), both, or neither (the time outside the decode steps)."""
    confirm_id = latest_measured(ctx.store, ctx.experiment_id)
    if confirm_id is None:
        return []
    found = []
    for cell in predicted_cells(ctx.store, confirm_id):
        check = prediction_check(cell)
        if check is None or not check["outside"]:
            continue
        where = f"{cell['label']} (k={cell['k']}) at concurrency {cell['concurrency']}"
        lo, hi = cell["predicted_speedup_ci"]
        ci = cell["speedup_ci"]
        measured = _x(cell["speedup"]) + (f" ({ci[0]:.2f}–{ci[1]:.2f}, over passes)" if ci else " (one pass)")
        profile = cell["predicted_profile_id"]
        elsewhere = [
            f"{what} {theirs or 'unknown'} against this confirm's {ours or 'unknown'}"
            for what, theirs, ours in (
                ("hardware", cell["profile_hardware"], cell["hardware"]),
                ("vLLM", cell["profile_engine_version"], cell["engine_version"]),
            )
            if theirs != ours
        ]
        steps = (
            f"Profile again where this confirm ran (`draftlab profile {ctx.experiment_id}`): the server's step costs "
            f"are not profile {profile}'s"
            + (f" ({'; '.join(elsewhere)})" if elsewhere else " (the same machine and vLLM: its load changed)")
            + "."
        )
        drafts = (
            "The server accepts differently from the lab on the same prompts (see this confirm's acceptance "
            "findings): predictions take the lab's acceptance, so check that the server drafts what the lab measured."
        )
        next_ = " ".join({"acceptance": drafts, "cost": steps}[side] for side in check["moved"]) or (
            "Confirm again with more passes (--repeats) on a quieter machine: the time outside the decode steps "
            "(prefill, queueing) and the spread between server starts are not in the prediction."
        )
        found.append(
            _finding(
                "confirm",
                "warning",
                f"In vLLM, {where} measured outside its prediction",
                f"The server measured {measured}, {check['direction']} the {_x(cell['predicted_speedup'])} "
                f"({lo:.2f}–{hi:.2f}) predicted from profile {profile} and the lab's acceptance: {moved_words(check)}.",
                "confirm",
                next_,
                None,
                {
                    "confirm_id": int(confirm_id),
                    "label": cell["label"],
                    "k": cell["k"],
                    "concurrency": cell["concurrency"],
                    "speedup": cell["speedup"],
                    "predicted_speedup": cell["predicted_speedup"],
                    "predicted_speedup_ci": [lo, hi],
                    "predicted_profile_id": profile,
                    **check,
                },
            )
        )
    return found


def _server_spread(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: a configuration of the newest confirm that the experiment served more than once at one concurrency (in
    two confirms, or twice in one before identical configurations were served once), its speedups SPREAD_NOTED or
    more apart: the server's own spread between starts, reported as that and not as a difference between the lab
    and the server (info)."""
    confirm_id = latest_measured(ctx.store, ctx.experiment_id)
    if confirm_id is None:
        return []
    found = []
    for (config, concurrency), servings_of in servings(ctx.store, ctx.experiment_id).items():
        mine = [s for s in servings_of if s["confirm_id"] == confirm_id]
        lo, hi = min(s["speedup"] for s in servings_of), max(s["speedup"] for s in servings_of)
        if not mine or lo <= 0 or hi / lo - 1 < SPREAD_NOTED:
            continue
        confirms = sorted({s["confirm_id"] for s in servings_of})
        where = f"{mine[0]['label']} (k={mine[0]['k']}) at concurrency {concurrency}"
        found.append(
            _finding(
                "confirm",
                "info",
                f"In vLLM, {where} measured {_x(lo)} to {_x(hi)} over {len(servings_of)} servings",
                f"The same speculative configuration, served {len(servings_of)} times at concurrency {concurrency} "
                f"(confirm{'s' if len(confirms) > 1 else ''} {', '.join(map(str, confirms))}), measured "
                f"{', '.join(_x(s['speedup']) for s in servings_of)}: {_pct(hi / lo - 1)} apart, the server's own "
                f"spread between starts (no lab figure enters it); one confirm's interval covers its own passes only.",
                "confirm",
                "Judge the lab's figure against the range of the servings, not one of them; confirm again to see "
                "how wide the range runs on this machine.",
                None,
                {
                    "confirm_id": int(confirm_id),
                    "label": mine[0]["label"],
                    "k": mine[0]["k"],
                    "concurrency": int(concurrency),
                    "speculative_config": config,
                    "servings": servings_of,
                    "lo": lo,
                    "hi": hi,
                },
            )
        )
    return found


def _server_answer(ctx: _Context) -> list[dict[str, Any]]:
    """Rule: where a server cost profile fits the experiment's runs, the server's answer (what deploy serves: the run
    and its k per concurrency predicted from its acceptance and the server's step costs), beside the lab's verdict,
    whose speedups time DraftLab's own loop. A warning where the two disagree (the lab serves the target alone and
    the server gains, or the server's k at its smallest concurrency is not the lab's choice), info where they agree;
    info too where a profile fits but no k is predicted surely faster in the server."""
    server = ctx.server
    if not server or not server.get("fitted"):
        return []
    eid = ctx.experiment_id
    chosen = server.get("chosen")
    if chosen is None:
        return [
            _finding(
                "server",
                "info",
                "In vLLM, no configuration is predicted surely faster",
                f"From the stored server cost profiles: {server['reason']}. The lab's verdict stands: "
                f"{ctx.verdict.text}.",
                "server",
                f"Profile more passes (`draftlab profile {eid} --repeats 10`) for narrower intervals, or confirm a "
                f"configuration in the server (`draftlab confirm {eid}`).",
                None,
                {"chosen": None, "reason": server["reason"]},
            )
        ]
    label, run_id = chosen["profile"]["label"], int(chosen["run_id"])
    # the k it serves at the smallest concurrency that speculates (server_answer chose a run that gains somewhere)
    concurrency, server_k = next(
        (int(c), int(k)) for c, k in sorted(chosen["schedule"].items(), key=lambda x: int(x[0])) if int(k)
    )
    lab_chosen = ctx.verdict.chosen
    value = lab_chosen.value if lab_chosen is not None else None
    if ctx.variable == "k":  # a k sweep: the same k, whichever run of it
        agree = isinstance(value, (int, float)) and int(value) == server_k
    else:  # another variable: the same run
        agree = lab_chosen is not None and lab_chosen.run_id == run_id
    lab_says = (
        f"the lab's own loop chose {ctx.swept.name} {ctx.swept.show(lab_chosen.value)} (run {lab_chosen.run_id})"
        if lab_chosen is not None
        else "the lab's own loop serves the target alone"
    )
    return [
        _finding(
            "server",
            "info" if agree else "warning",
            f"In vLLM, serve k={server_k} at concurrency {concurrency} (predicted)"
            + ("" if agree else ", not the lab's choice"),
            f"{_cap(label)}, from run {run_id}'s acceptance and the server's step costs: {server['said']}; "
            f"{lab_says} ({ctx.verdict.text}). The lab times DraftLab's transformers loop, the prediction the "
            f"server's own steps: deploy and confirm serve the server's answer.",
            "server",
            f"Confirm it in the server: `draftlab confirm {eid}` (chosen, one k) or `--configs schedule` (its k per "
            f"concurrency, where it changes).",
            None,
            {
                "chosen_run_id": run_id,
                "profile_id": chosen["profile"]["profile_id"],
                "schedule": chosen["schedule"],
                "lab_run_id": lab_chosen.run_id if lab_chosen is not None else None,
                "agree": agree,
            },
        )
    ]


# Why a sampled server's outputs can differ with speculation, read in vLLM 0.32.0's CPU build and reproduced by calling
# its expand_batch_to_tokens (docs/metrics.md, "Confirm in a serving engine").
VLLM_CPU_SAMPLING_CAUSE = (
    "A cause in vLLM 0.32's CPU build: vllm/utils/cpu_triton_utils.py's _expand_kernel_impl writes into an int64 "
    "copy of its output (_ensure_int64), so the rejection sampler's expand_batch_to_tokens returns uninitialised "
    "memory for the float32 temperatures and apply_sampling_constraints divides the verified logits by it; greedy "
    "requests return before that, so greedy outputs stay equal."
)


def _withheld(r: Any, where: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Rule: a measurement whose speedup is withheld (storage/records/confirms.py's `withheld`): sampled outputs that
    differ from the server's own target-only ones (an error: the server's speculation changed the output distribution),
    or a speedup above the server's tokens per step (a warning: the timing, not a result). Greedy outputs that differ
    are the "changes the outputs" error already."""
    warning = r.speedup_warning if isinstance(r.speedup_warning, str) else None
    test = json.loads(r.outputs_test) if isinstance(r.outputs_test, str) else None
    if test is not None and test.get("differs"):
        return [
            _finding(
                "confirm",
                "error",
                f"In vLLM, {where}: speculation changed the output distribution in this server",
                f"{_cap(warning or 'no speedup is shown')} (sampled with the experiment's settings, against the same "
                f"server's target-only answers to the same prompts; {test['tests']}, family-wise α {test['alpha']:g}). "
                f"{VLLM_CPU_SAMPLING_CAUSE}",
                "confirm",
                "Serve without speculation under sampling in this server until it is fixed (greedy requests are not "
                "affected), or confirm in another build or engine.",
                None,
                {**data, "outputs_test": test},
            )
        ]
    if (
        warning is None
        or r.outputs_match_server_baseline == r.outputs_match_server_baseline
        and r.outputs_match_server_baseline is not None
        and r.outputs_match_server_baseline < 1
    ):
        return []
    return [
        _finding(
            "confirm",
            "warning",
            f"In vLLM, {where} has no speedup to show",
            _cap(warning) + ".",
            "confirm",
            "Confirm again with more passes (--repeats) on a quieter machine.",
            None,
            {**data, "speedup_warning": warning},
        )
    ]


# What to check when a served EAGLE-3 head accepts far less than in the lab, each from vLLM 0.32's and SGLang's
# source (engine/models/eagle3.py's docstring has the file:line of each).
HEAD_CHECKS = (
    (
        "aux_layer_ids",
        "the aux-layer ids: vLLM (and DraftLab) read eagle_aux_hidden_state_layer_ids as the INPUT of "
        "decoder layer i (transformers' hidden_states[i]); SGLang and SpecForge write the OUTPUT of "
        "layer i, one lower, and vLLM reads an SGLang-layout eagle_config's ids unshifted too, so a "
        "head trained there reads one layer too early here unless each id is raised by 1 (`draftlab "
        "convert-head --to speculators` does; `draftlab check-head {head} --target {target}` measures "
        "which ids fit)",
    ),
    (
        "norm_before_fc",
        "norm_before_fc: vLLM applies the head's input_norm when config.json sets it and drops that "
        "weight when it does not; SGLang never applies it. The flag must say how the head was trained",
    ),
    (
        "d2t",
        "the draft vocabulary mapping: a draft id d proposes target id d + d2t[d]; a head drafting over the whole "
        "vocabulary has no d2t in vLLM (its lm_head rows must be in target-id order), and a d2t built for "
        "another tokenizer or vocabulary proposes the wrong ids",
    ),
    (
        "chat_template",
        "the chat template: the head learned from text rendered with the target's chat template; the "
        "server tokenizes the lab's rendered prompts with the target's tokenizer (check BOS and the "
        "template match what the head was trained on)",
    ),
)


def _collapse(ctx: _Context, r: Any, where: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Rule (storage/analysis/collapse.py): a confirmed constant-k configuration whose server acceptance collapsed
    against its lab run's (the server's upper bound under half the lab's lower bound, on the same prompts). For an
    EAGLE-3 head the finding names the head directory and what to check (HEAD_CHECKS); for any other drafter, that the
    server drafts with something else than the lab measured."""
    if r.series_id is None or r.series_id != r.series_id or r.run_id is None or r.run_id != r.run_id:
        return []
    config = measurement_config(ctx.store, int(r.measurement_id))
    if config.get("num_speculative_tokens_per_batch_size"):
        return []  # a schedule's k varies with the batch: its rate is not one k's
    result = collapse(ctx.store, int(r.series_id), int(r.run_id))
    if result is None or not result["collapsed"]:
        return []
    figures = (
        f"The server accepts {result['server']:.3f} of its draft tokens (at most {result['server_hi']:.3f} "
        f"over {result['drafts']} drafts), the lab {result['lab']:.3f} ({result['lab_lo']:.3f}–"
        f"{result['lab_hi']:.3f} over {result['prompts']} prompts, run {result['run_id']})"
    )
    facts = {**data, **result, "method": config.get("method"), "head": None, "checks": []}
    if config.get("method") == "eagle3":
        head = str(config.get("model") or "")
        target = ctx.experiment.get("target") or "TARGET"
        facts.update(head=head, checks=[key for key, _ in HEAD_CHECKS])
        return [
            _finding(
                "confirm",
                "warning",
                f"In vLLM, the EAGLE-3 head of {where} collapses",
                f"{figures}: under half the lab's even at the intervals' edges, on the same prompts, so the server "
                f"reads the head {head} differently from the lab.",
                "confirm",
                "Check, in order: "
                + "; ".join(
                    f"({i}) {check.format(head=head, target=target)}" for i, (_, check) in enumerate(HEAD_CHECKS, 1)
                )
                + ".",
                None,
                facts,
            )
        ]
    return [
        _finding(
            "confirm",
            "warning",
            f"In vLLM, {where} collapses",
            f"{figures}: under half the lab's even at the intervals' edges, on the same prompts.",
            "confirm",
            "Check that the server drafts with what the lab measured: the speculative config's model, its dtype and "
            "tokenizer, and the prompts' rendering.",
            None,
            facts,
        )
    ]
