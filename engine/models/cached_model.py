"""What the decoders' KV cache (engine/decoding/batched_cache.py) needs from a model: its context length and a cache
whose every layer keeps its full history, so a rollback can land anywhere (`rollback_cache`); a model whose cache cannot
roll back is refused here, before any run starts.
"""

from __future__ import annotations

from transformers import DynamicCache, cache_utils

from engine.errors import DraftLabError


def _classes(*names: str) -> tuple:
    return tuple(getattr(cache_utils, name) for name in names if hasattr(cache_utils, name))


# Linear-attention / SSM / conv layers update one state in place instead of storing a row per token:
# a rollback cannot rewind them.
_RECURRENT = _classes("LinearAttentionCacheLayerMixin")
_CROPPABLE = _classes("DynamicLayer", "DummyLayer")


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
                f"speculative round needs; use a target and draft built from attention layers only"
            )
        if isinstance(layer, cache_utils.DynamicSlidingWindowLayer):
            cache.layers[i] = cache_utils.DynamicLayer()
    return cache
