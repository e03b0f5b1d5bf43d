"""The verification rule of a speculative round, for B rows at once (a one-row decode is B = 1), and what a
verified round records.

Accept each draft token with probability min(1, p_t/p_d) while all before it were accepted; then draw the next
token from normalize(max(0, p_t - p_d)) at the first rejection, or from p_t after the last draft (bonus). A drafter
without a distribution (prompt lookup, suffix, greedy drafts) proposes point masses, p_d = onehot(x): the test is
then u < p_t(x), i.e. acceptance with probability min(1, p_t(x)), and the residual max(0, p_t - onehot(x)) is p_t
with x removed (both exact in floating point: p_d is exactly 1 and 0). Greedy: accepted iff the draft is the
target's argmax; the next token is the argmax at the first mismatch.
"""

from __future__ import annotations

import torch

from engine.decoding.records import DraftToken, Round, settle_round
from engine.decoding.sampling import SamplingConfig, sample_rows
from engine.text.token_types import CodeContext, TokenTyper


def verify_rows(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    ks: list[int],
    valid: torch.Tensor | None,
    p_target: torch.Tensor,
    cfg: SamplingConfig,
    generators: list[torch.Generator],
):
    """Verification of one round for B rows at once: tokens [B, K] and draft_probs [B, K, V], row r proposing its first ks[r] (valid [B, K] marks them; None when every row proposed K, and
    draft_probs is zero past ks[r]); p_target [B, K+1, V], row r's slot i scoring draft i. Row r draws its ks[r]
    uniforms and its correction / bonus from generators[r], as a one-row decode of it would. Returns (accepted
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


def draft_stats(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_logits: torch.Tensor | None,
    p_target: torch.Tensor,
    target_logits: torch.Tensor,
):
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


def round_record(
    typer: TokenTyper,
    eos_ids: set[int],
    prompt_index: int,
    round_index: int,
    host: dict,
    budget: int,
    draft_s: float,
    verify_s: float,
    forwards: int,
    context: CodeContext | None = None,
) -> Round:
    """The Round a verified row's host fields (one of `rows_to_host`'s rows) settle into. `context`: the prompt's
    code context (engine/text/token_types.py), which types the drafts and moves past what the round emits."""
    drafted = host["tokens"]
    emitted, kinds, accepted, outcomes = settle_round(drafted, host["accepted"], host["next"], eos_ids, budget)
    context = context if context is not None else CodeContext(False)
    tokens = []
    for i, (token, outcome, (text, kind)) in enumerate(zip(drafted, outcomes, typer.drafts(drafted, context))):
        tokens.append(
            DraftToken(
                i + 1,
                token,
                text,
                kind,
                host["p_draft"][i],
                host["p_target"][i],
                host["beta"][i],
                host["kl"][i],
                outcome,
            )
        )
    typer.emitted(emitted, context)
    return Round(prompt_index, round_index, len(drafted), accepted, emitted, kinds, draft_s, verify_s, forwards, tokens)


def rows_to_host(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_logits: torch.Tensor | None,
    ks: list[int],
    p_target: torch.Tensor,
    target_logits: torch.Tensor,
    n: torch.Tensor,
    next_tokens: torch.Tensor,
    extras: list = (),
) -> dict:
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
        rows.append(
            {
                "accepted": int(flat[r]),
                "next": int(flat[batch + r]),
                "tokens": [int(t) for t in flat[at : at + k]],
                "p_draft": cols[0],
                "p_target": cols[1],
                "beta": cols[2],
                "kl": cols[3],
            }
        )
    tail = iter(int(v) for v in flat[batch * (2 + width) : head])
    return {"rows": rows, "trailing": [None if e is None else next(tail) for e in extras]}
