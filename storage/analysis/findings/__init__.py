"""What an experiment's data says, in a few sentences with their numbers, each with what to try next and a
prefilled link to it: `findings(store, experiment_id, server)` runs the rules (a module per rule or family) in this
order and returns their findings most severe first (rule order within a severity; base.py has a finding's fields, the
thresholds and the context every rule reads; links.py turns a next step into a link). The rules: sampling_mismatch
(arms that decode differently, an error), timing (a run faster than any round can be), validation (does a tuned gain
hold on held-out prompts), schedule (a grid's k per batch size), rejections (why the focus run's drafts are
rejected: by position, by token type, outside a draft's vocabulary, or too few drafts to say), tie (configurations
tied with the best), prediction (the cost-aware prediction and the formula against the measured best k), low_c (a
draft too slow to pay), production (imported production traffic against the lab), confirm (the newest vLLM confirm
beside the lab, with withheld and acceptance_collapse), confirm_prediction (a served cell outside its prediction),
server_spread (one configuration's servings apart), server_answer (the server cost profile's k beside the lab's
choice) and tree (a token tree against the chain). A rule that raises is logged and left out, so the others still
show; under STRICT_ENV (the test suite) it raises. Everything is computed from stored rows when called, read through
storage.records: no SQL, no torch, no streamlit."""

from __future__ import annotations

import logging
import os
from typing import Any

from storage.analysis.findings.acceptance_collapse import HEAD_CHECKS
from storage.analysis.findings.base import (
    ALTERNATIVE_DRAFTERS,
    CHARTS,
    FORMULA_OFF,
    KINDS,
    LOW_ACCEPTANCE,
    LOW_SPEEDUP,
    MIN_REJECTIONS,
    MIN_TYPE_REJECTIONS,
    MIN_VERIFIED,
    MIN_Z,
    MISMATCH_KEYS,
    MODEL_FREE_DRAFTERS,
    MORE_REPEATS,
    OVER_REPRESENTED,
    SAMPLING_KEYS,
    SEVERITY_ORDER,
    SPREAD_NOTED,
    WORTH_IT,
    _Context,
)
from storage.analysis.findings.confirm import _confirm
from storage.analysis.findings.confirm_prediction import _confirm_prediction
from storage.analysis.findings.links import DISTILL_PAGE, NEW_PAGE, prefill_query, prefill_url
from storage.analysis.findings.low_c import _low_c
from storage.analysis.findings.prediction import _formula, _prediction
from storage.analysis.findings.production import _production
from storage.analysis.findings.rejections import _positions_and_types
from storage.analysis.findings.sampling_mismatch import _sampling_mismatch
from storage.analysis.findings.schedule import _schedule
from storage.analysis.findings.server_answer import _server_answer
from storage.analysis.findings.server_spread import _server_spread
from storage.analysis.findings.tie import _tie
from storage.analysis.findings.timing import _timing_warnings
from storage.analysis.findings.tree import _tree
from storage.analysis.findings.validation import _validation
from storage.analysis.findings.withheld import VLLM_CPU_SAMPLING_CAUSE
from storage.analysis.schedule import schedule
from storage.analysis.verdict import judge, judged_runs
from storage.db.store import Store
from storage.records import queries as q

# What callers read from storage.analysis.findings (the modules' own names stay importable from each module).
__all__ = [
    "ALTERNATIVE_DRAFTERS",
    "CHARTS",
    "DISTILL_PAGE",
    "FORMULA_OFF",
    "HEAD_CHECKS",
    "KINDS",
    "LOW_ACCEPTANCE",
    "LOW_SPEEDUP",
    "MIN_REJECTIONS",
    "MIN_TYPE_REJECTIONS",
    "MIN_VERIFIED",
    "MIN_Z",
    "MISMATCH_KEYS",
    "MODEL_FREE_DRAFTERS",
    "MORE_REPEATS",
    "NEW_PAGE",
    "OVER_REPRESENTED",
    "SAMPLING_KEYS",
    "SEVERITY_ORDER",
    "SPREAD_NOTED",
    "STRICT_ENV",
    "VLLM_CPU_SAMPLING_CAUSE",
    "WORTH_IT",
    "findings",
    "prefill_query",
    "prefill_url",
]

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
