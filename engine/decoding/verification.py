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

from dataclasses import dataclass

import torch

from engine.decoding.block_verification import verify_block
from engine.decoding.records import DraftToken, Round, settle_round
from engine.decoding.sampling import SamplingConfig, row_uniforms, sample_rows
from engine.decoding.verdict import Verdict as Verdict  # re-exported: the rules and their callers share it
from engine.text.token_types import CodeContext, TokenTyper

# What draft_stats computes per draft token, in its order: each is a VerifiedRow list and a DraftToken field of the
# same name, so a new per-draft measurement is its line in draft_stats, its name here and its two fields.
STATS = ("p_draft", "p_target", "beta", "kl", "target_entropy")


@dataclass(frozen=True)
class VerifiedRow:
    """One row's verified round on the host (one row of `rows_to_host`): what `round_record` settles into a Round.
    The per-draft lists hold the row's k_r proposed drafts, in order."""

    accepted: int  # drafts verification accepted (an EOS or the budget may cut the round shorter: round_record)
    next_token: int  # the correction at the first rejection, or the bonus token after the last draft
    drafted: list[int]  # the proposed token ids
    p_draft: list[float]  # each draft's probability under the draft's processed distribution
    p_target: list[float]  # ... under the target's
    beta: list[float]  # sum_x min(p_d(x), p_t(x)) at each draft's slot
    kl: list[float]  # KL(p_t || p_d) of the raw logits at each slot (NaN without draft logits)
    target_entropy: list[float]  # the entropy of the target's raw logits at each slot, in nats
    accepted_standard: int | None = None  # block verification: what the standard rule accepted on the same uniforms


@dataclass(frozen=True)
class VerifiedRound:
    """A verified round of B rows, moved to the host in one transfer: each row's VerifiedRow, and the trailing hole
    counts of the target's and the drafter's caches read with it (None where no cache was read)."""

    rows: list[VerifiedRow]
    target_holes: int | None = None
    drafter_holes: int | None = None


def verify_rows(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    ks: list[int],
    valid: torch.Tensor | None,
    p_target: torch.Tensor,
    cfg: SamplingConfig,
    generators: list[torch.Generator],
) -> Verdict:
    """Verification of one round for B rows at once: tokens [B, K] and draft_probs [B, K, V], row r proposing its
    first ks[r] (valid [B, K] marks them; None when every row proposed K, and draft_probs is zero past ks[r]);
    p_target [B, K+1, V], row r's slot i scoring draft i. Row r draws its ks[r] uniforms and its correction / bonus
    from generators[r], as a one-row decode of it would. The Verdict stays on the device (no host sync).
    cfg.verify picks the rule: "block" is engine/decoding/block_verification.py's when sampling (greedy, it is this
    argmax rule, and its Verdict says the standard rule accepted as much)."""
    batch, k = tokens.shape
    if cfg.verify == "block" and not cfg.greedy:
        return verify_block(tokens, draft_probs, ks, valid, p_target, cfg, generators)
    if cfg.greedy:
        best = p_target.argmax(-1)  # the target's token at every slot [B, K+1]: drafts' checks and the next token
        ok = tokens == best[:, :k]
    else:
        p_t = p_target[:, :k].gather(-1, tokens[..., None])[..., 0]
        p_d = draft_probs.gather(-1, tokens[..., None])[..., 0]
        u = row_uniforms(ks, generators, k, p_target.device)
        ok = u * p_d < p_t  # u < min(1, p_t / p_d) without dividing by zero
    if valid is not None:
        ok = ok & valid
    n = ok.long().cumprod(1).sum(1)
    if cfg.greedy:
        return Verdict(n, best.gather(1, n[:, None])[:, 0], n if cfg.verify == "block" else None)
    rows = torch.arange(batch, device=p_target.device)
    target_row = p_target[rows, n]
    draft_row = torch.cat([draft_probs, torch.zeros_like(target_row)[:, None]], 1)[rows, n]
    residual = residual_distribution(target_row, draft_row)  # at n == k draft_row is 0: plain p_t (bonus)
    return Verdict(n, sample_rows(residual, cfg, generators))


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
) -> tuple[torch.Tensor, ...]:
    """What a round records per draft token, on the device, for tokens [..., k] with their distributions
    [..., k, V] (the target's scoring each draft's slot), in STATS' order: (p_draft of the token, p_target of the
    token, beta = sum min(p_d, p_t), KL(p_t || p_d) of the raw logits, NaN without draft logits, the entropy of the
    target's raw logits: how unsure the target itself was there), each [..., k]."""
    idx = tokens[..., None]
    p_d = draft_probs.gather(-1, idx)[..., 0]
    p_t = p_target.gather(-1, idx)[..., 0]
    beta = torch.minimum(draft_probs, p_target).sum(-1)
    log_t = target_logits.float().log_softmax(-1)
    entropy = -torch.where(log_t > float("-inf"), log_t.exp() * log_t, 0.0).sum(-1)  # a masked token adds 0
    if draft_logits is not None:
        log_d = draft_logits.float().log_softmax(-1)
        kl = (log_t.exp() * (log_t - log_d)).sum(-1)
    else:
        kl = torch.full(tokens.shape, float("nan"), device=p_t.device)
    return p_d, p_t, beta, kl, entropy


def round_record(
    typer: TokenTyper,
    eos_ids: set[int],
    prompt_index: int,
    round_index: int,
    row: VerifiedRow,
    budget: int,
    draft_s: float,
    verify_s: float,
    forwards: int,
    context: CodeContext | None = None,
) -> Round:
    """The Round a verified row settles into. `context`: the prompt's code context (engine/text/token_types.py),
    which types the drafts and moves past what the round emits."""
    drafted = row.drafted
    emitted, kinds, accepted, outcomes = settle_round(drafted, row.accepted, row.next_token, eos_ids, budget)
    standard = row.accepted_standard
    if standard is not None and len(emitted) < row.accepted + 1:  # the round was cut: both counts stop at the cut
        standard = min(standard, len(emitted))
    context = context if context is not None else CodeContext(False)
    tokens = []
    for i, (token, outcome, (text, kind)) in enumerate(zip(drafted, outcomes, typer.drafts(drafted, context))):
        stats = {name: getattr(row, name)[i] for name in STATS}
        tokens.append(DraftToken(i + 1, token, text, kind, outcome=outcome, **stats))
    typer.emitted(emitted, context)
    return Round(
        prompt_index,
        round_index,
        len(drafted),
        accepted,
        emitted,
        kinds,
        draft_s,
        verify_s,
        forwards,
        tokens,
        accepted_standard=standard,
    )


def rows_to_host(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_logits: torch.Tensor | None,
    ks: list[int],
    p_target: torch.Tensor,
    target_logits: torch.Tensor,
    n: torch.Tensor,
    next_tokens: torch.Tensor,
    target_holes: torch.Tensor | None = None,
    drafter_holes: torch.Tensor | None = None,
    accepted_standard: torch.Tensor | None = None,
) -> VerifiedRound:
    """What a round records for B rows (tokens [B, K] and the rest as `verify_rows` takes them, n and next_tokens
    [B]), computed on the device and moved to the host in ONE transfer (`.tolist()`, the round's one sync), with the
    caches' 0-d trailing hole counts (None: not read) and the Verdict's accepted_standard [B] (None: the standard
    rule's round). Each row's lists are cut to its ks[r]."""
    batch, width = tokens.shape
    stats = torch.stack(draft_stats(tokens, draft_probs, draft_logits, p_target[:, :width], target_logits[:, :width]))
    holes = [target_holes, drafter_holes]
    present = [h.reshape(1) for h in holes if h is not None]
    standard = [] if accepted_standard is None else [accepted_standard]
    ints = [n, next_tokens, tokens.reshape(-1), *present, *standard]  # row r's tokens at 2 * batch + r * width
    flat = torch.cat([torch.cat(ints).double(), stats.reshape(-1).double()]).tolist()
    head = batch * (2 + width + len(standard)) + len(present)
    standards = [int(v) for v in flat[head - batch : head]] if standard else [None] * batch
    rows = []
    for r, k in enumerate(ks):
        at = 2 * batch + r * width
        cols = {
            name: flat[head + (i * batch + r) * width : head + (i * batch + r) * width + k]
            for i, name in enumerate(STATS)
        }
        rows.append(
            VerifiedRow(
                accepted=int(flat[r]),
                next_token=int(flat[batch + r]),
                drafted=[int(t) for t in flat[at : at + k]],
                accepted_standard=standards[r],
                **cols,
            )
        )
    tail = iter(int(v) for v in flat[batch * (2 + width) : batch * (2 + width) + len(present)])
    target_read, drafter_read = (None if h is None else next(tail) for h in holes)
    return VerifiedRound(rows, target_read, drafter_read)
