"""A causal LM plus its KV cache: feed tokens, get next-token logits, roll the cache back.

The speculative loop and the baseline both decode through this, so prefix recomputation never happens:
after a rejection the cache is cropped to the accepted prefix. Every layer keeps its full history so a crop
can land anywhere (see `rollback_cache`).
"""
from __future__ import annotations

import inspect
import sys

import torch
from transformers import DynamicCache, cache_utils

from .errors import DraftLabError
from .memory import cache_bytes


def _classes(*names: str) -> tuple:
    return tuple(getattr(cache_utils, name) for name in names if hasattr(cache_utils, name))


# Linear-attention / SSM / conv layers update one state in place instead of storing a row per token:
# a rollback cannot rewind them.
_RECURRENT = _classes("LinearAttentionCacheLayerMixin")
_CROPPABLE = _classes("DynamicLayer", "DummyLayer")


class CachedModel:
    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size  # logits are cut to the tokenizer's vocabulary (embeddings may be padded)
        params = inspect.signature(model.forward).parameters
        # transformers renamed `past_key_values` to `cache`; support both spellings.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._can_keep = "logits_to_keep" in params
        self.device = next(model.parameters()).device
        self.max_positions = max_positions(model.config) or sys.maxsize
        self.cache = rollback_cache(model)  # refuses an unsupported model before any run starts
        self.length = 0  # tokens currently held in the cache
        # Every layer holds every token (rollback_cache), so the cache's size is length x a constant: the peak
        # is tracked as a length, with no per-forward walk over the layers.
        self.peak_length = 0
        self._token_bytes = None

    def reset(self) -> None:
        self.cache = rollback_cache(self.model)
        self.length = 0

    def prefill(self, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Start a new sequence: an empty cache filled with the prompt; next-token logits [V]."""
        self.reset()
        return self.forward(prompt_ids, keep=1)[0]

    def forward(self, input_ids: torch.Tensor, keep: int | None = None) -> torch.Tensor:
        """Logits [n, V] for the n tokens of input_ids [1, n], or for the last `keep` of them."""
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if keep and self._can_keep:
            kwargs["logits_to_keep"] = keep  # skip the output head on prompt positions nobody reads
        logits = self.model(input_ids=input_ids, **kwargs).logits[0, :, : self.vocab_size]
        self.length += input_ids.shape[1]
        if self.length > self.peak_length:
            self.peak_length = self.length
            if self._token_bytes is None:
                self._token_bytes = cache_bytes(self.cache) // self.length
        return logits[-keep:] if keep else logits

    @property
    def peak_cache_bytes(self) -> int:
        """Most bytes the KV cache held since the last `reset_peak` (tensor sizes, no device sync)."""
        return self.peak_length * (self._token_bytes or 0)

    def reset_peak(self) -> None:
        self.peak_length = 0

    def rollback(self, length: int) -> None:
        """Forget every cached token from index `length` on."""
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative count: remove that many (all 4.x/5.x caches)
            self.length = length


def max_positions(config) -> int | None:
    """The model's context length (position embeddings), None if its config does not say."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def rollback_cache(model) -> DynamicCache:
    """An empty DynamicCache for `model` whose every layer can be cropped to any earlier length.

    transformers gives sliding-window and chunked-attention layers a DynamicSlidingWindowLayer, which drops keys
    older than the window: a rollback past the window cannot bring them back. Those layers get a full-history
    DynamicLayer instead. The model still attends only within its window: the mask is built from the config
    (sliding_window / attention_chunk_size), not from what the cache holds; the price is memory for old keys.
    """
    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, _RECURRENT) or not isinstance(layer, _CROPPABLE):
            types = getattr(model.config.get_text_config(decoder=True), "layer_types", None) or []
            kind = types[i] if i < len(types) else type(layer).__name__
            name = model.config.name_or_path or model.config.model_type
            raise DraftLabError(
                f"{name} has {kind} layers whose cache cannot be rolled back to an earlier token, which every "
                f"speculative round needs; use a target and draft built from attention layers only")
        if isinstance(layer, cache_utils.DynamicSlidingWindowLayer):
            cache.layers[i] = cache_utils.DynamicLayer()
    return cache
