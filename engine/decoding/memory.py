"""Per-run memory figures that do not depend on what else the process did: the weights an arm uses plus the
peak bytes its KV caches held (decoders' `peak_cache_bytes()`). Both come from tensor metadata: no device sync.

A run's figure = Σ model_bytes(model the arm uses) + decoder.peak_cache_bytes(). Activations (a forward's
attention scores, logits) and allocator slack are not included; during a cache update one layer briefly holds
its old and new tensors, so the allocator's true peak can exceed the cache figure by about one layer's share.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch

from engine.decoding.torch_types import Model


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each tensor once (tied weights count once); tensors on the
    meta device (offloaded, not resident) count zero."""
    seen, total = set(), 0
    for t in itertools.chain(model.parameters(), model.buffers()):
        key = (t.device, t.data_ptr(), t.numel(), t.dtype)
        if t.device.type == "meta" or key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def cache_bytes(cache: Any) -> int:
    """Bytes of the tensors a transformers cache holds now (keys, values and any other per-layer state)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes one token's keys and values take in the model's KV cache, from its config: 2 (K and V) x layers x
    KV heads x head size x the element size of its weights. 0 when the config does not say (an unknown layout)."""
    config: Any = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    try:
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return 0
    element = next(model.parameters()).element_size()
    return 2 * layers * kv_heads * head_dim * int(element)


def available_bytes(device: torch.device) -> int:
    """Memory a batch's KV caches can still take: the CUDA device's free memory, else the host's available RAM
    (/proc/meminfo's MemAvailable; the physical pages when that cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def batch_kv_bytes(models: Iterable[Model], batch_size: int, prompt_tokens: int, max_new_tokens: int, k: int) -> int:
    """The KV-cache bytes a batch needs at its longest: every model's bytes per token x (longest prompt + new
    tokens + k drafts in flight) x B rows. A lower bound: rejected drafts leave holes a cache compacts only past
    2x its longest row (engine/decoding/batched_cache.py), and activations are not counted."""
    per_token = sum(kv_bytes_per_token(m) for m in models)
    return per_token * (int(prompt_tokens) + int(max_new_tokens) + int(k)) * int(batch_size)


def check_batch_fits(
    models: Iterable[Model], device: torch.device, batch_size: int, prompt_tokens: int, max_new_tokens: int, k: int
) -> None:
    """Refuse a batch whose KV caches cannot fit in what the device has free (a DraftLabError naming the fix),
    before it runs."""
    from engine.errors import DraftLabError

    need, free = batch_kv_bytes(models, batch_size, prompt_tokens, max_new_tokens, k), available_bytes(device)
    if need > free:
        raise DraftLabError(
            f"batch size {batch_size} needs about {need / 2**20:.0f} MiB of KV cache ({prompt_tokens} prompt + "
            f"{max_new_tokens} new + {k} draft tokens per row) but {device.type} has {free / 2**20:.0f} MiB free; "
            f"use a smaller --batch-size, fewer --max-new-tokens, shorter prompts or a bigger device"
        )
