"""Batched decoding: B prompts of different lengths decoded together, speculative (every drafter) or target-only,
through one cache path (engine/batched_cache.py: left padding, per-row positions, holes, rollback, compaction).

Per round, for the rows still running:
  1. the batch drafter proposes k_r <= cap_r tokens for each row r (ragged: padded to K = max k_r);
  2. ONE target forward scores every row: row r feeds [its pending tokens (left-padded), its drafts (right-padded
     to K)], so slot i of every row scores draft i (the prompt on the first round, as in engine/speculative.py:
     the prefill verifies the first drafts);
  3. ONE vectorised verify (engine.speculative.verify_rows, the rule the batch-1 loop uses) gives per-row accepted
     counts a_r and correction / bonus tokens;
  4. both caches roll back on the device (the rejected columns become holes) and everything the round records
     moves to the host in ONE transfer (`.tolist()`), which also carries the hole counts `trim` needs.
Then each row's Round is settled exactly as the batch-1 loop settles it (engine.speculative.round_record), so a
row yields the same records (per round, per draft token) as that prompt decoded alone, and storage logs them
unchanged.

Randomness: row r draws from prompt_generator(seed, its prompt index), in the same order the batch-1 loop draws
(its drafts, then its k_r uniforms, then its correction), so a row never depends on the rows beside it.

Timing: every row's Round carries the batch round's draft and verify seconds and draft forwards (what that row
waited for; draft_seconds / draft_forwards is still one draft forward's time, at this batch size). A row's
`wall_seconds` is from the batch's start to that row's last token: its request latency.

Finished rows (EOS, budget) leave the batch after the round they finish in: both caches drop their rows
(`BatchCache.select`), so they cost no further forward work; the cost is one index_select of the caches when rows
leave (benchmarks/bench_batch.py times it). The target-only decoder does the same per token.

Rows are lossless: greedy rows equal the target-only decoding of that prompt alone token for token, sampled rows
follow the target's distribution (tests/test_engine_batched.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import speculative
from .batched_cache import BatchCache, left_pad, to_device
from .clock import RoundClock
from .drafter_specs import DEFAULT_DRAFTER, SPECS, parse_drafter
from .drafting import PromptLookupDrafter, heuristic_next_k
from .errors import DraftLabError
from .loading import ModelPair
from .records import PromptResult
from .runs import check_k, eos_ids
from .sampling import SamplingConfig, probabilities, prompt_generator, sample_rows
from .token_types import TokenTyper

# Compact a cache when its width exceeds this many times its longest row (holes from rejected drafts).
COMPACT_RATIO = 2.0
COMPACT_SLACK = 16  # ... and by more than this many columns


@dataclass
class BatchProposal:
    tokens: torch.Tensor  # [b, K] proposed ids, 0 past row r's ks[r]
    probs: torch.Tensor  # [b, K, V] processed draft distributions, zero rows past ks[r]
    raw_logits: torch.Tensor | None  # [b, K, V] unprocessed draft logits (for KL), None without a model
    ks: list[int]  # drafts each row proposed (host)
    valid: torch.Tensor | None  # [b, K] True for the first ks[r] slots of row r; None when every ks[r] == K
    forwards: int  # batched draft forwards spent on this proposal

    @classmethod
    def empty(cls, batch: int, vocab_size: int, device) -> "BatchProposal":
        rows = torch.empty(batch, 0, vocab_size, device=device)
        return cls(torch.empty(batch, 0, dtype=torch.long, device=device), rows, rows, [0] * batch, None, 0)


def _slot_mask(ks: list[int], width: int, device) -> torch.Tensor | None:
    if all(k == width for k in ks):
        return None
    return torch.arange(width, device=device)[None, :] < to_device(ks, device)[:, None]


# --- batched drafters ------------------------------------------------------------------------------------------

class BatchModelDrafter:
    """The draft model for B rows with one cache (model, heuristic and confidence:T drafters of
    engine/drafting.py, whose policies it applies per row: the same k, heuristic_next_k, the same threshold rule;
    with draft_sampling "greedy" it proposes each row's argmax as a point mass, as ModelDrafter does).

    A round's first draft forward feeds each row what its cache lacks (left-padded); each further step feeds the
    last draft of the rows still drafting (the others' columns are holes). A row's last draft is never fed."""

    def __init__(self, model, vocab_size: int, k: int, cfg: SamplingConfig, heuristic: bool = False,
                 threshold: float | None = None):
        self.lm = BatchCache(model, vocab_size)
        self.initial_k = k
        self.cfg = cfg
        self.heuristic = heuristic
        self.threshold = threshold
        self.ks: list[int] = []
        self.cached: list[int] = []  # real tokens in each row's cache (host)
        self.proposed: list[int] = []

    def start(self, seqs: list[torch.Tensor], history: list[list[int]]) -> None:
        self.lm.reset(len(seqs))
        self.ks = [self.initial_k] * len(seqs)
        self.cached = [0] * len(seqs)
        if any(s.shape[0] > 1 for s in seqs):  # all but the last prompt token: the first proposal feeds that one
            ids, valid = left_pad([s[:-1] for s in seqs], self.lm.device)
            self.lm.forward(ids, valid, keep=1)
            self.cached = [s.shape[0] - 1 for s in seqs]

    def propose(self, seqs, history, generators, caps: list[int]) -> BatchProposal:
        lm, cfg = self.lm, self.cfg
        ks = [max(0, min(k, cap, lm.max_positions - s.shape[0] + 1)) for k, cap, s in zip(self.ks, caps, seqs)]
        if max(ks, default=0) == 0:
            self.proposed = ks
            return BatchProposal.empty(len(seqs), lm.vocab_size, lm.device)
        ids, valid = left_pad([s[c:] for s, c in zip(seqs, self.cached)], lm.device)
        tokens, probs, raw = [], [], []
        greedy_drafts = cfg.draft_sampling == "greedy" and not cfg.greedy
        for i in range(max(ks)):
            logits = lm.forward(ids, valid, keep=1)[:, 0]
            p = probabilities(logits, cfg)
            if greedy_drafts:  # the argmax as a point mass, as engine.drafting.ModelDrafter proposes it
                token = p.argmax(-1)
                probs.append(torch.nn.functional.one_hot(token, p.shape[-1]).to(p.dtype))
            else:
                token = sample_rows(p, cfg, generators, [i < k for k in ks])
                probs.append(p)
            tokens.append(token)
            raw.append(logits)
            # confidence:T: one host read of the top probabilities per step that can continue (as the batch-1 one)
            if self.threshold is not None and any(i + 1 < k for k in ks):
                low = (p.max(-1).values < self.threshold).tolist()
                ks = [i + 1 if low[r] and i + 1 < ks[r] else ks[r] for r in range(len(ks))]
            going = [i + 1 < k for k in ks]
            if not any(going):
                break
            ids, valid = tokens[-1][:, None], to_device(going, lm.device, torch.bool)[:, None]
        self.cached = [s.shape[0] + max(0, k - 1) for s, k in zip(seqs, ks)]
        self.proposed = ks
        width = len(tokens)
        slots = _slot_mask(ks, width, lm.device)
        tokens, probs, raw = torch.stack(tokens, 1), torch.stack(probs, 1), torch.stack(raw, 1)
        if slots is not None:
            tokens = tokens.masked_fill(~slots, 0)
            probs = probs.masked_fill(~slots[..., None], 0.0)
        return BatchProposal(tokens, probs, raw, ks, slots, forwards=width)

    def rollback(self, lengths: torch.Tensor) -> None:
        self.lm.rollback(lengths)

    def trailing_holes(self) -> torch.Tensor | None:
        return self.lm.trailing_holes()

    def settle(self, lengths: list[int], accepted: list[int], trailing: int | None) -> None:
        self.cached = [min(c, n + a) for c, n, a in zip(self.cached, lengths, accepted)]
        if self.heuristic:
            self.ks = [heuristic_next_k(k, p, a) for k, p, a in zip(self.ks, self.proposed, accepted)]
        self.lm.trim(trailing or 0)

    def select(self, rows: list[int]) -> None:
        self.lm.select(rows)
        self.ks = [self.ks[r] for r in rows]
        self.cached = [self.cached[r] for r in rows]

    def maybe_compact(self, ratio: float) -> None:
        longest = max(self.cached, default=0)
        if self.lm.width > ratio * longest + COMPACT_SLACK:
            self.lm.compact()

    def peak_cache_bytes(self) -> int:
        return self.lm.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.lm.reset_peak()


class BatchPromptLookup:
    """Prompt lookup for B rows: one engine.drafting.PromptLookupDrafter per row (its n-gram index and lookup
    rule, unchanged), fed from the host copy of each row's tokens, so a round reads nothing from the device."""

    def __init__(self, max_ngram: int, vocab_size: int, k: int, eos_ids=()):
        self.args = (max_ngram, vocab_size, k, eos_ids)
        self.vocab_size = vocab_size
        self.rows: list[PromptLookupDrafter] = []
        self.lm = None

    def start(self, seqs, history: list[list[int]]) -> None:
        self.rows = [PromptLookupDrafter(*self.args) for _ in seqs]
        for d, h in zip(self.rows, history):
            d._extend(h)

    def propose(self, seqs, history, generators, caps: list[int]) -> BatchProposal:
        follows = []
        for d, h, cap in zip(self.rows, history, caps):
            d._extend(h[len(d.history):])
            follows.append(d.lookup(cap) if cap > 0 else [])
        ks = [len(f) for f in follows]
        width = max(ks, default=0)
        device = seqs[0].device
        if width == 0:
            return BatchProposal.empty(len(seqs), self.vocab_size, device)
        tokens = to_device([f + [0] * (width - len(f)) for f in follows], device)
        slots = _slot_mask(ks, width, device)
        probs = torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        if slots is not None:
            probs = probs.masked_fill(~slots[..., None], 0.0)
        return BatchProposal(tokens, probs, None, ks, slots, forwards=0)

    def rollback(self, lengths) -> None:
        pass

    def trailing_holes(self):
        return None

    def settle(self, lengths, accepted, trailing) -> None:
        pass

    def select(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def maybe_compact(self, ratio: float) -> None:
        pass


def make_batch_drafter(spec: str, *, draft_model, vocab_size: int, k: int, cfg: SamplingConfig, eos_ids=()):
    """The batched drafter a spec names (engine/drafter_specs.py); every spec has one (BATCH_DRAFTERS)."""
    name, value = parse_drafter(spec)
    if SPECS[name].needs_model and draft_model is None:
        raise DraftLabError(f"drafter {name!r} drafts with the draft model, but none is loaded; load a draft model "
                            f"or use prompt-lookup:N")
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise DraftLabError(f"k must be a positive integer (got {k!r}); use e.g. --k 4 or --k 1,2,4,8")
    return BATCH_DRAFTERS[name](value, draft_model, vocab_size, k, cfg, eos_ids)


BATCH_DRAFTERS = {
    "model": lambda v, m, V, k, cfg, eos: BatchModelDrafter(m, V, k, cfg),
    "heuristic": lambda v, m, V, k, cfg, eos: BatchModelDrafter(m, V, k, cfg, heuristic=True),
    "confidence": lambda v, m, V, k, cfg, eos: BatchModelDrafter(m, V, k, cfg, threshold=v),
    "prompt-lookup": lambda v, m, V, k, cfg, eos: BatchPromptLookup(v, V, k, eos),
}


# --- the decoders -----------------------------------------------------------------------------------------------

class _Batch:
    """The host-side state of the rows still running (index r = batch row; `live[r]` = position in the input)."""

    def __init__(self, prompt_ids: list[torch.Tensor], prompt_indices: list[int], cfg: SamplingConfig, device):
        self.live = list(range(len(prompt_ids)))
        self.seqs = [ids[0] for ids in prompt_ids]  # committed tokens per row, on the device
        self.history = [ids[0].tolist() for ids in prompt_ids]  # the same on the host (read once per batch)
        self.generators = [prompt_generator(cfg.seed, i, device) for i in prompt_indices]

    def select(self, rows: list[int]) -> None:
        self.live = [self.live[r] for r in rows]
        self.seqs = [self.seqs[r] for r in rows]
        self.history = [self.history[r] for r in rows]
        self.generators = [self.generators[r] for r in rows]


class BatchedSpeculativeDecoder:
    def __init__(self, target_model, drafter, vocab_size: int, cfg: SamplingConfig, typer: TokenTyper,
                 eos_ids: set[int], compact_ratio: float | None = COMPACT_RATIO):
        self.target = BatchCache(target_model, vocab_size)
        self.clock = RoundClock(self.target.device)
        self.drafter = drafter
        self.cfg = cfg
        self.typer = typer
        self.eos_ids = eos_ids
        self.compact_ratio = compact_ratio
        self.rounds = 0  # batched rounds of the last generate_batch
        self.hole_share = 0.0  # mean share of the target cache's columns that were holes, over its rounds

    @torch.inference_mode()
    def generate_batch(self, prompts: list[str], prompt_ids: list[torch.Tensor], prompt_indices: list[int],
                       on_progress: Callable[[int, int], None] | None = None,
                       max_new_tokens: int | None = None) -> list[PromptResult]:
        """Decode prompts together (prompt_ids[i] is [1, n_i]); one PromptResult per prompt, in input order.
        on_progress(prompt index, new tokens so far) runs for each running row between rounds."""
        cfg, clock, target = self.cfg, self.clock, self.target
        limit = max_new_tokens or cfg.max_new_tokens
        count = len(prompts)
        start = clock.wall()
        state = _Batch(prompt_ids, prompt_indices, cfg, target.device)
        target.reset(count)
        self.drafter.start(state.seqs, state.history)
        cached = [0] * count  # real tokens in each row's target cache
        outputs = [[] for _ in range(count)]
        rounds = [[] for _ in range(count)]
        walls = [0.0] * count
        arrivals = [[] for _ in range(count)]  # each row's token arrival times (seconds from the batch's start)
        self.rounds, holes = 0, 0.0
        while state.live:
            lengths = [s.shape[0] for s in state.seqs]
            caps = [max(0, min(limit - len(outputs[o]) - 1, target.max_positions - n))
                    for o, n in zip(state.live, lengths)]
            t_draft = clock.mark()
            proposal = self.drafter.propose(state.seqs, state.history, state.generators, caps)
            t_verify = clock.mark()
            for k, cap in zip(proposal.ks, caps):
                if k > cap:
                    raise ValueError(f"{type(self.drafter).__name__} proposed {k} tokens; this round allows {cap}")
            width = proposal.tokens.shape[1]
            pending, pending_valid = left_pad([s[c:] for s, c in zip(state.seqs, cached)], target.device)
            slots = proposal.valid if proposal.valid is not None else torch.ones_like(proposal.tokens, dtype=torch.bool)
            logits = target.forward(torch.cat([pending, proposal.tokens], 1), torch.cat([pending_valid, slots], 1),
                                    keep=width + 1)
            p_target = probabilities(logits, cfg)
            n, next_tokens = speculative.verify_rows(proposal.tokens, proposal.probs, proposal.ks, proposal.valid,
                                                     p_target, cfg, state.generators)
            kept = to_device(lengths, target.device) + n
            target.rollback(kept)
            self.drafter.rollback(kept)
            t_done = clock.mark()
            host = speculative.rows_to_host(proposal.tokens, proposal.probs, proposal.raw_logits, proposal.ks, p_target,
                                            logits, n, next_tokens, [target.trailing_holes(),
                                                                     self.drafter.trailing_holes()])
            draft_s, verify_s = clock.seconds(t_draft, t_verify), clock.seconds(t_verify, t_done)
            arrived = clock.now() - start  # the round's tokens reached the host together, with the transfer
            self.rounds += 1
            finished, keep = [], []
            for r, (o, row) in enumerate(zip(state.live, host["rows"])):
                round_ = speculative.round_record(self.typer, self.eos_ids, prompt_indices[o], len(rounds[o]), row,
                                                  limit - len(outputs[o]), draft_s, verify_s, proposal.forwards)
                rounds[o].append(round_)
                outputs[o] += round_.emitted_ids
                arrivals[o] += [arrived] * len(round_.emitted_ids)
                a = row["accepted"]
                cached[r] = lengths[r] + a
                emitted = torch.cat([proposal.tokens[r, :a], next_tokens[r : r + 1]])[: len(round_.emitted_ids)]
                state.seqs[r] = torch.cat([state.seqs[r], emitted])
                state.history[r] = state.history[r] + round_.emitted_ids
                if len(outputs[o]) >= limit or outputs[o][-1] in self.eos_ids:
                    finished.append(o)
                else:
                    keep.append(r)
                if on_progress is not None:
                    on_progress(prompt_indices[o], len(outputs[o]))
            accepted = [row["accepted"] for row in host["rows"]]
            target.trim(host["trailing"][0])
            self.drafter.settle(lengths, accepted, host["trailing"][1])
            holes += 1 - sum(n + a for n, a in zip(lengths, accepted)) / max(1, target.batch * target.width)
            if finished:
                for o in finished:
                    walls[o] = arrived
                if keep:
                    target.select(keep)
                    self.drafter.select(keep)
                cached = [cached[r] for r in keep]
                state.select(keep)
            elif self.compact_ratio is not None:
                if target.width > self.compact_ratio * max(cached) + COMPACT_SLACK:
                    target.compact()
                self.drafter.maybe_compact(self.compact_ratio)
        self.hole_share = holes / max(1, self.rounds)
        return [PromptResult(prompt_indices[o], prompts[o], outputs[o],
                             self.typer.tokenizer.decode(outputs[o], skip_special_tokens=True), walls[o],
                             rounds=rounds[o], token_seconds=arrivals[o]) for o in range(count)]

    def peak_cache_bytes(self) -> int:
        drafter = getattr(self.drafter, "peak_cache_bytes", None)
        return self.target.peak_cache_bytes + (drafter() if drafter else 0)

    def reset_peak_cache_bytes(self) -> None:
        self.target.reset_peak()
        if hasattr(self.drafter, "reset_peak_cache_bytes"):
            self.drafter.reset_peak_cache_bytes()


class BatchedTargetOnlyDecoder:
    """Target-only decoding of B prompts through the same BatchCache: one forward per token for every running
    row; a row leaves the batch when it finishes (one cache gather). One host read per token (the EOS check, as
    any generate() loop)."""

    def __init__(self, target_model, vocab_size: int, cfg: SamplingConfig, tokenizer, eos_ids: set[int]):
        self.target = BatchCache(target_model, vocab_size)
        self.clock = RoundClock(self.target.device)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    @torch.inference_mode()
    def generate_batch(self, prompts: list[str], prompt_ids: list[torch.Tensor], prompt_indices: list[int],
                       on_progress: Callable[[int, int], None] | None = None,
                       max_new_tokens: int | None = None) -> list[PromptResult]:
        cfg, clock, target = self.cfg, self.clock, self.target
        limit = max_new_tokens or cfg.max_new_tokens
        count = len(prompts)
        start = clock.wall()
        state = _Batch(prompt_ids, prompt_indices, cfg, target.device)
        target.reset(count)
        ids, valid = left_pad(state.seqs, target.device)
        token = sample_rows(probabilities(target.forward(ids, valid, keep=1)[:, 0], cfg), cfg, state.generators)
        outputs = [[t] for t in token.tolist()]
        first_done = clock.wall()  # tolist() above already waited
        arrivals = [[first_done - start] for _ in range(count)]
        ones = torch.ones(count, 1, dtype=torch.bool, device=target.device)
        walls, decode = [0.0] * count, [0.0] * count
        while True:
            keep = [r for r, o in enumerate(state.live) if len(outputs[o]) < limit and outputs[o][-1] not in self.eos_ids]
            if len(keep) < len(state.live):
                now = clock.wall()
                for r, o in enumerate(state.live):
                    if r not in keep:
                        walls[o], decode[o] = now - start, now - first_done
                if not keep:
                    break
                index = to_device(keep, target.device)
                token = token.index_select(0, index)
                target.select(keep)
                state.select(keep)
                ones = ones[: len(keep)]
            logits = target.forward(token[:, None], ones, keep=1)[:, 0]
            token = sample_rows(probabilities(logits, cfg), cfg, state.generators)
            step = token.tolist()
            arrived = clock.now() - start
            for o, t in zip(state.live, step):
                outputs[o].append(t)
                arrivals[o].append(arrived)
                if on_progress is not None:
                    on_progress(prompt_indices[o], len(outputs[o]))
        return [PromptResult(prompt_indices[o], prompts[o], outputs[o],
                             self.tokenizer.decode(outputs[o], skip_special_tokens=True), walls[o],
                             decode_steps=len(outputs[o]) - 1, decode_seconds=decode[o], token_seconds=arrivals[o])
                for o in range(count)]

    def peak_cache_bytes(self) -> int:
        return self.target.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.target.reset_peak()


# --- construction, as engine/runs.py builds the batch-1 decoders --------------------------------------------------

def batched_baseline_decoder(pair: ModelPair, cfg: SamplingConfig) -> BatchedTargetOnlyDecoder:
    return BatchedTargetOnlyDecoder(pair.target.model, pair.vocab_size, cfg, pair.tokenizer, eos_ids(pair))


def batched_speculative_decoder(pair: ModelPair, cfg: SamplingConfig, k: int, typer: TokenTyper | None = None,
                                drafter: str = DEFAULT_DRAFTER) -> BatchedSpeculativeDecoder:
    check_k(pair, k)
    eos = eos_ids(pair)
    strategy = make_batch_drafter(drafter, draft_model=pair.draft.model if pair.draft is not None else None,
                                  vocab_size=pair.vocab_size, k=k, cfg=cfg, eos_ids=eos)
    return BatchedSpeculativeDecoder(pair.target.model, strategy, pair.vocab_size, cfg,
                                     typer or TokenTyper(pair.tokenizer), eos)


def run_batches(decoder, prompts: list[str], prompt_ids: list[torch.Tensor], batch_size: int,
                warmup_tokens: int = 16):
    """Yield one list of PromptResults per batch of `batch_size` consecutive prompts (the last batch may be
    smaller: it holds what is left), after one untimed warm-up batch of the first prompts."""
    if not prompts:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise DraftLabError(f"batch size must be a positive integer (got {batch_size!r}); use e.g. 1, 4 or 16")
    first = min(batch_size, len(prompts))
    decoder.generate_batch(prompts[:first], prompt_ids[:first], list(range(first)),
                           max_new_tokens=min(warmup_tokens, decoder.cfg.max_new_tokens))
    for s in range(0, len(prompts), batch_size):
        e = min(s + batch_size, len(prompts))
        yield decoder.generate_batch(prompts[s:e], prompt_ids[s:e], list(range(s, e)))
