"""Building the decoders of a run (engine/decoding/speculative.py, engine/decoding/baseline.py: one loop each, B prompts
at a time, a single prompt the one-row case) and running them over a list of prompts, following SPEC's timing protocol:
tokenization outside the clock, one untimed warm-up generation first, wall time of generation per prompt."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from engine.config.drafter_specs import DEFAULT_DRAFTER
from engine.decoding.baseline import TargetOnlyDecoder
from engine.decoding.drafting import make_drafter
from engine.decoding.records import PromptResult
from engine.decoding.sampling import SamplingConfig
from engine.decoding.speculative import SpeculativeDecoder
from engine.errors import DraftLabError
from engine.models.cached_model import max_positions
from engine.models.loading import ModelPair
from engine.text.token_types import TokenTyper

WARMUP_TOKENS = 16


def eos_ids(pair: ModelPair) -> set[int]:
    """Token ids that end generation: the target's generation config, else its tokenizer's EOS."""
    eos = getattr(pair.target.model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = pair.tokenizer.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


def encode_prompts(pair: ModelPair, prompts: list[str], max_new_tokens: int) -> list[torch.Tensor]:
    """Token ids [1, n] per prompt on the pair's device; errors name the prompt that cannot run."""
    limit = context_limit(pair)
    encoded = []
    for i, prompt in enumerate(prompts):
        ids = pair.tokenizer(prompt, return_tensors="pt").input_ids
        if ids.shape[1] == 0:
            raise DraftLabError(f"prompt {i} encodes to no tokens; remove empty prompts from the prompt set")
        if limit and ids.shape[1] + max_new_tokens > limit:
            raise DraftLabError(
                f"prompt {i} has {ids.shape[1]} tokens; with max-new-tokens {max_new_tokens} it exceeds the models' "
                f"{limit} positions; shorten the prompt or lower --max-new-tokens"
            )
        encoded.append(ids.to(pair.device))
    return encoded


def context_limit(pair: ModelPair) -> int | None:
    """The smaller of the models' position limits (None if no config states one); a pair loaded without a draft
    model (for a drafter that needs none) has the target's."""
    models = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    return min(filter(None, (max_positions(m.model.config) for m in models)), default=None)


def check_k(pair: ModelPair, k: int) -> None:
    """Refuse a k no round can use: even a one-token prompt plus k drafts must fit the models' positions."""
    if k <= 0:
        raise DraftLabError(f"k must be a positive integer (got {k}); use e.g. --k 4 or --k 1,2,4,8")
    limit = context_limit(pair)
    if limit and k >= limit:
        raise DraftLabError(
            f"k {k} cannot fit the models' {limit} positions (a round holds the prompt plus k drafts); "
            f"use a k below {limit}, e.g. --k 4 or --k 1,2,4,8"
        )


def baseline_decoder(pair: ModelPair, cfg: SamplingConfig) -> TargetOnlyDecoder:
    return TargetOnlyDecoder(pair.target.model, pair.vocab_size, cfg, pair.tokenizer, eos_ids(pair))


def speculative_decoder(
    pair: ModelPair, cfg: SamplingConfig, k: int, typer: TokenTyper | None = None, drafter: str = DEFAULT_DRAFTER
) -> SpeculativeDecoder:
    """A decoder drafting with the strategy `drafter` names (engine/config/drafter_specs.py,
    engine/decoding/drafting.py) and k (the most drafts a round proposes; the starting k for heuristic). The pair may
    lack a draft model when the drafter needs none (engine.config.drafter_specs.needs_draft_model)."""
    check_k(pair, k)
    eos = eos_ids(pair)
    strategy = make_drafter(
        drafter,
        draft_model=pair.draft.model if pair.draft is not None else None,
        vocab_size=pair.vocab_size,
        k=k,
        cfg=cfg,
        eos_ids=eos,
    )
    return SpeculativeDecoder(
        pair.target.model, strategy, pair.vocab_size, cfg, typer or TokenTyper(pair.tokenizer), eos
    )


def run_prompts(
    decoder: TargetOnlyDecoder | SpeculativeDecoder,
    prompts: list[str],
    prompt_ids: list[torch.Tensor],
    start: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> Iterator[PromptResult]:
    """Yield one PromptResult per prompt from index `start` on, after one untimed warm-up generation.

    on_progress(prompt_index, new tokens so far) runs between rounds/tokens; raising there cancels the run.
    """
    if start >= len(prompts):
        return
    decoder.generate(
        prompts[start], prompt_ids[start], start, max_new_tokens=min(WARMUP_TOKENS, decoder.cfg.max_new_tokens)
    )
    for i in range(start, len(prompts)):
        step = None if on_progress is None else (lambda n, i=i: on_progress(i, n))
        yield decoder.generate(prompts[i], prompt_ids[i], i, on_progress=step)


def run_batches(
    decoder: TargetOnlyDecoder | SpeculativeDecoder,
    prompts: list[str],
    prompt_ids: list[torch.Tensor],
    batch_size: int,
    warmup_tokens: int = WARMUP_TOKENS,
) -> Iterator[list[PromptResult]]:
    """Yield one list of PromptResults per batch of `batch_size` consecutive prompts (the last batch may be
    smaller: it holds what is left), after one untimed warm-up batch of the first prompts."""
    if not prompts:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise DraftLabError(f"batch size must be a positive integer (got {batch_size!r}); use e.g. 1, 4 or 16")
    first = min(batch_size, len(prompts))
    decoder.generate_batch(
        prompts[:first],
        prompt_ids[:first],
        list(range(first)),
        max_new_tokens=min(warmup_tokens, decoder.cfg.max_new_tokens),
    )
    for s in range(0, len(prompts), batch_size):
        e = min(s + batch_size, len(prompts))
        yield decoder.generate_batch(prompts[s:e], prompt_ids[s:e], list(range(s, e)))
