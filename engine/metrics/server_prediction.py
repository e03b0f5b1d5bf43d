"""The server's speedup predicted from a lab run's acceptance and a serving engine's measured step costs, with a
joint bootstrap interval, and the per-concurrency k schedule that follows from it (issue 37, "Prediction for every
lab run").

What it predicts: for each k and each concurrency c of a server cost profile, the speedup the server would measure
per generated token (its tokens per second with speculation over its target-only tokens per second):

    speedup(k, c) = E[tokens per step at k] · t_0(c) / t_k(c),    E[tokens per step at k] = 1 + Σ_{i=1..k} Π_{j≤i} α_j

where α_j is the lab run's conditional acceptance at draft position j (accepted at j / rounds that reached j, pooled
over prompts: the definition of storage/records/production.py and theory.expected_round_length), and t_k(c) is the
server's inter-token step at k drafts and concurrency c (one engine step: a target forward for t_0, a speculative
round for k ≥ 1), the mean over the profile's passes. A k the profile did not measure takes t_k by linear
interpolation between the measured ks around it at that concurrency; a k above the largest measured one is refused,
never extrapolated.

Its interval (95 % by default) is a joint percentile bootstrap: each resample draws the run's prompts with
replacement (the α_j pooled again over them) and, independently, the profile's passes at every concurrency (when
every k at a concurrency has the same number of passes, pass i of each k is drawn together, since interleaved passes
ran back to back and share the machine's drift, as stats.paired_bootstrap_ci pairs arms; otherwise each k's passes
are drawn alone). Seeded: the same seed gives the same interval. With few passes a percentile bootstrap over them
runs narrow (a mean of 5 resampled with replacement varies less than a new mean of 5 would): in a simulated server
like tests/test_server_prediction.py's, 5 passes covered the true cost ratio about 83 % of the time at a nominal
95 %, 40 passes 93 %; the acceptance half (prompts) covered 95 %.

Assumptions:
- acceptance transfers from the lab: the server accepts at each position what the lab run accepted (the same
  drafter and target on the same traffic; `draftlab confirm` measured lab and vLLM within 0.02-0.06 per position);
- the cost comes from the server: t_k(c) is the engine's own step at that concurrency (its kernels, scheduler and
  batching), nothing of the lab's loop;
- a step's time does not depend on how many drafts it accepts: t_k(c) measured at one acceptance profile holds at
  the run's. This is what synthetic acceptance profiles (vLLM's `synthetic_acceptance_rates`) can test: profile
  the same k at two acceptance profiles and compare the steps;
- prompts weigh as their rounds did in the lab run at its K: at a smaller k, a prompt's share of rounds shifts a
  little (a hard prompt needs relatively more rounds), which the pooled α_j does not follow.

What it cannot stand in for: a confirm. It does not see a server that drafts differently from the lab (another
tokenizer path, a head read in the wrong layout, a sampler bug), outputs that differ, a step cost that changes with
acceptance, prefill and queueing outside the steps (long prompts, short answers), nor the server's own spread between
starts; its interval covers the lab's prompts and the profile's passes only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from engine.errors import DraftLabError
from engine.metrics.stats import BOOTSTRAP_SAMPLES, CONFIDENCE

# {concurrency: {k: step seconds of each pass}}: a server cost profile, k = 0 (the target alone) at every concurrency.
CostProfile = Mapping[int, Mapping[int, Sequence[float]]]


@dataclass(frozen=True)
class Prediction:
    """The predicted server speedup at k drafts and a concurrency, with its bootstrap interval (lo, hi)."""

    k: int
    concurrency: int
    speedup: float
    lo: float
    hi: float
    tokens_per_step: float  # E[tokens per step at k] from the pooled α_j
    step_seconds_ratio: float  # t_k / t_0 at this concurrency (the means over the passes)
    interpolated: bool  # t_k was interpolated between two measured ks


def pooled_acceptance(reached: ArrayLike, accepted: ArrayLike) -> list[float]:
    """α_j = Σ accepted at j / Σ rounds that reached j over prompts, j = 1..K (NaN where no round reached j).
    `reached` and `accepted` are (prompts × K) counts."""
    r, a = _counts(reached, accepted)
    totals = r.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return [float(v) for v in np.where(totals > 0, a.sum(0) / totals, np.nan)]


def tokens_per_step(alpha: ArrayLike) -> NDArray[np.float64]:
    """E[tokens per step] at k = 1..K for each row of α (rows × K, conditional per position): 1 + Σ_{i≤k} Π_{j≤i} α_j.
    A position past one that accepted nothing adds nothing, whatever its α (NaN included)."""
    a = np.atleast_2d(np.asarray(alpha, dtype=float))
    survive = np.ones(a.shape[0])
    out = np.empty_like(a)
    length = np.ones(a.shape[0])
    for j in range(a.shape[1]):
        survive = np.where(survive > 0, survive * a[:, j], 0.0)
        length = length + survive
        out[:, j] = length
    return out


def interpolated_step_seconds(measured: Mapping[int, float], k: int, concurrency: int) -> float:
    """The step seconds at k from those measured at some ks ({k: seconds}) at one concurrency: the measured figure,
    or the linear interpolation between the measured ks just below and above k. A DraftLabError for a k above the
    largest measured one (no extrapolation) or below the smallest."""
    lo_k, hi_k, w = _bracket(sorted(measured), k, concurrency)
    return (1 - w) * measured[lo_k] + w * measured[hi_k]


def predict_server_speedups(
    reached: ArrayLike,
    accepted: ArrayLike,
    profile: CostProfile,
    *,
    ks: Iterable[int] | None = None,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> list[Prediction]:
    """A Prediction per (k, concurrency), sorted by concurrency then k, from a lab run's per-prompt, per-position
    counts (`reached`, `accepted`: prompts × K, position j = 1..K in column j − 1) and a server cost profile
    ({concurrency: {k: step seconds per pass}}, k = 0 at every concurrency). `ks` defaults to every k from 1 to the
    smaller of K and the profile's largest k (at every concurrency); a k asked for above K, or above what a
    concurrency's profile measured, is refused in one line (DraftLabError). Interval: `samples` joint bootstrap
    resamples of prompts and passes (see the module's docstring), seeded."""
    r, a = _counts(reached, accepted)
    K = r.shape[1]
    costs = _profile(profile)
    wanted = sorted(set(ks)) if ks is not None else list(range(1, min([K, *(max(c) for c in costs.values())]) + 1))
    for k in wanted:
        if k < 1 or k > K:
            raise DraftLabError(f"cannot predict k {k}: the lab run measured acceptance at positions 1..{K} only")
    alpha = np.asarray(pooled_acceptance(r, a))
    point_length = tokens_per_step(alpha[None, :])[0]
    if not np.isfinite(point_length[max(wanted, default=1) - 1]):
        first = int(np.flatnonzero(~np.isfinite(point_length))[0]) + 1
        raise DraftLabError(
            f"cannot predict k {first} or above: no round of the lab run reached position {first} though "
            f"drafts before it were accepted (the rounds were cut short); predict k {first - 1} or less"
        )
    if samples < 1 or not 0 < confidence < 1:
        raise DraftLabError(f"a bootstrap needs samples ≥ 1 and 0 < confidence < 1 (got {samples}, {confidence})")

    rng = np.random.default_rng(seed)
    n = r.shape[0]
    idx = rng.integers(0, n, size=(samples, n))
    boot_reached, boot_accepted = r[idx].sum(1), a[idx].sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a position no resampled prompt reached keeps the full sample's rate
        boot_alpha = np.where(boot_reached > 0, boot_accepted / boot_reached, alpha[None, :])
    boot_length = tokens_per_step(boot_alpha)
    tail = (1 - confidence) / 2 * 100

    out: list[Prediction] = []
    for concurrency in sorted(costs):
        passes = costs[concurrency]
        means = {k: float(v.mean()) for k, v in passes.items()}
        boot_means = _resampled_means(passes, samples, rng)
        for k in wanted:
            lo_k, hi_k, w = _bracket(sorted(passes), k, concurrency)
            t_k = (1 - w) * means[lo_k] + w * means[hi_k]
            boot_t_k = (1 - w) * boot_means[lo_k] + w * boot_means[hi_k]
            speedup = float(point_length[k - 1] * means[0] / t_k)
            boot = boot_length[:, k - 1] * boot_means[0] / boot_t_k
            lo, hi = np.percentile(boot, [tail, 100 - tail])
            out.append(
                Prediction(
                    k=k,
                    concurrency=concurrency,
                    speedup=speedup,
                    lo=float(lo),
                    hi=float(hi),
                    tokens_per_step=float(point_length[k - 1]),
                    step_seconds_ratio=t_k / means[0],
                    interpolated=k not in passes,
                )
            )
    return out


def cost_ratios(
    profile: CostProfile, *, samples: int = BOOTSTRAP_SAMPLES, confidence: float = CONFIDENCE, seed: int = 0
) -> dict[int, dict[int, tuple[float, float, float]]]:
    """{concurrency: {k: (t_k / t_0, lo, hi)}} of a server cost profile's measured ks (k ≥ 1): the ratio of the
    mean steps and its percentile bootstrap interval over the passes (resampled as the predictions resample them)."""
    rng = np.random.default_rng(seed)
    tail = (1 - confidence) / 2 * 100
    out: dict[int, dict[int, tuple[float, float, float]]] = {}
    for concurrency, passes in sorted(_profile(profile).items()):
        boot = _resampled_means(passes, samples, rng)
        base = float(passes[0].mean())
        out[concurrency] = {}
        for k in sorted(passes):
            if k == 0:
                continue
            lo, hi = np.percentile(boot[k] / boot[0], [tail, 100 - tail])
            out[concurrency][k] = (float(passes[k].mean()) / base, float(lo), float(hi))
    return out


def server_schedule(predictions: Iterable[Prediction]) -> dict[int, int]:
    """{concurrency: k}: the k to serve at each concurrency, the shape vLLM's `num_speculative_tokens_per_batch_size`
    is built from (storage/analysis/schedule.py's `ranges` turns such a per-batch-size choice into its [start, end, k]
    entries). The rule: where some k's interval lies wholly above 1.0 (lo > 1: predicted measurably faster than the
    target alone), the k with the highest predicted speedup (the smallest k on a tie); where none does, 0: do not
    speculate (the prediction cannot tell a gain from a loss, or speculation is predicted to lose)."""
    by_concurrency: dict[int, list[Prediction]] = {}
    for p in predictions:
        by_concurrency.setdefault(p.concurrency, []).append(p)
    schedule: dict[int, int] = {}
    for concurrency in sorted(by_concurrency):
        options = by_concurrency[concurrency]
        if not any(p.lo > 1.0 for p in options):
            schedule[concurrency] = 0
            continue
        schedule[concurrency] = max(options, key=lambda p: (p.speedup, -p.k)).k
    return schedule


def _counts(reached: ArrayLike, accepted: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The counts as two (prompts × K) float arrays, checked: same shape, at least one prompt and position, no
    negative count, never more accepted than reached."""
    r = np.asarray(reached, dtype=float)
    a = np.asarray(accepted, dtype=float)
    if r.ndim != 2 or r.shape != a.shape or r.shape[0] < 1 or r.shape[1] < 1:
        raise DraftLabError(
            f"acceptance counts must be prompts × positions, reached and accepted alike (got {r.shape} and {a.shape})"
        )
    if not (np.isfinite(r).all() and np.isfinite(a).all()) or (a < 0).any() or (a > r).any():
        raise DraftLabError("acceptance counts must be finite, not negative, and never more accepted than reached")
    return r, a


def _profile(profile: CostProfile) -> dict[int, dict[int, NDArray[np.float64]]]:
    """The profile as arrays, checked: a concurrency ≥ 1 with k = 0 measured, ks ≥ 0, each k at least one pass, every
    step a positive finite number of seconds."""
    if not profile:
        raise DraftLabError("the server cost profile measures no concurrency")
    out: dict[int, dict[int, NDArray[np.float64]]] = {}
    for concurrency, by_k in profile.items():
        if concurrency < 1:
            raise DraftLabError(f"the server cost profile has concurrency {concurrency}; a concurrency is 1 or more")
        if 0 not in by_k:
            measured = ", ".join(str(k) for k in sorted(by_k)) or "none"
            raise DraftLabError(
                f"the server cost profile at concurrency {concurrency} did not measure k 0 (the target alone), "
                f"only k {measured}: every speedup is over it"
            )
        out[concurrency] = {}
        for k, seconds in by_k.items():
            v = np.asarray(seconds, dtype=float).ravel()
            if k < 0 or v.size == 0 or not np.isfinite(v).all() or (v <= 0).any():
                raise DraftLabError(
                    f"the server cost profile at concurrency {concurrency}, k {k}: a k is 0 or more and needs at "
                    f"least one pass, each a positive number of step seconds"
                )
            out[concurrency][k] = v
    return out


def _bracket(measured: Sequence[int], k: int, concurrency: int) -> tuple[int, int, float]:
    """(the measured k at or below k, the measured k at or above it, the weight of the one above)."""
    profiled = ", ".join(str(m) for m in measured)
    if not measured or k > measured[-1] or k < measured[0]:
        raise DraftLabError(
            f"cannot predict k {k} at concurrency {concurrency}: the server cost profile measured k {profiled} "
            f"there, and a step is interpolated between measured ks, never extrapolated; profile k {k} or above"
        )
    if k in measured:
        return k, k, 0.0
    hi = min(m for m in measured if m > k)
    lo = max(m for m in measured if m < k)
    return lo, hi, (k - lo) / (hi - lo)


def _resampled_means(
    passes: Mapping[int, NDArray[np.float64]], samples: int, rng: np.random.Generator
) -> dict[int, NDArray[np.float64]]:
    """Each k's mean step over `samples` resamples of its passes: pass i of every k drawn together when every k has
    the same number of passes (interleaved passes share the machine's drift), else each k's passes alone."""
    sizes = {v.size for v in passes.values()}
    if len(sizes) == 1:
        (p,) = sizes
        idx = rng.integers(0, p, size=(samples, p))
        return {k: v[idx].mean(1) for k, v in sorted(passes.items())}
    return {k: v[rng.integers(0, v.size, size=(samples, v.size))].mean(1) for k, v in sorted(passes.items())}
