"""The test oracle: SPEC.md's metrics computed in Python from in-memory engine records.

What users see is storage's SQL over stored rows (storage/records/recording.py's rollups, storage/records/queries.py,
storage/analysis/formula.py); tests/test_storage.py holds the two equal on crafted runs. Besides the tests, only
`draftlab distill` reads it, for a draft's α before anything is stored. Its `speedup` is the ratio of throughputs
over the same prompts, decoded once each: what storage/stats.paired_speedup gives when every prompt was decoded by
both arms (the product pairs prompts and repeats; this oracle does not).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from engine.decoding.records import ACCEPTED, DISCARDED, REJECTED, PromptResult
from engine.metrics.theory import predicted_speedup


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def target_step_seconds(baseline: list[PromptResult]) -> float | None:
    """Mean time of one single-token target forward, measured in the target-only run."""
    return _ratio(sum(p.decode_seconds for p in baseline), sum(p.decode_steps for p in baseline))


def throughput(results: list[PromptResult]) -> dict[str, Any]:
    new_tokens = sum(p.new_tokens for p in results)
    wall = sum(p.wall_seconds for p in results)
    return {"new_tokens": new_tokens, "wall_seconds": wall, "tokens_per_second": _ratio(new_tokens, wall)}


def speculative_metrics(results: list[PromptResult], baseline: list[PromptResult] | None = None) -> dict[str, Any]:
    """Round, acceptance, timing and speedup metrics of one speculative run (SPEC names)."""
    rounds = [r for p in results for r in p.rounds]
    tokens = [t for r in rounds for t in r.draft_tokens]
    verified = [t for t in tokens if t.outcome != DISCARDED]
    proposed = sum(r.k for r in rounds)
    accepted = sum(t.outcome == ACCEPTED for t in tokens)
    rejected = sum(t.outcome == REJECTED for t in tokens)
    k_max = max((r.k for r in rounds), default=0)
    reached, hits = [0] * k_max, [0] * k_max
    by_type: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])  # token type -> [accepted, verified]
    for t in verified:
        reached[t.position - 1] += 1
        hits[t.position - 1] += t.outcome == ACCEPTED
        by_type[t.token_type][0] += t.outcome == ACCEPTED
        by_type[t.token_type][1] += 1
    kls = [t.kl for t in verified if not math.isnan(t.kl)]
    entropies = [t.target_entropy for t in verified if t.target_entropy is not None]
    draft_forwards = sum(r.draft_forwards for r in rounds)
    m: dict[str, Any] = {
        **throughput(results),
        "rounds": len(rounds),
        "proposed": proposed,
        "accepted": accepted,
        "rejected": rejected,
        "draft_acceptance_rate": _ratio(accepted, proposed),
        "alpha": _ratio(accepted, accepted + rejected),
        "tokens_per_round": _ratio(sum(len(r.emitted_ids) for r in rounds), len(rounds)),
        "expected_alpha": _ratio(sum(t.beta for t in verified), len(verified)),
        "kl": _ratio(sum(kls), len(kls)),
        "target_entropy": _ratio(sum(entropies), len(entropies)),
        "per_position_acceptance": [_ratio(h, n) for h, n in zip(hits, reached)],
        "acceptance_by_type": {k: v[0] / v[1] for k, v in sorted(by_type.items())},
        "draft_step_seconds": _ratio(sum(r.draft_seconds for r in rounds), draft_forwards),
        "c": None,
        "predicted_speedup": None,
        "speedup": None,
    }
    if baseline:
        step = target_step_seconds(baseline)
        m["c"] = _ratio(step, m["draft_step_seconds"]) if step else None
        base_tps = throughput(baseline)["tokens_per_second"]
        m["speedup"] = _ratio(m["tokens_per_second"], base_tps) if m["tokens_per_second"] else None
        if m["alpha"] is not None and m["c"] and k_max:
            m["predicted_speedup"] = predicted_speedup(m["alpha"], k_max, m["c"])
    return m


def outputs_match(results: list[PromptResult], baseline: list[PromptResult]) -> bool:
    """Token-for-token equality of every prompt's output with the target-only run."""
    base = {p.prompt_index: p.output_ids for p in baseline}
    return all(base.get(p.prompt_index) == p.output_ids for p in results) and len(results) == len(base)
