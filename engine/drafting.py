"""Drafting strategies: what proposes the k tokens of a round.

The speculative loop only talks to the `Drafter` interface (start / propose / accept), the way transformers'
candidate generators do. Each strategy is one class below, described once in engine/drafter_specs.py (its spec's
name, parameter, whether it needs the draft model; the entry names the class here). A spec string names it:

    model            the draft model, a constant k per round (Leviathan et al.)
    heuristic        the draft model; k starts at --k, +2 after a round whose drafts were all accepted, else -1
                     (min 1): transformers' num_assistant_tokens_schedule="heuristic"
    confidence:T     the draft model; a round stops after the first draft whose top probability is below T
                     (that draft is kept, as transformers' assistant_confidence_threshold does), at most k drafts
    prompt-lookup:N  no model: the longest n-gram (N >= n >= 1) ending the sequence that occurred earlier proposes
                     the tokens that followed its earliest occurrence (transformers' prompt_lookup_num_tokens with
                     max_matching_ngram_size=N); no match, no drafts (the round is one target step)

    make_drafter("confidence:0.5", draft_model=m, vocab_size=V, k=4, cfg=cfg)
    needs_draft_model("prompt-lookup:3")  # False: run it without a draft model

Every drafter is lossless through the same verification (engine/speculative.py); a drafter without a distribution
(prompt lookup) proposes point masses (p_d = 1 on its token) and no logits (KL is NaN). With
SamplingConfig.draft_sampling = "greedy" a model drafter proposes its argmax as a point mass too (its logits still
give KL; the confidence policy still reads its distribution): the draft then behaves as a server that drafts by
argmax whatever the temperature, and the output keeps the target's distribution.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .cached_model import CachedModel
from .drafter_specs import SPECS, parse_drafter
from .errors import DraftLabError
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

    @classmethod
    def point_masses(cls, tokens: torch.Tensor, vocab_size: int) -> "Proposal":
        """Tokens proposed without a distribution: p_d is a one-hot row per token, so verification accepts
        token x with probability p_t(x) and corrects from p_t with x removed (renormalised)."""
        probs = torch.nn.functional.one_hot(tokens, vocab_size).float()
        return cls(tokens, probs, None, forwards=0)


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


# --- drafting with a draft model -------------------------------------------------------------------------------

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

    @classmethod
    def from_spec(cls, param, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids):
        return cls(draft_model, vocab_size, k, cfg)

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
        greedy_drafts = self.cfg.draft_sampling == "greedy" and not self.cfg.greedy
        for i in range(k):
            logits = self.lm.forward(pending, keep=1)[0]
            p = probabilities(logits, self.cfg)
            if greedy_drafts:  # propose p_d's argmax; verified as a point mass (Proposal.point_masses' rule)
                token = p.argmax()
                probs.append(torch.nn.functional.one_hot(token, p.shape[-1]).to(p.dtype))
            else:
                token = sample(p, self.cfg, generator)
                probs.append(p)
            tokens.append(token)
            raw.append(logits)
            if i + 1 < k and self.stop_after(p):
                break
            pending = token.view(1, 1)
        # The last proposed token is never fed: its continuation is only needed if it is accepted (bonus case).
        return Proposal(torch.stack(tokens), torch.stack(probs), torch.stack(raw), forwards=len(tokens))

    def stop_after(self, p: torch.Tensor) -> bool:
        """Whether to end the round after the draft just drawn from p (a policy hook; never, here). It may look
        at p but not at the drawn token: deciding whether to draft on from the distribution keeps the loop
        lossless, and the drawn token is always kept."""
        return False

    def accept(self, sequence_length: int, num_accepted: int) -> None:
        self.lm.rollback(sequence_length + num_accepted)

    # Optional for a Drafter: the decoder adds this to its own peak (engine/memory.py).
    def peak_cache_bytes(self) -> int:
        return self.lm.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.lm.reset_peak()


class HeuristicDrafter(ModelDrafter):
    """transformers' num_assistant_tokens_schedule="heuristic" (AssistedCandidateGenerator.
    update_candidate_strategy): after each round k += 2 if every proposed draft was accepted (num_matches ==
    candidates, counting the drafts actually proposed, k_r, not k), else k = max(1, k - 1). The round proposes
    min(k, the loop's cap). k restarts at --k with every prompt (transformers' "heuristic_transient"; plain
    "heuristic" carries k over to the next generate() call, which would make a prompt depend on its
    predecessors, on resumes and on the warm-up)."""


    def __init__(self, model, vocab_size: int, k: int, cfg: SamplingConfig):
        super().__init__(model, vocab_size, k, cfg)
        self.initial_k = k
        self.proposed = 0

    def start(self, prompt_ids: torch.Tensor) -> None:
        super().start(prompt_ids)
        self.k = self.initial_k

    def propose(self, sequence: torch.Tensor, generator: torch.Generator, max_tokens: int) -> Proposal:
        proposal = super().propose(sequence, generator, max_tokens)
        self.proposed = proposal.tokens.shape[0]
        return proposal

    def accept(self, sequence_length: int, num_accepted: int) -> None:
        super().accept(sequence_length, num_accepted)
        self.k = heuristic_next_k(self.k, self.proposed, num_accepted)


def heuristic_next_k(k: int, proposed: int, accepted: int) -> int:
    """The heuristic schedule's k for the next round (transformers' rule, verbatim)."""
    return k + 2 if accepted == proposed else max(1, k - 1)


class ConfidenceDrafter(ModelDrafter):
    """Drafts at most k tokens and stops the round after the first one whose distribution's top probability is
    below T (llama.cpp --draft-p-min, transformers' assistant_confidence_threshold).

    The low-confidence draft itself is KEPT and verified, as in transformers (its ConfidenceCriteria is a stopping
    criterion checked after the token is appended); llama.cpp drops it. Deciding on the top probability of the
    processed distribution, not on the drawn token, keeps the loop lossless; at temperature 0 the two coincide
    with transformers' test (the drawn token's probability). One host read per draft (the stop decision).
    transformers also re-fits T during generation when scikit-learn is installed; here T is fixed."""


    def __init__(self, model, vocab_size: int, k: int, cfg: SamplingConfig, threshold: float):
        super().__init__(model, vocab_size, k, cfg)
        self.threshold = threshold

    @classmethod
    def from_spec(cls, param, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids):
        return cls(draft_model, vocab_size, k, cfg, param)

    def stop_after(self, p: torch.Tensor) -> bool:
        return bool(p.max() < self.threshold)


# --- drafting without a model ----------------------------------------------------------------------------------

class PromptLookupDrafter:
    """Prompt lookup decoding (transformers' PromptLookupCandidateGenerator, vLLM's ngram): for n from
    min(N, L - 1) down to 1, the n-gram ending the sequence (prompt + output so far) is looked up; at the first n
    with an earlier occurrence, the tokens after its EARLIEST occurrence (left to right, as transformers takes it)
    up to k of them, stopping at the sequence's end, are proposed, cut before the first EOS. No earlier
    occurrence of even the last token: no drafts, and the round is one plain target step.

    The proposals are point masses (p_d = 1 on each token, no logits: KL is NaN). The committed tokens live on
    the host with an index of each n-gram's first occurrence, so a round costs O(N^2) dictionary work plus one
    read of the few new tokens (a tiny device->host copy on a GPU)."""


    def __init__(self, max_ngram: int, vocab_size: int, k: int, eos_ids=()):
        self.max_ngram = max_ngram
        self.vocab_size = vocab_size
        self.k = k
        self.eos_ids = set(eos_ids)
        self.history: list[int] = []
        self.first: dict[tuple[int, ...], int] = {}  # n-gram -> index of its earliest occurrence

    @classmethod
    def from_spec(cls, param, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids):
        return cls(param, vocab_size, k, eos_ids)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.history, self.first = [], {}
        self._extend(prompt_ids[0].tolist())

    def _extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.history.append(token)
            end = len(self.history)
            for n in range(1, min(self.max_ngram, end) + 1):
                self.first.setdefault(tuple(self.history[end - n :]), end - n)

    def lookup(self, max_tokens: int) -> list[int]:
        """The proposal for the committed sequence `history` (host ints)."""
        seq, length = self.history, len(self.history)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            start = self.first[tuple(seq[length - n :])]
            if start < length - n:  # an occurrence before the one ending the sequence: its earliest one
                follow = seq[start + n : start + n + min(self.k, max_tokens)]
                cut = next((i for i, t in enumerate(follow) if t in self.eos_ids), len(follow))
                return follow[:cut]
        return []

    def propose(self, sequence: torch.Tensor, generator: torch.Generator, max_tokens: int) -> Proposal:
        self._extend(sequence[0, len(self.history) :].tolist())
        follow = self.lookup(max_tokens) if max_tokens > 0 else []
        if not follow:
            return Proposal.empty(self.vocab_size, sequence.device)
        return Proposal.point_masses(torch.tensor(follow, dtype=torch.long, device=sequence.device), self.vocab_size)

    def accept(self, sequence_length: int, num_accepted: int) -> None:
        pass  # the accepted tokens and the correction arrive with the next round's sequence


# --- the registry: engine/drafter_specs.py describes each drafter; its `implementation` names the class here ----

def drafter_class(name: str) -> type:
    """The class implementing the drafter `name` (a key of engine.drafter_specs.SPECS)."""
    return globals()[SPECS[name].implementation]


def make_drafter(spec: str, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids=()) -> Drafter:
    """The drafter a spec names, proposing up to k tokens a round (its starting k for `heuristic`).
    draft_model may be None for a drafter that needs none; eos_ids end a prompt-lookup proposal."""
    name, value = parse_drafter(spec)
    if SPECS[name].needs_model and draft_model is None:
        free = ", ".join(s.usage for s in SPECS.values() if not s.needs_model)
        raise DraftLabError(f"drafter {name!r} drafts with the draft model, but none is loaded; load a draft model "
                            f"or use a drafter without one ({free})")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise DraftLabError(f"k must be a positive integer (got {k!r}); use e.g. --k 4 or --k 1,2,4,8")
    return drafter_class(name).from_spec(value, draft_model=draft_model, vocab_size=vocab_size, k=k, cfg=cfg,
                                         eos_ids=eos_ids)
