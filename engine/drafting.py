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


class Drafter(Protocol):
    k: int

    def start(self, prompt_ids: torch.Tensor) -> None:
        """Begin a new sequence from prompt_ids [1, n] (prefill, reset state)."""

    def propose(self, sequence: torch.Tensor, generator: torch.Generator) -> Proposal:
        """Propose `self.k` tokens continuing sequence [1, L] (all committed tokens)."""

    def accept(self, sequence_length: int, num_accepted: int) -> None:
        """The round that started at `sequence_length` kept `num_accepted` proposed tokens; adapt state / k."""


class ModelDrafter:
    """A small causal LM drafting a constant k tokens per round, with its own KV cache.

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

    def propose(self, sequence: torch.Tensor, generator: torch.Generator) -> Proposal:
        pending = sequence[:, self.lm.length :]
        tokens, probs, raw = [], [], []
        for _ in range(self.k):
            logits = self.lm.forward(pending, keep=1)[0]
            p = probabilities(logits, self.cfg)
            token = sample(p, self.cfg, generator)
            tokens.append(token)
            probs.append(p)
            raw.append(logits)
            pending = token.view(1, 1)
        # The last proposed token is never fed: its continuation is only needed if it is accepted (bonus case).
        return Proposal(torch.stack(tokens), torch.stack(probs), torch.stack(raw), forwards=self.k)

    def accept(self, sequence_length: int, num_accepted: int) -> None:
        self.lm.rollback(sequence_length + num_accepted)
