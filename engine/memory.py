"""Per-run memory figures that do not depend on what else the process did: the weights an arm uses plus the
peak bytes its KV caches held (decoders' `peak_cache_bytes()`). Both come from tensor metadata: no device sync.

A run's figure = Σ model_bytes(model the arm uses) + decoder.peak_cache_bytes(). Activations (a forward's
attention scores, logits) and allocator slack are not included; during a cache update one layer briefly holds
its old and new tensors, so the allocator's true peak can exceed the cache figure by about one layer's share.
"""
from __future__ import annotations

import itertools

import torch


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


def cache_bytes(cache) -> int:
    """Bytes of the tensors a transformers cache holds now (keys, values and any other per-layer state)."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total
