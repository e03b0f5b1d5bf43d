"""The speculative decoding loop: draft k_r tokens, verify them in one target forward, keep the longest
acceptable prefix, roll both KV caches back. Lossless: the output is distributed exactly as the target's.
k_r is the drafter's k capped by what is left (token budget, context positions); k_r = 0 is a plain target step.

Invariant between rounds: the target's cache holds a prefix of the committed tokens (all but the last after
the first round; empty before it, so the prefill pass verifies the first drafts); the drafter's cache holds a
prefix too. One host/device sync per round (`to_host`); draft and verify are timed by device events read
after it (engine/clock.py), and the round's tokens arrive together right after it (PromptResult.token_seconds,
seconds from the decode's start, as the batched decoders record them).
"""
from __future__ import annotations

from typing import Callable

import torch

from .cached_model import CachedModel
from .clock import RoundClock
from .drafting import Drafter, Proposal
from .records import DraftToken, PromptResult, Round, settle_round
from .sampling import SamplingConfig, probabilities, prompt_generator, sample_rows
from .token_types import TokenTyper


def verify(proposal: Proposal, p_target: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator):
    """Accept each draft token with prob min(1, p_t/p_d) while all before it were accepted; then draw the
    next token from normalize(max(0, p_t - p_d)) at the first rejection, or from p_t after the last draft
    (bonus). p_target is [k+1, V]. Returns (accepted count, next token) as 0-d device tensors.

    A drafter without a distribution (prompt lookup) proposes point masses, p_d = onehot(x): the test is then
    u < p_t(x), i.e. acceptance with probability min(1, p_t(x)), and the residual max(0, p_t - onehot(x)) is p_t
    with x removed (both exact in floating point: p_d is exactly 1 and 0). The batch-1 case of `verify_rows`."""
    k = proposal.tokens.shape[0]
    n, next_token = verify_rows(proposal.tokens[None], proposal.probs[None], [k], None, p_target[None], cfg,
                                [generator])
    return n[0], next_token[0]


def verify_rows(tokens: torch.Tensor, draft_probs: torch.Tensor, ks: list[int], valid: torch.Tensor | None,
                p_target: torch.Tensor, cfg: SamplingConfig, generators: list[torch.Generator]):
    """`verify` for B rows at once (engine/batched.py; batch 1 is `verify`): tokens [B, K] and draft_probs
    [B, K, V], row r proposing its first ks[r] (valid [B, K] marks them; None when every row proposed K, and
    draft_probs is zero past ks[r]); p_target [B, K+1, V], row r's slot i scoring draft i. Row r draws its ks[r]
    uniforms and its correction / bonus from generators[r], as a batch-1 decode of it would. Returns (accepted
    counts [B], next tokens [B]) on the device, without a host sync."""
    batch, k = tokens.shape
    if cfg.greedy:
        best = p_target.argmax(-1)  # the target's token at every slot [B, K+1]: drafts' checks and the next token
        ok = tokens == best[:, :k]
    else:
        p_t = p_target[:, :k].gather(-1, tokens[..., None])[..., 0]
        p_d = draft_probs.gather(-1, tokens[..., None])[..., 0]
        draws = [torch.rand(kr, generator=g, device=p_target.device) for kr, g in zip(ks, generators)]
        u = torch.stack([torch.nn.functional.pad(d, (0, k - d.shape[0]), value=1.0) for d in draws])
        ok = u * p_d < p_t  # u < min(1, p_t / p_d) without dividing by zero
    if valid is not None:
        ok = ok & valid
    n = ok.long().cumprod(1).sum(1)
    if cfg.greedy:
        return n, best.gather(1, n[:, None])[:, 0]
    rows = torch.arange(batch, device=p_target.device)
    target_row = p_target[rows, n]
    draft_row = torch.cat([draft_probs, torch.zeros_like(target_row)[:, None]], 1)[rows, n]
    residual = residual_distribution(target_row, draft_row)  # at n == k draft_row is 0: plain p_t (bonus)
    return n, sample_rows(residual, cfg, generators)


def residual_distribution(p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """max(0, p_t - p_d) per row of [..., V], falling back to p_t where rounding left no mass (sampling ignores
    the scale)."""
    residual = (p_target - p_draft).clamp(min=0)
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_target)


def draft_stats(tokens: torch.Tensor, draft_probs: torch.Tensor, draft_logits: torch.Tensor | None,
                p_target: torch.Tensor, target_logits: torch.Tensor):
    """What a round records per draft token, on the device, for tokens [..., k] with their distributions
    [..., k, V] (the target's scoring each draft's slot): (p_draft of the token, p_target of the token,
    beta = sum min(p_d, p_t), KL(p_t || p_d) of the raw logits, NaN without draft logits), each [..., k]."""
    idx = tokens[..., None]
    p_d = draft_probs.gather(-1, idx)[..., 0]
    p_t = p_target.gather(-1, idx)[..., 0]
    beta = torch.minimum(draft_probs, p_target).sum(-1)
    if draft_logits is not None:
        log_t = target_logits.float().log_softmax(-1)
        log_d = draft_logits.float().log_softmax(-1)
        kl = (log_t.exp() * (log_t - log_d)).sum(-1)
    else:
        kl = torch.full(tokens.shape, float("nan"), device=p_t.device)
    return p_d, p_t, beta, kl


def round_record(typer: TokenTyper, eos_ids: set[int], prompt_index: int, round_index: int, host: dict,
                 budget: int, draft_s: float, verify_s: float, forwards: int) -> Round:
    """The Round a verified round's host fields (see `to_host`) settle into; the batch-1 and batched loops both
    build their records here."""
    drafted = host["tokens"]
    emitted, kinds, accepted, outcomes = settle_round(drafted, host["accepted"], host["next"], eos_ids, budget)
    tokens = []
    for i, (token, outcome) in enumerate(zip(drafted, outcomes)):
        text, kind = typer.describe(token)
        tokens.append(DraftToken(i + 1, token, text, kind, host["p_draft"][i], host["p_target"][i],
                                 host["beta"][i], host["kl"][i], outcome))
    return Round(prompt_index, round_index, len(drafted), accepted, emitted, kinds, draft_s, verify_s, forwards, tokens)


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
        sequence, output, rounds, arrivals = prompt_ids, [], [], []
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
            arrived = clock.now() - start  # the round's tokens reached the host together, with the transfer
            accepted = host["accepted"]
            self.target.rollback(length + accepted)
            self.drafter.accept(length, accepted)
            round_ = self._record(prompt_index, len(rounds), host, limit - len(output),
                                  clock.seconds(t_draft, t_verify), clock.seconds(t_verify, t_done), proposal.forwards)
            rounds.append(round_)
            output += round_.emitted_ids
            arrivals += [arrived] * len(round_.emitted_ids)
            # Built from device tensors: a host-to-device copy would be a second sync.
            emitted = torch.cat([proposal.tokens[:accepted], next_token.view(1)])[: len(round_.emitted_ids)]
            sequence = torch.cat([sequence, emitted.view(1, -1)], dim=1)
            if on_progress is not None:
                on_progress(len(output))
        wall = clock.wall() - start
        text = self.typer.tokenizer.decode(output, skip_special_tokens=True)
        return PromptResult(prompt_index, prompt, output, text, wall, rounds=rounds, token_seconds=arrivals)

    def peak_cache_bytes(self) -> int:
        """Peak KV-cache bytes since the last reset: the target's plus the drafter's, if it has a cache."""
        drafter = getattr(self.drafter, "peak_cache_bytes", None)
        return self.target.peak_cache_bytes + (drafter() if drafter else 0)

    def reset_peak_cache_bytes(self) -> None:
        self.target.reset_peak()
        if hasattr(self.drafter, "reset_peak_cache_bytes"):
            self.drafter.reset_peak_cache_bytes()

    def _record(self, prompt_index, round_index, host, budget, draft_s, verify_s, forwards) -> Round:
        return round_record(self.typer, self.eos_ids, prompt_index, round_index, host, budget, draft_s, verify_s,
                            forwards)


def to_host(proposal: Proposal, p_target: torch.Tensor, target_logits: torch.Tensor,
            n: torch.Tensor, next_token: torch.Tensor) -> dict:
    """Everything a round records, computed on the device and moved to the host in one transfer: the one-row
    case of `rows_to_host`."""
    raw = proposal.raw_logits
    return rows_to_host(proposal.tokens[None], proposal.probs[None], None if raw is None else raw[None],
                        [proposal.tokens.shape[0]], p_target[None], target_logits[None], n.view(1),
                        next_token.view(1))["rows"][0]


def rows_to_host(tokens: torch.Tensor, draft_probs: torch.Tensor, draft_logits: torch.Tensor | None, ks: list[int],
                 p_target: torch.Tensor, target_logits: torch.Tensor, n: torch.Tensor, next_tokens: torch.Tensor,
                 extras: list = ()) -> dict:
    """What a round records for B rows (tokens [B, K] and the rest as `verify_rows` takes them, n and next_tokens
    [B]), computed on the device and moved to the host in ONE transfer (`.tolist()`, the round's one sync), with
    the 0-d integer tensors `extras` (None allowed). Returns {"rows": per row {"accepted", "next", "tokens",
    "p_draft", "p_target", "beta", "kl"}, cut to the row's ks[r], "trailing": the extras as ints (None where
    None)}."""
    batch, width = tokens.shape
    stats = torch.stack(draft_stats(tokens, draft_probs, draft_logits, p_target[:, :width], target_logits[:, :width]))
    present = [e.reshape(1) for e in extras if e is not None]
    ints = [n, next_tokens, tokens.reshape(-1), *present]  # row r's tokens at 2 * batch + r * width
    flat = torch.cat([torch.cat(ints).double(), stats.reshape(-1).double()]).tolist()
    head = batch * (2 + width) + len(present)
    rows = []
    for r, k in enumerate(ks):
        at = 2 * batch + r * width
        cols = [flat[head + (i * batch + r) * width : head + (i * batch + r) * width + k] for i in range(4)]
        rows.append({"accepted": int(flat[r]), "next": int(flat[batch + r]), "tokens": [int(t) for t in flat[at : at + k]],
                     "p_draft": cols[0], "p_target": cols[1], "beta": cols[2], "kl": cols[3]})
    tail = iter(int(v) for v in flat[batch * (2 + width) : head])
    return {"rows": rows, "trailing": [None if e is None else next(tail) for e in extras]}
