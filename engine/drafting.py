"""Drafting strategies: what proposes the k tokens of a round.

The speculative loop only talks to the `Drafter` interface (start / propose / accept), the way transformers'
candidate generators do, so a dynamic-k policy or an n-gram drafter plugs in without touching the loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .cached_model import CachedModel
from .sampling import SamplingConfig, probabilities, sample


@dataclass
class Proposal:
    tokens: torch.Tensor  # [k] proposed token ids (on device)
    probs: torch.Tensor  # [k, V] processed draft distributions the tokens were drawn from
    raw_logits: torch.Tensor | None  # [k, V] unprocessed draft logits (for KL), None if the drafter has none
    forwards: int  # draft model forward passes spent on this proposal

    @classmethod
    def empty(cls, vocab_size: int, device: torch.device) -> "Proposal":
        """No drafts: the round is one plain target step."""
        rows = torch.empty(0, vocab_size, device=device)
        return cls(torch.empty(0, dtype=torch.long, device=device), rows, rows, forwards=0)


class Drafter(Protocol):
    k: int

    def start(self, prompt_ids: torch.Tensor) -> None:
        """Begin a new sequence from prompt_ids [1, n] (prefill, reset state)."""

    def propose(self, sequence: torch.Tensor, generator: torch.Generator, max_tokens: int) -> Proposal:
        """Propose up to `max_tokens` tokens (possibly none) continuing sequence [1, L] (all committed tokens).

        The loop sets max_tokens from what is left of the token budget and of the target's positions; a drafter
        proposes fewer when its own policy or context says so, never more."""

    def accept(self, sequence_length: int, num_accepted: int) -> None:
        """The round that started at `sequence_length` kept `num_accepted` proposed tokens; adapt state / k."""


class ModelDrafter:
    """A small causal LM drafting a constant k tokens per round (fewer when the loop's cap is lower), with its
    own KV cache.

    The cache always holds a prefix of the committed sequence; `propose` feeds whatever it lacks (one token,
    or two after a bonus round, so the draft stays in step without an extra forward).
    """

    def __init__(self, model, vocab_size: int, k: int, cfg: SamplingConfig):
        self.lm = CachedModel(model, vocab_size)
        self.k = k
        self.cfg = cfg

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()
        if prompt_ids.shape[1] > 1:  # all but the last prompt token: the first proposal feeds that one
            self.lm.forward(prompt_ids[:, :-1], keep=1)

    def propose(self, sequence: torch.Tensor, generator: torch.Generator, max_tokens: int) -> Proposal:
        # Draft i (1-based) is predicted at position L + i - 2 of the draft model, which must exist.
        k = max(0, min(self.k, max_tokens, self.lm.max_positions - sequence.shape[1] + 1))
        if k == 0:
            return Proposal.empty(self.lm.vocab_size, self.lm.device)
        pending = sequence[:, self.lm.length :]
        tokens, probs, raw = [], [], []
        for _ in range(k):
            logits = self.lm.forward(pending, keep=1)[0]
            p = probabilities(logits, self.cfg)
            token = sample(p, self.cfg, generator)
            tokens.append(token)
            probs.append(p)
            raw.append(logits)
            pending = token.view(1, 1)
        # The last proposed token is never fed: its continuation is only needed if it is accepted (bonus case).
        return Proposal(torch.stack(tokens), torch.stack(probs), torch.stack(raw), forwards=k)

    def accept(self, sequence_length: int, num_accepted: int) -> None:
        self.lm.rollback(sequence_length + num_accepted)

    # Optional for a Drafter: the decoder adds this to its own peak (engine/memory.py).
    def peak_cache_bytes(self) -> int:
        return self.lm.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.lm.reset_peak()
