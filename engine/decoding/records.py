"""Plain records the engine hands out: one per draft token, per round, per prompt; and `settle_round`, the
rule that turns a verified round into its emitted tokens and draft outcomes.

Nothing here knows about torch, a database or a UI; storage and metrics consume these as they are.
Names follow ../shared/SPEC.md.

These dataclasses are the one description of what a run stores: every field of a plain type (int, float, str) is
a column of its record's table under the field's name (DraftToken: draft_tokens, Round: rounds, PromptResult:
prompt_results), and a Round field declared with `metadata=PER_PROMPT_SUM` is also summed into its prompt's row.
storage/db/schema.py declares, storage/db/migrations.py adds and storage/records/recording.py fills those columns
from `stored_fields` and `summed_fields`, so a new measurement is a field here (and the code that measures it).
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass, field, fields

# dataclasses.field metadata of a Round measurement that adds up over a prompt (its prompt row holds the sum).
PER_PROMPT_SUM = types.MappingProxyType({"per_prompt": "sum"})
STORED_TYPES = (int, float, str)  # a field of one of these (or None) is a column; lists and nested records are not

# Outcomes of a proposed draft token. Draft i owns output slot i of its round (itself when accepted, else the
# correction that replaced it). When an EOS or max_new_tokens cuts the round, only drafts whose slot was emitted
# are accepted / rejected; every draft past the cut is discarded, even one verification accepted, so
# `accepted` counts emitted drafts and `rejected` rounds whose correction was emitted.
ACCEPTED, REJECTED, DISCARDED = "accepted", "rejected", "discarded"
# Kinds of an emitted token.
CORRECTION, BONUS = "correction", "bonus"  # plus ACCEPTED


@dataclass
class DraftToken:
    """One token the drafter proposed in a round."""

    position: int  # 1..k within its round
    token_id: int
    text: str
    token_type: str
    p_draft: float  # processed draft probability of this token
    p_target: float  # processed target probability of this token
    beta: float  # sum_x min(p_d(x), p_t(x)) at this position (processed distributions)
    kl: float  # D_KL(p_t || p_d) at this position, raw temperature-1 distributions (nan if the drafter has none)
    outcome: str  # accepted / rejected / discarded
    # Token trees: a tree round's rows are the path verification walked, one per depth (position = depth).
    sibling_rank: int | None = None  # 0 = the drafter's top-ranked child at this depth; None for chains
    siblings: int | None = None  # children verified at this depth under the accepted parent; None for chains
    # A draft with another vocabulary (engine/models/vocab_bridge.py): 1 when this draft was rejected for a token
    # outside the vocabulary both share (one the draft could not have proposed), 0 for one inside; None otherwise.
    outside_vocab: int | None = None
    # The entropy of the target's raw (temperature 1, unfiltered) distribution at this position, in nats: how unsure
    # the target itself was where this draft was verified (a rejection where it is high is the target's doubt, one
    # where it is low the draft's miss). None in records made before it was measured.
    target_entropy: float | None = None


@dataclass
class Round:
    """One draft-then-verify round."""

    prompt_index: int
    round_index: int
    k: int  # tokens proposed this round (k_r)
    accepted: int  # a_r: accepted draft tokens that were emitted (a cut round counts none past the cut)
    emitted_ids: list[int]  # tokens this round appended to the output (a_r + 1 unless cut by EOS/max_new_tokens)
    emitted_kinds: list[str]  # accepted / correction / bonus, parallel to emitted_ids
    draft_seconds: float = field(metadata=PER_PROMPT_SUM)
    verify_seconds: float = field(metadata=PER_PROMPT_SUM)
    draft_forwards: int = field(metadata=PER_PROMPT_SUM)  # single-step draft forwards taken while drafting (for c)
    draft_tokens: list[DraftToken] = field(default_factory=list)
    tree_nodes: int | None = None  # draft nodes the target verified this round (token trees); None for chains
    # Block verification: what the standard rule would have accepted on the same drafts with the same uniforms (cut
    # where the round was cut, as `accepted` is); None under the standard rule.
    accepted_standard: int | None = None

    @property
    def rejected(self) -> int:
        return sum(t.outcome == REJECTED for t in self.draft_tokens)


@dataclass
class PromptResult:
    """What one prompt produced in one run (speculative or target-only)."""

    prompt_index: int
    prompt: str
    output_ids: list[int]  # new tokens only
    text: str
    wall_seconds: float  # generation wall time (tokenization and loading excluded)
    # Target-only runs: single-token decode steps and their total time (the numerator of c).
    decode_steps: int = 0
    decode_seconds: float = 0.0
    # Speculative runs: the rounds; the first new token comes from the target's prefill and belongs to none.
    rounds: list[Round] = field(default_factory=list)
    # When each output token reached the host, seconds from the decode's start (a batch's start for the batched
    # decoders; a speculative round's tokens share its time); None from a decoder that reports no arrivals.
    token_seconds: list[float] | None = None
    # The pair's vocabulary (SPEC "Drafts with another vocabulary"): "shared" or "intersection", and the share of
    # the target's vocabulary the draft can propose; None for a target-only run.
    vocab: str | None = None
    vocab_coverage: float | None = None

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)


@functools.cache
def stored_fields(record: type) -> dict[str, type]:
    """A record class's stored fields, name -> int, float or str, in declaration order: its table's columns (a
    field that may be None is a column that may be NULL)."""
    hints = typing.get_type_hints(record)
    stored = {}
    for f in fields(record):
        hint = hints[f.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = [k for k in (typing.get_args(hint) if union else (hint,)) if k is not type(None)]
        if len(kinds) == 1 and kinds[0] in STORED_TYPES:
            stored[f.name] = kinds[0]
    return stored


@functools.cache
def summed_fields(record: type = Round) -> list[str]:
    """The round measurements a prompt's row totals (declared with `metadata=PER_PROMPT_SUM`), in declaration order."""
    return [f.name for f in fields(record) if f.metadata.get("per_prompt") == "sum" and f.name in stored_fields(record)]


def settle_round(
    drafted: list[int], accepted: int, next_token: int, eos_ids: set[int], budget: int
) -> tuple[list[int], list[str], int, list[str]]:
    """(emitted ids, their kinds, a_r, each draft's outcome) of a round whose verification accepted
    `accepted` drafts and drew `next_token`. An EOS or the token budget may cut the round: the drafts past the
    cut are discarded, whether verification accepted or refused them, so a_r counts emitted drafts only. (The
    loop caps k_r so that the budget never cuts a round; should one be cut, it is settled like an EOS cut.)"""
    emitted = drafted[:accepted] + [next_token]
    kinds = [ACCEPTED] * accepted + [CORRECTION if accepted < len(drafted) else BONUS]
    kept = next((j + 1 for j, token in enumerate(emitted) if token in eos_ids), len(emitted))
    kept = min(kept, budget)
    # Draft i owns output slot i: itself if accepted, else the correction that replaced it.
    outcomes = [
        DISCARDED if i >= kept else ACCEPTED if i < accepted else REJECTED if i == accepted else DISCARDED
        for i in range(len(drafted))
    ]
    return emitted[:kept], kinds[:kept], min(accepted, kept), outcomes
