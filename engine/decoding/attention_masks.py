"""Attention masks counted in each row's REAL tokens, for the batched cache (engine/decoding/batched_cache.py), and
the one rule for which models that cache can decode exactly at batch > 1 (`batch_support`).

Why. The batched cache holds B rows in shared columns: left padding and the holes rollback leaves (rejected drafts'
columns) sit between a row's real tokens. transformers builds sliding-window and chunked-attention masks from
COLUMN indices (masking_utils: `kv_idx > q_idx - window`, `kv_idx // chunk == q_idx // chunk`), so with a hole
inside the window a row would attend to fewer real tokens than when decoded alone. Full attention is unaffected
(causal + padding in columns selects the same real keys), so full-attention models keep transformers' own masks.

How. A real token's position is the number of real tokens before it in its row (a cumsum of the cache's
[B, C] real-token mask, the same count that gives `position_ids`). Query q may attend key c of its row iff c is
real, pos[c] <= pos[q] and, for a sliding layer, pos[c] > pos[q] - window (for a chunked one, pos[c] // chunk ==
pos[q] // chunk): transformers' rule with positions for columns, so a row sees exactly the keys it sees alone.
The masks go to the model as a 4-D mask (every layer the same kind) or a dict {layer type: 4-D mask} (mixed
layers, e.g. Gemma's alternating sliding/full), both of which transformers 5 models pass through unchanged. The
cost: one [B, W, C] boolean per layer kind per forward, built only when a cache of several rows has windowed
layers (benchmarks/bench_sliding_batch.py measures it against compacting the holes away every round).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from engine.decoding.torch_types import Model

WINDOWED = ("sliding_attention", "chunked_attention")
MASKABLE = ("sdpa", "eager")  # attention implementations that read a 4-D per-token mask


def _text_config(config: Any) -> Any:
    return config.get_text_config(decoder=True)


def layer_types(config: Any) -> list[str]:
    """Each decoder layer's attention kind; configs without `layer_types` (Mistral) put every layer in its
    window when `sliding_window` is set, as their forward does."""
    text = _text_config(config)
    types = getattr(text, "layer_types", None)
    if types:
        return list(types)
    kind = "sliding_attention" if getattr(text, "sliding_window", None) else "full_attention"
    return [kind] * int(getattr(text, "num_hidden_layers", 0) or 0)


def layer_windows(config: Any) -> dict[str, tuple[str, int | None]] | None:
    """{layer type: (rule, size)} for every layer type the model has, or None when no layer is windowed (full
    attention: transformers' own column masks are exact and nothing is built)."""
    types = set(layer_types(config))
    if not types & set(WINDOWED):
        return None
    text = _text_config(config)
    rules: dict[str, tuple[str, int | None]] = {
        "full_attention": ("full", 0),
        "sliding_attention": ("sliding", getattr(text, "sliding_window", None)),
        "chunked_attention": ("chunked", getattr(text, "attention_chunk_size", None)),
    }
    return {t: rules[t] for t in types}


def _name(model: Model) -> str:
    return str(model.config.name_or_path or model.config.model_type)


def _uses_alibi(config: Any) -> bool:
    text = _text_config(config)
    attn = getattr(text, "attn_config", None)
    attn_alibi = attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", False)
    return (
        text.model_type == "bloom"
        or bool(getattr(text, "alibi", False))
        or bool(attn_alibi)
        or getattr(text, "position_embedding_type", None) == "alibi"
    )


# ALiBi that transformers builds from the attention mask's running count of real tokens (build_alibi_tensor):
# that count is each row's own position, so holes and padding change nothing (measured exact at batch 8 with
# holes, tests/test_engine_batched_sliding.py). Any other ALiBi (MPT's) is counted in cache columns.
ALIBI_FROM_MASK = ("bloom", "falcon")


def _takes_mask_dict(model: Model) -> bool:
    """Whether the decoder's forward takes a prepared {layer type: mask} dict (transformers 5 models with mixed
    layer types check `isinstance(attention_mask, dict)` before building their own)."""
    for module in (model, *model.children()):  # the decoder is the CausalLM's direct child (`model.model`)
        try:
            source = inspect.getsource(type(module).forward)
        except (OSError, TypeError):
            continue
        if "attention_mask, dict)" in source:
            return True
    return False


def batch_support(model: Model) -> str | None:
    """None when the batched cache decodes `model` exactly at batch > 1 (every row as it decodes alone), else the
    one-line reason and what to do."""
    config = model.config
    text = _text_config(config)
    why = None
    from_mask = text.model_type in ALIBI_FROM_MASK
    if _uses_alibi(config) and not from_mask:
        why = "uses ALiBi attention biases counted in cache columns, not in each row's own tokens"
    elif "position_ids" not in inspect.signature(model.forward).parameters and not from_mask:
        why = "takes no position_ids, so each row cannot be given its own token positions"
    elif getattr(text, "attn_temperature_tuning", False) and 0 in (getattr(text, "no_rope_layers", None) or []):
        why = (
            "scales its no-RoPE layers' attention by the cache column (attn_temperature_tuning), not by each "
            "row's own token position"
        )
    elif (windows := layer_windows(config)) is not None:
        impl = config._attn_implementation
        if impl not in MASKABLE:
            why = (
                f"has sliding-window/chunked layers and attention implementation {impl!r}, which takes no "
                f"per-token mask to count each row's window in its own tokens (load it with sdpa or eager)"
            )
        elif len(windows) > 1 and not _takes_mask_dict(model):
            why = (
                "mixes windowed and full attention layers but its forward takes no per-layer-type mask, so "
                "each row's window cannot be counted in its own tokens"
            )
        elif any(not size for rule, size in windows.values() if rule != "full"):
            why = "has windowed layers whose config gives no window size (sliding_window / attention_chunk_size)"
    if why is None:
        return None
    return f"{_name(model)} {why}; run it at batch size 1"


class PositionMasks:
    """The per-forward masks of one windowed model (built once per BatchCache from `layer_windows`)."""

    def __init__(self, model: Model, windows: dict[str, tuple[str, int | None]]) -> None:
        self.windows = windows
        self.eager = model.config._attn_implementation == "eager"
        self.dtype = next(model.parameters()).dtype
        self.as_dict = len(windows) > 1

    def __call__(self, real: torch.Tensor, width: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """The attention_mask for a forward whose cache (old columns + the `width` new ones) has real-token
        mask `real` [B, C]: a 4-D [B, 1, width, C] mask, or a dict of them by layer type."""
        pos = real.long().cumsum(1) - 1  # a real column's position in its row
        q = pos[:, -width:, None]
        k = pos[:, None, :]
        causal = real[:, None, :] & (k <= q)
        # A hole fed as a query (padding, a row drafting fewer tokens) may have no real key before it: it also
        # attends to itself, so no query row is fully masked (softmax over nothing, NaN in sdpa). Its output is
        # never read, and as a key it is masked for every real query.
        columns = torch.arange(real.shape[1], device=real.device)
        causal = causal | (columns[None, :] == columns[-width:, None])[None]
        masks = {}
        for layer_type, (rule, size) in self.windows.items():
            if rule == "sliding":
                allowed = causal & (k > q - size)
            elif rule == "chunked":
                allowed = causal & (k.div(size, rounding_mode="floor") == q.div(size, rounding_mode="floor"))
            else:
                allowed = causal
            masks[layer_type] = self._format(allowed[:, None])
        return masks if self.as_dict else next(iter(masks.values()))

    def _format(self, allowed: torch.Tensor) -> torch.Tensor:
        return model_mask(allowed, self.eager, self.dtype)


def model_mask(allowed: torch.Tensor, eager: bool, dtype: torch.dtype) -> torch.Tensor:
    """A boolean 4-D mask (True = attend) as the model reads it: sdpa takes it as it is; eager adds it to its
    scores."""
    if not eager:
        return allowed
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def tree_support(model: Model) -> str | None:
    """None when a forward can take a token tree's mask (every node attends to the committed prefix and its own
    ancestors: engine/decoding/token_trees.py), else the one-line reason and what to do."""
    impl = model.config._attn_implementation
    if impl not in MASKABLE:
        why = f"uses attention implementation {impl!r}, which takes no per-token mask (load it with sdpa or eager)"
    elif layer_windows(model.config) is not None:
        why = "has sliding-window/chunked layers, whose windows a token tree's mask does not count yet"
    elif (batch := batch_support(model)) is not None:
        return batch.replace("; run it at batch size 1", "; token trees need per-token positions: use --tree-topk 1")
    else:
        return None
    return f"{_name(model)} {why}; use --tree-topk 1 (a chain)"
