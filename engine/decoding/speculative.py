"""The speculative decoding loop: B prompts of different lengths decoded together (a single prompt is the one-row
case: there is no second loop), every drafter through one protocol (engine/decoding/drafting.py), one cache path
(engine/decoding/batched_cache.py: left padding, per-row positions, holes, rollback, compaction).

Per round, for the rows still running:
  1. the drafter proposes k_r <= cap_r tokens for each row r (ragged: padded to K = max k_r); cap_r is what is
     left of the row's token budget and of the target's positions, so a round never overruns either;
  2. ONE target forward scores every row: row r feeds [its pending tokens (left-padded), its drafts (right-padded
     to K)], so slot i of every row scores draft i. The first round starts from the prompt: the target's prefill
     pass verifies the first drafts;
  3. ONE vectorised verify (engine/decoding/verification.py) gives a Verdict: per-row accepted counts a_r and
     correction / bonus tokens, on the device;
  4. both caches roll back on the device (the rejected columns become holes; a one-row cache crops them) and
     everything the round records moves to the host in ONE transfer (`.tolist()`): a VerifiedRound, one
     VerifiedRow per row plus the hole counts `trim` needs. Draft and verify are timed by device events read after
     it (engine/decoding/clock.py), and the round's tokens arrive together right after it
     (PromptResult.token_seconds).
A token tree (SamplingConfig.tree_topk > 1: Proposal.tree) changes steps 2-4 only: the forward feeds every node
with a tree mask, the rule is engine/decoding/tree_verification.py's, and the target's cache keeps the accepted
path's columns (the other nodes' become holes); the round records the path it walked, one draft row per depth.
A drafter that reads the target's hidden states (an EAGLE-3 head: DrafterSpec.needs_hidden_states) gets them from
step 2's forward itself, the layers it names returned beside the logits, and `settle` hands it those of the
positions each row committed (TargetStates): no extra target forward. The first round's forward is the prefill.
Then each row's VerifiedRow is settled into its Round (engine.decoding.verification.round_record), so a row yields
the same records (per round, per draft token) as that prompt decoded alone, and storage logs them unchanged.

Invariant between rounds: each row's target cache holds a prefix of its committed tokens (all but the last after
the first round), and so does the drafter's.

Randomness: row r draws from prompt_generator(seed, its prompt index) in a fixed order (its drafts, then its k_r
uniforms, then its correction), so a row never depends on the rows beside it: a sampled row equals that prompt
decoded alone.

Timing: every row's Round carries the batch round's draft and verify seconds and draft forwards (what that row
waited for; draft_seconds / draft_forwards is still one draft forward's time, at this batch size). A row's
`wall_seconds` is from the batch's start to that row's last token: its request latency.

Finished rows (EOS, budget) leave the batch after the round they finish in: both caches drop their rows
(`BatchCache.select`), so they cost no further forward work.

Rows are lossless: greedy rows equal the target-only decoding of that prompt alone token for token, sampled rows
follow the target's distribution (tests/test_engine_batched.py, tests/test_engine_sampling.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.decoding.batched_cache import BatchCache, left_pad, to_device
from engine.decoding.clock import RoundClock
from engine.decoding.drafting import COMPACT_SLACK, Drafter, TargetStates
from engine.decoding.records import PromptResult, Round
from engine.decoding.rows import OneRow, Rows
from engine.decoding.sampling import SamplingConfig, probabilities
from engine.decoding.torch_types import Model, inference_mode
from engine.decoding.tree_verification import (
    TreeRound,
    TreeRow,
    TreeVerdict,
    keep_path,
    path_states,
    record_round,
    tree_forward,
    tree_rows_to_host,
    verify_tree,
)
from engine.decoding.verification import Verdict, VerifiedRound, VerifiedRow, rows_to_host, verify_rows
from engine.text.token_types import TokenTyper

# Realign a cache when its width exceeds this many times its longest row (+ COMPACT_SLACK): holes from rejections.
COMPACT_RATIO = 2.0


class SpeculativeDecoder(OneRow):
    def __init__(
        self,
        target_model: Model,
        drafter: Drafter,
        vocab_size: int,
        cfg: SamplingConfig,
        typer: TokenTyper,
        eos_ids: set[int],
        compact_ratio: float | None = COMPACT_RATIO,
    ) -> None:
        spec = getattr(drafter, "spec", None)
        # A drafter that reads the target's hidden states (EAGLE-3 heads) names the layers; each verify forward
        # returns them beside its logits and `settle` hands the drafter those of the committed positions.
        self.hidden_layers: list[int] | None = (
            getattr(drafter, "hidden_layers", None) if spec is not None and spec.needs_hidden_states else None
        )
        self.target = BatchCache(target_model, vocab_size)
        self.clock = RoundClock(self.target.device)
        self.drafter = drafter
        self.cfg = cfg
        self.typer = typer
        self.eos_ids = eos_ids
        self.compact_ratio = compact_ratio
        self.rounds = 0  # batched rounds of the last generate_batch
        self.hole_share = 0.0  # mean share of the target cache's columns that were holes, over its rounds

    @inference_mode
    def generate_batch(
        self,
        prompts: list[str],
        prompt_ids: list[torch.Tensor],
        prompt_indices: list[int],
        on_progress: Callable[[int, int], None] | None = None,
        max_new_tokens: int | None = None,
    ) -> list[PromptResult]:
        """Decode prompts together (prompt_ids[i] is [1, n_i]); one PromptResult per prompt, in input order.
        on_progress(prompt index, new tokens so far) runs for each running row between rounds."""
        cfg, clock, target = self.cfg, self.clock, self.target
        limit = max_new_tokens or cfg.max_new_tokens
        count = len(prompts)
        start = clock.wall()
        state = Rows(prompt_ids, prompt_indices, cfg, target.device)
        target.reset(count)
        self.drafter.start(state.seqs, state.history, list(prompt_indices))
        cached = [0] * count  # real tokens in each row's target cache
        outputs: list[list[int]] = [[] for _ in range(count)]
        rounds: list[list[Round]] = [[] for _ in range(count)]
        walls = [0.0] * count
        arrivals: list[list[float]] = [
            [] for _ in range(count)
        ]  # each row's token arrival times (seconds from the batch's start)
        contexts = [self.typer.context(i, p) for i, p in zip(prompt_indices, prompts)]  # code or not: token types
        self.rounds, holes = 0, 0.0
        while state.live:
            lengths = [s.shape[0] for s in state.seqs]
            caps = [
                max(0, min(limit - len(outputs[o]) - 1, target.max_positions - n)) for o, n in zip(state.live, lengths)
            ]
            t_draft = clock.mark()
            proposal = self.drafter.propose(state.seqs, state.history, state.generators, caps)
            t_verify = clock.mark()
            for k, cap in zip(proposal.ks, caps):
                if k > cap:
                    raise ValueError(f"{type(self.drafter).__name__} proposed {k} tokens; this round allows {cap}")
            pending, pending_valid = left_pad([s[c:] for s, c in zip(state.seqs, cached)], target.device)
            tree = proposal.tree
            verdict: Verdict | TreeVerdict
            host: VerifiedRound | TreeRound
            if tree is not None:  # a token tree (engine/decoding/tree_verification.py): one forward, its own rule
                logits = tree_forward(target, pending, pending_valid, tree, self.hidden_layers)
                if self.hidden_layers:
                    logits, hidden = logits
                states = None
                p_target = probabilities(logits, cfg)
                verdict = verify_tree(tree, p_target, cfg, state.generators)
                if self.hidden_layers:
                    fed = [n - c for n, c in zip(lengths, cached)]
                    states = TargetStates(path_states(hidden, pending.shape[1], verdict.path), fed, pending.shape[1])
                keep_path(target, tree, verdict.path)  # the prefix and the accepted path's columns
                self.drafter.rollback(to_device(lengths, target.device) + verdict.accepted)
                t_done = clock.mark()
                host = tree_rows_to_host(
                    tree,
                    proposal.probs,
                    proposal.raw_logits,
                    p_target,
                    logits,
                    verdict,
                    target_holes=target.trailing_holes(),
                    drafter_holes=self.drafter.trailing_holes(),
                )
                drafted = verdict.path_tokens
            else:
                width = proposal.tokens.shape[1]
                slots = (
                    proposal.valid if proposal.valid is not None else torch.ones_like(proposal.tokens, dtype=torch.bool)
                )
                logits = target.forward(
                    torch.cat([pending, proposal.tokens], 1),
                    torch.cat([pending_valid, slots], 1),
                    keep=width + 1,
                    hidden_layers=self.hidden_layers,
                )
                if self.hidden_layers:
                    logits, hidden = logits
                    states = TargetStates(hidden, [n - c for n, c in zip(lengths, cached)], pending.shape[1])
                else:
                    states = None
                p_target = probabilities(logits, cfg)
                verdict = verify_rows(
                    proposal.tokens, proposal.probs, proposal.ks, proposal.valid, p_target, cfg, state.generators
                )
                kept = to_device(lengths, target.device) + verdict.accepted
                target.rollback(kept)
                self.drafter.rollback(kept)
                t_done = clock.mark()
                host = rows_to_host(
                    proposal.tokens,
                    proposal.probs,
                    proposal.raw_logits,
                    proposal.ks,
                    p_target,
                    logits,
                    verdict.accepted,
                    verdict.next_tokens,
                    target_holes=target.trailing_holes(),
                    drafter_holes=self.drafter.trailing_holes(),
                    accepted_standard=verdict.accepted_standard,
                )
                drafted = proposal.tokens
            draft_s, verify_s = clock.seconds(t_draft, t_verify), clock.seconds(t_verify, t_done)
            arrived = clock.now() - start  # the round's tokens reached the host together, with the transfer
            self.rounds += 1
            finished, keep = [], []
            verified: list[VerifiedRow | TreeRow] = list(host.rows)
            for r, (o, row) in enumerate(zip(state.live, verified)):
                round_ = record_round(
                    self.typer,
                    self.eos_ids,
                    prompt_indices[o],
                    len(rounds[o]),
                    row,
                    limit - len(outputs[o]),
                    draft_s,
                    verify_s,
                    proposal.forwards,
                    contexts[o],
                )
                rounds[o].append(round_)
                outputs[o] += round_.emitted_ids
                arrivals[o] += [arrived] * len(round_.emitted_ids)
                a = row.accepted
                cached[r] = lengths[r] + a
                # Built from device tensors: a host-to-device copy would be a second sync.
                emitted = torch.cat([drafted[r, :a], verdict.next_tokens[r : r + 1]])[: len(round_.emitted_ids)]
                state.seqs[r] = torch.cat([state.seqs[r], emitted])
                state.history[r] = state.history[r] + round_.emitted_ids
                if len(outputs[o]) >= limit or outputs[o][-1] in self.eos_ids:
                    finished.append(o)
                else:
                    keep.append(r)
                if on_progress is not None:
                    on_progress(prompt_indices[o], len(outputs[o]))
            accepted = [row.accepted for row in verified]
            target.trim(host.target_holes or 0)
            self.drafter.settle(lengths, accepted, host.drafter_holes, states)
            holes += 1 - sum(cached) / max(1, target.batch * target.width)
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
        self.drafter.finish(list(prompt_indices), outputs)
        return [
            PromptResult(
                prompt_indices[o],
                prompts[o],
                outputs[o],
                self.typer.tokenizer.decode(outputs[o], skip_special_tokens=True),
                walls[o],
                rounds=rounds[o],
                token_seconds=arrivals[o],
            )
            for o in range(count)
        ]

    def peak_cache_bytes(self) -> int:
        """Peak KV-cache bytes since the last reset: the target's plus the drafter's, if it has a cache."""
        drafter = getattr(self.drafter, "peak_cache_bytes", None)
        return self.target.peak_cache_bytes + (drafter() if drafter else 0)

    def reset_peak_cache_bytes(self) -> None:
        self.target.reset_peak()
        if hasattr(self.drafter, "reset_peak_cache_bytes"):
            self.drafter.reset_peak_cache_bytes()
