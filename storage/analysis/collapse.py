"""Whether a served configuration's acceptance COLLAPSED against the lab's: the server accepts under half of what
the lab measured on the same prompts, and the counts make that certain, not noise (the `confirm` finding that
names what to check, storage/analysis/findings/acceptance_collapse.py).

    collapse(store, series_id, run_id) -> dict | None

The rate compared is the draft acceptance rate (accepted / draft tokens), counted alike by both engines (vLLM's
spec-decode counters, the lab's per-prompt rollups) and free of k. Its intervals, 95 %:
  - the lab's over prompts (storage/production.clustered_ratio: each prompt one draw; tokens of a prompt are not
    independent);
  - the server's from its pooled counters, which have no prompts: Wilson's interval with the number of DRAFTS
    (rounds) as the trials. With a constant k the pooled rate is the mean of the rounds' accepted shares, each in
    [0, 1], so its variance is at most a Bernoulli's over that many rounds: a conservative interval (the tokens of
    one round are not independent either).
Collapsed: the server's upper bound is below HALF the lab's lower bound (and its point below half the lab's): even
the server's most favourable plausible rate is under half the lab's least favourable one. A lab interval needs two
prompts or more; a lab rate of 0 (a random head) can never collapse.
"""

from __future__ import annotations

from typing import Any

from engine.metrics.stats import wilson_interval
from storage.db.store import Store
from storage.records import queries as q
from storage.records.production import clustered_ratio, series_counts

COLLAPSE_RATIO = 0.5  # the server below this share of the lab's rate, at the intervals' edges


def lab_rate(store: Store, run_id: int) -> tuple[float, float, float, int] | None:
    """The lab run's draft acceptance rate (accepted / proposed) with its prompt-clustered 95 % interval and the
    number of prompts that proposed drafts; None when it proposed none."""
    df = q.prompt_proposals(store, run_id)
    estimate = clustered_ratio(df["accepted"], df["proposed"])
    return None if estimate is None else (*estimate, int(len(df)))


def collapse(store: Store, series_id: int, run_id: int) -> dict[str, Any] | None:
    """The server's rate (series `series_id`) against the lab run's, with both intervals and whether it collapsed
    (see the module docstring); None when either side has nothing to compare."""
    counts = series_counts(store, series_id)
    lab = lab_rate(store, run_id)
    if counts is None or lab is None or not counts["drafts"] or not counts["draft_tokens"]:
        return None
    drafts, tokens, accepted = int(counts["drafts"]), int(counts["draft_tokens"]), int(counts["accepted"])
    server = accepted / tokens
    interval = wilson_interval(server * drafts, drafts)
    assert interval is not None  # drafts > 0
    lo, hi = interval
    lab_value, lab_lo, lab_hi, prompts = lab
    known = lab_lo == lab_lo  # NaN under two prompts: no interval, no verdict
    collapsed = bool(known and lab_lo > 0 and server < COLLAPSE_RATIO * lab_value and hi < COLLAPSE_RATIO * lab_lo)
    return {
        "server": server,
        "server_lo": lo,
        "server_hi": hi,
        "drafts": drafts,
        "draft_tokens": tokens,
        "accepted": accepted,
        "lab": float(lab_value),
        "lab_lo": float(lab_lo) if known else None,
        "lab_hi": float(lab_hi) if known else None,
        "prompts": prompts,
        "run_id": int(run_id),
        "collapsed": collapsed,
    }
