"""Block verification (Sun et al. 2024, "Block verification accelerates speculative decoding"), for B ragged rows
at once: the draft is verified as a block, not token by token. Lossless like the standard rule, and it accepts at
least as many drafts in expectation.

The rule as vLLM serves it (`rejection_sample_method: "block"`: vllm/v1/worker/gpu/spec_decode/
rejection_sampler_utils.py, `_compute_cumulative_log_p_kernel`, `_compute_local_residual_mass_kernel`,
`_rejection_kernel` and `_resample_kernel` under USE_BLOCK_VERIFICATION), for a row of k drafts x_1..x_k, p_t^(i)
and p_d^(i) the target's and the draft's distributions at slot i (after i drafts; slot i scores draft i + 1):

    p_0 = 1,  p_i = min(1, p_{i-1} p_t^(i-1)(x_i) / p_d^(i-1)(x_i))      the weight of the first i drafts
    r_i = sum_x max(0, p_i p_t^(i)(x) - p_d^(i)(x))                      the residual mass after them
    h_i = r_i / (r_i + 1 - p_i) for i < k (1 where that is 0 / 0),  h_k = p_k
    u_i ~ U(0, 1) for i = 1..k;  tau = the largest i with u_i < h_i, else 0
    next token: tau = k: p_t^(k) (the bonus); else normalize(max(0, p_tau p_t^(tau) - p_d^(tau)))

The row accepts x_1..x_tau: tau is the LAST position whose test passes, so a failed test at i < tau does not stop
the row. `block_weights` computes every p_i at once: log p_i follows Lindley's recursion w_i = min(0, w_{i-1} + s_i)
(s_i the log ratio), whose solution is S_i - max_{j <= i} S_j for the partial sums S (S_0 = 0).

Randomness: row r draws its k_r uniforms, then its correction or bonus, from generators[r] (as the standard rule
does), so a row never depends on its neighbours. The standard rule's verdict on the same drafts with the same
uniforms (u_i < min(1, p_t / p_d) for every i up to its first failure) comes along as `accepted_standard`, what a
run records as Round.accepted_standard. A point-mass draft (p_d one-hot) is the same formula: its residual is
p_tau p_t with the draft token removed. Greedy decoding is not this file's: block equals the standard argmax rule.
"""

from __future__ import annotations

import torch

from engine.decoding.sampling import SamplingConfig, row_uniforms, sample_rows
from engine.decoding.verdict import Verdict


def verify_block(
    tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    ks: list[int],
    valid: torch.Tensor | None,
    p_target: torch.Tensor,
    cfg: SamplingConfig,
    generators: list[torch.Generator],
) -> Verdict:
    """Block verification of one sampled round for B rows, the inputs as engine.decoding.verification.verify_rows
    takes them (tokens [B, K], draft_probs [B, K, V] zero past ks[r], valid [B, K] or None, p_target [B, K+1, V]).
    The Verdict carries the standard rule's accepted counts on the same uniforms; it stays on the device."""
    batch, k = tokens.shape
    device = p_target.device
    live = valid if valid is not None else torch.ones_like(tokens, dtype=torch.bool)
    p_t = p_target[:, :k].gather(-1, tokens[..., None])[..., 0]
    p_d = draft_probs.gather(-1, tokens[..., None])[..., 0]
    u = row_uniforms(ks, generators, k, device)
    standard = ((u * p_d < p_t) & live).long().cumprod(1).sum(1)
    ratio = torch.where(live & (p_d > 0), p_t / p_d.clamp(min=torch.finfo(p_d.dtype).tiny), 0.0)
    weights = block_weights(ratio)  # [B, K+1]: p_0..p_K
    # r_1..r_{K-1} (slot 0's test is never made; slot k_r's h is p_{k_r}); one [B, K-1, V] pass, in place
    mass = (p_target[:, 1:k] * weights[:, 1:k, None]).sub_(draft_probs[:, 1:]).clamp_(min=0).sum(-1)
    denominator = mass + 1 - weights[:, 1:k]
    h = torch.where(denominator > 0, mass / denominator.clamp(min=torch.finfo(mass.dtype).tiny), 1.0)
    h = torch.cat([h, weights[:, k:]], 1)  # h_1..h_K, h_K = p_K
    last = live.sum(1)  # k_r: its test is h = p_{k_r}
    h = torch.where(torch.arange(1, k + 1, device=device)[None, :] == last[:, None], weights[:, 1:], h)
    passed = (u < h) & live
    positions = torch.arange(1, k + 1, device=device)
    tau = (passed.long() * positions).amax(1) if k else torch.zeros(batch, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)
    stop = tau.clamp(max=max(k - 1, 0))
    drafted = draft_probs[rows, stop] * (tau < k)[:, None] if k else torch.zeros_like(p_target[:, 0])  # 0: bonus
    residual = block_residual(weights[rows, tau], p_target[rows, tau], drafted)
    return Verdict(tau, sample_rows(residual, cfg, generators), standard)


def block_weights(ratio: torch.Tensor) -> torch.Tensor:
    """p_0..p_K [B, K+1] from the drafts' ratios p_t(x_i) / p_d(x_i) [B, K] (0 for a slot without a draft):
    p_0 = 1, p_i = min(1, p_{i-1} ratio_i), through the logs' running maximum (no loop over positions)."""
    logs = torch.cat([ratio.new_zeros(ratio.shape[0], 1), ratio.log().cumsum(1)], 1)  # S_0..S_K (-inf after a 0)
    return (logs - logs.cummax(1).values).exp()


def block_residual(weight: torch.Tensor, p_target: torch.Tensor, p_draft: torch.Tensor) -> torch.Tensor:
    """max(0, p_tau p_t - p_d) per row of [B, V] at the stop tau (weight [B] = p_tau; p_d = 0 at a bonus slot,
    where it is p_t itself), p_t where rounding left no mass (sampling ignores the scale)."""
    residual = (weight[:, None] * p_target - p_draft).clamp(min=0)
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_target)
