"""Why drafts are rejected: the `positions`, `token_type`, `vocab` and `thin_data` rules, on one focus run (the
verdict's best, else the run with the most verified drafts).

Below MIN_VERIFIED verified draft tokens only `thin_data` fires (too few to say anything). Above it: `positions`
where a draft position and those after it accept under LOW_ACCEPTANCE (k above it mostly wastes draft steps);
`token_type` where one token type draws far more than its share of the rejections (distil the draft on it); and
`vocab` for a draft of another vocabulary, the share of its rejections that were target tokens outside the
vocabularies' intersection."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from storage.analysis.findings.base import (
    ALTERNATIVE_DRAFTERS,
    LOW_ACCEPTANCE,
    MIN_REJECTIONS,
    MIN_TYPE_REJECTIONS,
    MIN_VERIFIED,
    MIN_Z,
    OVER_REPRESENTED,
    _cap,
    _Context,
    _finding,
    _ks,
    _pct,
)
from storage.analysis.findings.links import DISTILL_PAGE
from storage.records import queries as q


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
