"""The speculative decoding loop: draft k_r tokens, verify them in one target forward, keep the longest
acceptable prefix, roll both KV caches back. Lossless: the output is distributed exactly as the target's.
k_r is the drafter's k capped by what is left (token budget, context positions); k_r = 0 is a plain target step.

Invariant between rounds: the target's cache holds a prefix of the committed tokens (all but the last after
the first round; empty before it, so the prefill pass verifies the first drafts); the drafter's cache holds a
prefix too. One host/device sync per round (`to_host`); draft and verify are timed by device events read
after it (engine/clock.py).
"""
from __future__ import annotations

from typing import Callable

import torch

from .cached_model import CachedModel
from .clock import RoundClock
from .drafting import Drafter, Proposal
from .records import DraftToken, PromptResult, Round, settle_round
from .sampling import SamplingConfig, probabilities, prompt_generator, sample
from .token_types import TokenTyper


def verify(proposal: Proposal, p_target: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator):
    """Accept each draft token with prob min(1, p_t/p_d) while all before it were accepted; then draw the
    next token from normalize(max(0, p_t - p_d)) at the first rejection, or from p_t after the last draft
    (bonus). p_target is [k+1, V]. Returns (accepted count, next token) as 0-d device tensors.

    A drafter without a distribution (prompt lookup) proposes point masses, p_d = onehot(x): the test is then
    u < p_t(x), i.e. acceptance with probability min(1, p_t(x)), and the residual max(0, p_t - onehot(x)) is p_t
    with x removed (both exact in floating point: p_d is exactly 1 and 0)."""
    k = proposal.tokens.shape[0]
    rows = torch.arange(k, device=p_target.device)
    if cfg.greedy:
        ok = proposal.tokens == p_target[:k].argmax(-1)
    else:
        p_t = p_target[rows, proposal.tokens]
        p_d = proposal.probs[rows, proposal.tokens]
        u = torch.rand(k, generator=generator, device=p_target.device)
        ok = u * p_d < p_t  # u < min(1, p_t / p_d) without dividing by zero
    n = ok.long().cumprod(0).sum()
    target_row = p_target.index_select(0, n.view(1))[0]
    if cfg.greedy:
        return n, target_row.argmax()
    draft_row = torch.cat([proposal.probs, torch.zeros_like(target_row)[None]]).index_select(0, n.view(1))[0]
    residual = residual_distribution(target_row, draft_row)  # at n == k draft_row is 0: plain p_t (bonus)
    return n, sample(residual, cfg, generator)


def residual_distribution(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """max(0, p_t - p_d), falling back to p_t where rounding left no mass (sampling ignores the scale)."""
    residual = (p_target - p_draft).clamp(min=0)
    return torch.where(residual.sum() > 0, residual, p_target)


class SpeculativeDecoder:
    def __init__(self, target_model, drafter: Drafter, vocab_size: int, cfg: SamplingConfig,
                 typer: TokenTyper, eos_ids: set[int]):
        self.target = CachedModel(target_model, vocab_size)
        self.clock = RoundClock(self.target.device)
        self.drafter = drafter
        self.cfg = cfg
        self.typer = typer
        self.eos_ids = eos_ids

    @torch.inference_mode()
    def generate(self, prompt: str, prompt_ids: torch.Tensor, prompt_index: int,
                 on_progress: Callable[[int], None] | None = None, max_new_tokens: int | None = None) -> PromptResult:
        """Decode one prompt; on_progress(new tokens so far) runs between rounds (raise there to cancel)."""
        cfg, g = self.cfg, prompt_generator(self.cfg.seed, prompt_index, self.target.device)
        limit = max_new_tokens or cfg.max_new_tokens
        clock = self.clock
        start = clock.wall()
        # The first round starts from the prompt: the target's prefill pass also verifies the first drafts.
        self.target.reset()
        self.drafter.start(prompt_ids)
        sequence, output, rounds = prompt_ids, [], []
        while len(output) < limit and not (output and output[-1] in self.eos_ids):
            length = sequence.shape[1]
            # A round emits up to k_r + 1 tokens and the target scores positions up to length + k_r - 1.
            cap = max(0, min(limit - len(output) - 1, self.target.max_positions - length))
            t_draft = clock.mark()
            proposal = self.drafter.propose(sequence, g, cap)
            t_verify = clock.mark()
            k = proposal.tokens.shape[0]
            if k > cap:
                raise ValueError(f"{type(self.drafter).__name__} proposed {k} tokens; this round allows {cap}")
            fed = torch.cat([sequence[:, self.target.length :], proposal.tokens.view(1, -1)], dim=1)
            target_logits = self.target.forward(fed, keep=k + 1)
            p_target = probabilities(target_logits, cfg)
            n, next_token = verify(proposal, p_target, cfg, g)
            t_done = clock.mark()
            host = to_host(proposal, p_target, target_logits, n, next_token)  # the sync; t_done has completed
            accepted = host["accepted"]
            self.target.rollback(length + accepted)
            self.drafter.accept(length, accepted)
            round_ = self._record(prompt_index, len(rounds), host, limit - len(output),
                                  clock.seconds(t_draft, t_verify), clock.seconds(t_verify, t_done), proposal.forwards)
            rounds.append(round_)
            output += round_.emitted_ids
            # Built from device tensors: a host-to-device copy would be a second sync.
            emitted = torch.cat([proposal.tokens[:accepted], next_token.view(1)])[: len(round_.emitted_ids)]
            sequence = torch.cat([sequence, emitted.view(1, -1)], dim=1)
            if on_progress is not None:
                on_progress(len(output))
        wall = clock.wall() - start
        text = self.typer.tokenizer.decode(output, skip_special_tokens=True)
        return PromptResult(prompt_index, prompt, output, text, wall, rounds=rounds)

    def peak_cache_bytes(self) -> int:
        """Peak KV-cache bytes since the last reset: the target's plus the drafter's, if it has a cache."""
        drafter = getattr(self.drafter, "peak_cache_bytes", None)
        return self.target.peak_cache_bytes + (drafter() if drafter else 0)

    def reset_peak_cache_bytes(self) -> None:
        self.target.reset_peak()
        if hasattr(self.drafter, "reset_peak_cache_bytes"):
            self.drafter.reset_peak_cache_bytes()

    def _record(self, prompt_index, round_index, host, budget, draft_s, verify_s, forwards) -> Round:
        drafted = host["tokens"]
        emitted, kinds, accepted, outcomes = settle_round(drafted, host["accepted"], host["next"], self.eos_ids, budget)
        tokens = []
        for i, (token, outcome) in enumerate(zip(drafted, outcomes)):
            text, kind = self.typer.describe(token)
            tokens.append(DraftToken(i + 1, token, text, kind, host["p_draft"][i], host["p_target"][i],
                                     host["beta"][i], host["kl"][i], outcome))
        return Round(prompt_index, round_index, len(drafted), accepted, emitted, kinds, draft_s, verify_s, forwards, tokens)


def to_host(proposal: Proposal, p_target: torch.Tensor, target_logits: torch.Tensor,
            n: torch.Tensor, next_token: torch.Tensor) -> dict:
    """Everything a round records, computed on the device and moved to the host in one transfer."""
    k = proposal.tokens.shape[0]
    rows = torch.arange(k, device=p_target.device)
    p_t = p_target[:k]
    beta = torch.minimum(proposal.probs, p_t).sum(-1)
    if proposal.raw_logits is not None:
        log_t = target_logits[:k].float().log_softmax(-1)
        log_d = proposal.raw_logits.float().log_softmax(-1)
        kl = (log_t.exp() * (log_t - log_d)).sum(-1)
    else:
        kl = torch.full((k,), float("nan"), device=p_t.device)
    packed = torch.cat([
        torch.stack([n, next_token]).double(),
        proposal.tokens.double(),
        proposal.probs[rows, proposal.tokens].double(),
        p_t[rows, proposal.tokens].double(),
        beta.double(),
        kl.double(),
    ]).tolist()
    fields = [packed[2 + i * k : 2 + (i + 1) * k] for i in range(5)]
    return {
        "accepted": int(packed[0]),
        "next": int(packed[1]),
        "tokens": [int(t) for t in fields[0]],
        "p_draft": fields[1],
        "p_target": fields[2],
        "beta": fields[3],
        "kl": fields[4],
    }
