"""Drafting strategies: what proposes the tokens of a round, for the B rows the loop still runs (batch 1 is the
one-row case; there is no second set of drafters).

The loop (engine/speculative.py) only talks to the `Drafter` protocol below, the way transformers' candidate
generators plug into generate(). Each strategy is one class here, declared once in engine/drafter_specs.py (its
name, parameter and bounds, and the capabilities the rest of the product reads: needs a draft model, needs the
target's hidden states, constant k or not, its mapping per serving engine); the declaration names its class:

    model            ModelDrafter: the draft model, a constant k per round (Leviathan et al.)
    heuristic        HeuristicDrafter: the draft model; k starts at --k, +2 after a round whose drafts were all
                     accepted, else -1 (min 1): transformers' num_assistant_tokens_schedule="heuristic"
    confidence:T     ConfidenceDrafter: the draft model; a round stops after the first draft whose top probability
                     is below T (that draft is kept, as transformers' assistant_confidence_threshold does)
    prompt-lookup:N  PromptLookupDrafter: no model; the longest n-gram (N >= n >= 1) ending the sequence that
                     occurred earlier proposes the tokens that followed its earliest occurrence
    suffix:D         SuffixDrafter (engine/suffix_tree.py): no model; the most frequent continuation of the
                     longest match of the context's suffix in suffix trees of depth D (vLLM's suffix decoding)

    make_drafter("confidence:0.5", draft_model=m, vocab_size=V, k=4, cfg=cfg)

Every drafter is lossless through the same verification (engine/verification.py); a drafter without a distribution
proposes point masses (p_d = 1 on its token) and no logits (KL is NaN). With SamplingConfig.draft_sampling =
"greedy" a model drafter proposes its argmax as a point mass too (its logits still give KL; the confidence policy
still reads its distribution).

Randomness: row r draws its drafts from generators[r], the generator of its prompt, in the order a one-row decode
of that prompt draws them, so a row never depends on the rows beside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .batched_cache import BatchCache, left_pad, to_device
from .drafter_specs import SPECS, DrafterSpec, parse_drafter
from .errors import DraftLabError
from .sampling import SamplingConfig, probabilities, sample_rows
from .suffix_tree import SuffixCache

# Realign a drafter's cache when its width exceeds this many times its longest row plus the slack (holes from
# rejected drafts; engine/batched_cache.py). The loop applies the same rule to the target's cache.
COMPACT_SLACK = 16


@dataclass
class Proposal:
    """What a drafter proposes for the b running rows of one round."""

    tokens: torch.Tensor  # [b, K] proposed ids, 0 past row r's ks[r]
    probs: torch.Tensor  # [b, K, V] processed draft distributions (one-hot rows for point masses), 0 past ks[r]
    raw_logits: torch.Tensor | None  # [b, K, V] unprocessed draft logits (for KL), None without a model
    ks: list[int]  # drafts each row proposed (host)
    valid: torch.Tensor | None  # [b, K] True for the first ks[r] slots of row r; None when every ks[r] == K
    forwards: int  # batched draft forwards spent on this proposal

    @classmethod
    def empty(cls, batch: int, vocab_size: int, device) -> "Proposal":
        """No drafts in any row: the round is one plain target step."""
        rows = torch.empty(batch, 0, vocab_size, device=device)
        return cls(torch.empty(batch, 0, dtype=torch.long, device=device), rows, rows, [0] * batch, None, 0)

    @classmethod
    def point_masses(cls, follows: list[list[int]], vocab_size: int, device) -> "Proposal":
        """Tokens proposed without a distribution (row r proposes follows[r]): p_d is a one-hot row per token, so
        verification accepts token x with probability p_t(x) and corrects from p_t with x removed."""
        ks = [len(f) for f in follows]
        width = max(ks, default=0)
        if width == 0:
            return cls.empty(len(follows), vocab_size, device)
        tokens = to_device([f + [0] * (width - len(f)) for f in follows], device)
        slots = slot_mask(ks, width, device)
        probs = torch.nn.functional.one_hot(tokens, vocab_size).float()
        if slots is not None:
            probs = probs.masked_fill(~slots[..., None], 0.0)
        return cls(tokens, probs, None, ks, slots, forwards=0)


def slot_mask(ks: list[int], width: int, device) -> torch.Tensor | None:
    """[b, width] True for row r's first ks[r] slots; None when every row fills the width."""
    if all(k == width for k in ks):
        return None
    return torch.arange(width, device=device)[None, :] < to_device(ks, device)[:, None]


class Drafter(Protocol):
    """The one drafting protocol. `seqs[r]` is row r's committed tokens on the device (1-D), `history[r]` the same
    on the host; both hold only the rows still running, in batch order. One round:

        propose(seqs, history, generators, caps) -> Proposal   row r proposes at most caps[r] tokens
        rollback(kept)      device tensor [b]: row r keeps its first kept[r] tokens (before the round's transfer)
        trailing_holes()    a 0-d device tensor read with that transfer (None: the drafter keeps no device cache)
        settle(lengths, accepted, trailing)   after the transfer: row r's round started at lengths[r] and kept
                            accepted[r] drafts; trailing is what trailing_holes() read
    and between rounds `select(rows)` (finished rows leave) and `maybe_compact(ratio)`. `start` begins a batch;
    `finish(prompt_indices, outputs)` ends it with every row's output (a drafter that learns from earlier
    responses keeps them there)."""

    spec: DrafterSpec

    def start(self, seqs: list[torch.Tensor], history: list[list[int]], prompt_indices: list[int]) -> None: ...

    def propose(self, seqs, history, generators, caps: list[int]) -> Proposal: ...

    def rollback(self, kept: torch.Tensor) -> None: ...

    def trailing_holes(self) -> torch.Tensor | None: ...

    def settle(self, lengths: list[int], accepted: list[int], trailing: int | None) -> None: ...

    def select(self, rows: list[int]) -> None: ...

    def maybe_compact(self, ratio: float) -> None: ...

    def finish(self, prompt_indices: list[int], outputs: list[list[int]]) -> None: ...


# --- drafting with a draft model -------------------------------------------------------------------------------

class ModelDrafter:
    """A small causal LM drafting for B rows with one cache (engine/batched_cache.py), a constant k per round (fewer
    when a row's cap is lower). A round's first draft forward feeds each row what its cache lacks (left-padded: one
    token, or two after a bonus round, so the draft stays in step without an extra forward); each further step
    feeds the last draft of the rows still drafting (the others' columns are holes). A row's last draft is never
    fed: its continuation is only needed if it is accepted. Subclasses change the policy through `next_ks` (k for
    the next round) and `stop_rows` (end a row's round early)."""

    spec = SPECS["model"]

    def __init__(self, model, vocab_size: int, k: int, cfg: SamplingConfig):
        self.lm = BatchCache(model, vocab_size)
        self.k = k  # each row's k at the start of a prompt
        self.cfg = cfg
        self.ks: list[int] = []  # each row's k for the next round
        self.cached: list[int] = []  # real tokens in each row's cache (host)
        self.proposed: list[int] = []

    @classmethod
    def from_spec(cls, param, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids):
        return cls(draft_model, vocab_size, k, cfg)

    def start(self, seqs, history, prompt_indices) -> None:
        self.lm.reset(len(seqs))
        self.ks = [self.k] * len(seqs)
        self.cached = [0] * len(seqs)
        if any(s.shape[0] > 1 for s in seqs):  # all but the last prompt token: the first proposal feeds that one
            ids, valid = left_pad([s[:-1] for s in seqs], self.lm.device)
            self.lm.forward(ids, valid, keep=1)
            self.cached = [s.shape[0] - 1 for s in seqs]

    def propose(self, seqs, history, generators, caps: list[int]) -> Proposal:
        lm, cfg = self.lm, self.cfg.for_draft()  # the draft's own temperature, when set (lossless: see below)
        # Draft i (1-based) of a row of length L is predicted at draft position L + i - 2, which must exist.
        ks = [max(0, min(k, cap, lm.max_positions - s.shape[0] + 1)) for k, cap, s in zip(self.ks, caps, seqs)]
        if max(ks, default=0) == 0:
            self.proposed = ks
            return Proposal.empty(len(seqs), lm.vocab_size, lm.device)
        ids, valid = left_pad([s[c:] for s, c in zip(seqs, self.cached)], lm.device)
        tokens, probs, raw = [], [], []
        # probs are the distribution each draft was drawn from (at the draft's temperature): the target's
        # acceptance test min(1, p_t / p_d) and its residual use exactly these, which keeps any draft temperature
        # lossless. A greedy target verifies by argmax and needs no draft distribution at all.
        greedy_drafts = cfg.draft_sampling == "greedy" and not self.cfg.greedy
        for i in range(max(ks)):
            logits = lm.forward(ids, valid, keep=1)[:, 0]
            p = probabilities(logits, cfg)
            if greedy_drafts:  # the argmax as a point mass (Proposal.point_masses' rule)
                token = p.argmax(-1)
                probs.append(torch.nn.functional.one_hot(token, p.shape[-1]).to(p.dtype))
            else:
                token = sample_rows(p, cfg, generators, [i < k for k in ks])
                probs.append(p)
            tokens.append(token)
            raw.append(logits)
            ks = self.stop_rows(p, i, ks)
            going = [i + 1 < k for k in ks]
            if not any(going):
                break
            ids, valid = tokens[-1][:, None], to_device(going, lm.device, torch.bool)[:, None]
        self.cached = [s.shape[0] + max(0, k - 1) for s, k in zip(seqs, ks)]
        self.proposed = ks
        width = len(tokens)
        slots = slot_mask(ks, width, lm.device)
        tokens, probs, raw = torch.stack(tokens, 1), torch.stack(probs, 1), torch.stack(raw, 1)
        if slots is not None:
            tokens = tokens.masked_fill(~slots, 0)
            probs = probs.masked_fill(~slots[..., None], 0.0)
        return Proposal(tokens, probs, raw, ks, slots, forwards=width)

    def stop_rows(self, p: torch.Tensor, step: int, ks: list[int]) -> list[int]:
        """Each row's number of drafts this round, after draft `step` (0-based) was drawn from p [b, V] (a policy
        hook; never shortened here). It may look at p but not at the drawn tokens: deciding whether to draft on from
        the distribution keeps the loop lossless, and the drawn token is always kept."""
        return ks

    def next_ks(self, ks: list[int], proposed: list[int], accepted: list[int]) -> list[int]:
        """Each row's k for the next round (a policy hook; constant here)."""
        return ks

    def rollback(self, kept: torch.Tensor) -> None:
        self.lm.rollback(kept)

    def trailing_holes(self) -> torch.Tensor | None:
        return self.lm.trailing_holes()

    def settle(self, lengths: list[int], accepted: list[int], trailing: int | None) -> None:
        self.cached = [min(c, n + a) for c, n, a in zip(self.cached, lengths, accepted)]
        self.ks = self.next_ks(self.ks, self.proposed, accepted)
        self.lm.trim(trailing or 0)

    def select(self, rows: list[int]) -> None:
        self.lm.select(rows)
        self.ks = [self.ks[r] for r in rows]
        self.cached = [self.cached[r] for r in rows]

    def maybe_compact(self, ratio: float) -> None:
        if self.lm.width > ratio * max(self.cached, default=0) + COMPACT_SLACK:
            self.lm.compact()

    def finish(self, prompt_indices, outputs) -> None:
        pass

    # Optional for a Drafter: the decoder adds this to its own peak (engine/memory.py).
    def peak_cache_bytes(self) -> int:
        return self.lm.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.lm.reset_peak()


class HeuristicDrafter(ModelDrafter):
    """transformers' num_assistant_tokens_schedule="heuristic" (AssistedCandidateGenerator.
    update_candidate_strategy), per row: after each round k += 2 if every proposed draft was accepted (counting the
    drafts actually proposed, k_r, not k), else k = max(1, k - 1). k restarts at --k with every prompt
    (transformers' "heuristic_transient"; plain "heuristic" carries k over to the next generate() call, which would
    make a prompt depend on its predecessors, on resumes and on the warm-up)."""

    spec = SPECS["heuristic"]

    def next_ks(self, ks, proposed, accepted):
        return [heuristic_next_k(k, p, a) for k, p, a in zip(ks, proposed, accepted)]


def heuristic_next_k(k: int, proposed: int, accepted: int) -> int:
    """The heuristic schedule's k for the next round (transformers' rule, verbatim)."""
    return k + 2 if accepted == proposed else max(1, k - 1)


class ConfidenceDrafter(ModelDrafter):
    """Drafts at most k tokens and stops a row's round after the first draft whose distribution's top probability
    is below T (llama.cpp --draft-p-min, transformers' assistant_confidence_threshold). The low-confidence draft
    itself is KEPT and verified, as in transformers (its ConfidenceCriteria is checked after the token is
    appended); llama.cpp drops it. Deciding on the top probability of the processed distribution, not on the drawn
    token, keeps the loop lossless. One host read of the top probabilities per step that can continue. T is fixed
    (transformers re-fits it during generation when scikit-learn is installed)."""

    spec = SPECS["confidence"]

    def __init__(self, model, vocab_size: int, k: int, cfg: SamplingConfig, threshold: float):
        super().__init__(model, vocab_size, k, cfg)
        self.threshold = threshold

    @classmethod
    def from_spec(cls, param, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids):
        return cls(draft_model, vocab_size, k, cfg, param)

    def stop_rows(self, p, step, ks):
        if not any(step + 1 < k for k in ks):
            return ks
        low = (p.max(-1).values < self.threshold).tolist()
        return [step + 1 if low[r] and step + 1 < k else k for r, k in enumerate(ks)]


# --- drafting without a model ----------------------------------------------------------------------------------

class HostDrafter:
    """A model-free drafter: per-row state on the host, fed from the host copy of each row's tokens, so a round
    reads nothing from the device and the device-cache steps of the protocol do nothing. A subclass implements
    `begin_row(history, prompt_index)` (the row's state) and `follow(state, history, max_tokens)` (its drafts)."""

    def __init__(self, vocab_size: int, k: int, eos_ids=()):
        self.vocab_size = vocab_size
        self.k = k
        self.eos_ids = set(eos_ids)
        self.rows: list = []

    def start(self, seqs, history, prompt_indices) -> None:
        self.rows = [self.begin_row(h, i) for h, i in zip(history, prompt_indices)]

    def propose(self, seqs, history, generators, caps: list[int]) -> Proposal:
        follows = [self.cut(self.follow(state, h, min(self.k, cap))) if cap > 0 else []
                   for state, h, cap in zip(self.rows, history, caps)]
        return Proposal.point_masses(follows, self.vocab_size, seqs[0].device)

    def cut(self, follow: list[int]) -> list[int]:
        """A proposal ends before its first EOS (a draft past the end would never be emitted)."""
        return next((follow[:i] for i, t in enumerate(follow) if t in self.eos_ids), follow)

    def rollback(self, kept) -> None:
        pass

    def trailing_holes(self):
        return None

    def settle(self, lengths, accepted, trailing) -> None:
        pass  # the accepted tokens and the correction arrive with the next round's history

    def select(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def maybe_compact(self, ratio: float) -> None:
        pass

    def finish(self, prompt_indices, outputs) -> None:
        pass


class PromptLookupDrafter(HostDrafter):
    """Prompt lookup decoding (transformers' PromptLookupCandidateGenerator, vLLM's ngram): for n from
    min(N, L - 1) down to 1, the n-gram ending the sequence (prompt + output so far) is looked up; at the first n
    with an earlier occurrence, the tokens after its EARLIEST occurrence (left to right, as transformers takes it),
    up to k of them, stopping at the sequence's end, are proposed, cut before the first EOS. No earlier occurrence
    of even the last token: no drafts, and the round is one plain target step. Per row, an index of each n-gram's
    first occurrence: a round costs O(N^2) dictionary work."""

    spec = SPECS["prompt-lookup"]

    def __init__(self, max_ngram: int, vocab_size: int, k: int, eos_ids=()):
        super().__init__(vocab_size, k, eos_ids)
        self.max_ngram = max_ngram

    @classmethod
    def from_spec(cls, param, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids):
        return cls(param, vocab_size, k, eos_ids)

    def begin_row(self, history: list[int], prompt_index: int) -> "NgramIndex":
        return NgramIndex(self.max_ngram)

    def follow(self, index: "NgramIndex", history: list[int], max_tokens: int) -> list[int]:
        index.extend(history[len(index.history):])
        return index.lookup(max_tokens)


class NgramIndex:
    """One row's committed tokens and the index of each n-gram's (n <= N) earliest occurrence."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.history: list[int] = []
        self.first: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.history.append(token)
            end = len(self.history)
            for n in range(1, min(self.max_ngram, end) + 1):
                self.first.setdefault(tuple(self.history[end - n:]), end - n)

    def lookup(self, max_tokens: int) -> list[int]:
        seq, length = self.history, len(self.history)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            start = self.first[tuple(seq[length - n:])]
            if start < length - n:  # an occurrence before the one ending the sequence: its earliest one
                return seq[start + n: start + n + max_tokens]
        return []


class SuffixDrafter(HostDrafter):
    """Suffix decoding (Oliaro et al. 2024; vLLM's `method: "suffix"`, arctic-inference's SuffixDecodingCache):
    each row keeps a suffix tree of depth D over its prompt and output so far, and the drafter keeps one over the
    responses of earlier prompts of the run (engine/suffix_tree.py: bounded, one response per prompt index, a
    prompt never sees its own earlier response, responses enter when their batch ends). A round proposes the
    better-scoring of the two trees' drafts: the most frequent continuation of the longest matching suffix of the
    context, at most k tokens, at most as many as the match is long, stopping where its estimated probability falls
    below MIN_TOKEN_PROB (vLLM's defaults: max_spec_factor 1, min_token_prob 0.1)."""

    spec = SPECS["suffix"]

    def __init__(self, depth: int, vocab_size: int, k: int, eos_ids=()):
        super().__init__(vocab_size, k, eos_ids)
        self.cache = SuffixCache(depth)

    @classmethod
    def from_spec(cls, param, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids):
        return cls(param, vocab_size, k, eos_ids)

    def begin_row(self, history: list[int], prompt_index: int):
        return self.cache.start_request(prompt_index, history)

    def follow(self, request, history: list[int], max_tokens: int) -> list[int]:
        return self.cache.speculate(request, history, max_tokens)

    def finish(self, prompt_indices, outputs) -> None:
        for index, output in zip(prompt_indices, outputs):
            self.cache.add_response(index, output)


# --- the registry: engine/drafter_specs.py declares each drafter; its `implementation` names the class here ------

def drafter_class(name: str) -> type:
    """The class implementing the drafter `name` (a key of engine.drafter_specs.SPECS): the class of this module
    its declaration names."""
    return globals()[SPECS[name].implementation]


DRAFTERS: dict[str, type] = {name: drafter_class(name) for name in SPECS}  # every declared drafter has its class


def make_drafter(spec: str, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids=()) -> Drafter:
    """The drafter a spec names, proposing up to k tokens a round (its starting k for `heuristic`).
    draft_model may be None for a drafter that needs none; eos_ids end a model-free proposal."""
    name, value = parse_drafter(spec)
    if SPECS[name].needs_model and draft_model is None:
        free = ", ".join(s.usage for s in SPECS.values() if not s.needs_model)
        raise DraftLabError(f"drafter {name!r} drafts with the draft model, but none is loaded; load a draft model "
                            f"or use a drafter without one ({free})")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise DraftLabError(f"k must be a positive integer (got {k!r}); use e.g. --k 4 or --k 1,2,4,8")
    return drafter_class(name).from_spec(value, draft_model=draft_model, vocab_size=vocab_size, k=k, cfg=cfg,
                                         eos_ids=eos_ids)
