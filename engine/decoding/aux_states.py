"""A target's aux hidden states, captured from a forward that runs anyway by pre-hooks on the decoder layers read.

An EAGLE-3 head reads a few of the target's hidden states (vLLM's convention: id i = the input of decoder layer i =
transformers' `hidden_states[i]`). `output_hidden_states=True` keeps every layer's: L + 1 tensors of
[B, T, hidden], to use three. At a long prefill on a large target that is gigabytes held at once (a 70B-class
target, 80 layers of 8,192 floats: 4,096 prompt tokens in bf16 hold 5.4 GB of them); a forward pre-hook on each
layer read keeps only those, as vLLM does (its model records the aux layers' inputs in the forward).

    with AuxStates(model, [2, 6, 9]) as aux:
        out = model(input_ids=ids)
    states = aux.states()            # [B, T, 3 x hidden], ids in the order given

A model whose decoder layers cannot be found (or ids outside them: transformers' hidden_states[L] is after the
final norm, no layer's input) is read through output_hidden_states instead: `aux.kwargs` says which.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The model's decoder layers (`.layers` of its decoder, base model or `.model`, as long as the text config's
    num_hidden_layers), or None."""
    config: Any = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    count = getattr(text, "num_hidden_layers", None)
    candidates = [getattr(model, "model", None), getattr(model, "base_model", None)]
    try:
        candidates.insert(0, model.get_decoder())
    except Exception:  # noqa: BLE001 - no separate decoder: the other candidates
        pass
    for decoder in candidates:
        layers = getattr(decoder, "layers", None)
        if isinstance(layers, nn.ModuleList) and count is not None and len(layers) == count:
            return layers
    return None


class AuxStates:
    """Capture `hidden_states[i]` for i in `ids` during the forwards inside the `with` (the last forward's)."""

    def __init__(self, model: nn.Module, ids: list[int]) -> None:
        self.model, self.ids = model, list(ids)
        layers = decoder_layers(model)
        self.layers = layers if layers is not None and all(0 <= i < len(layers) for i in self.ids) else None
        self._captured: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []  # torch's RemovableHandle of each hook

    @property
    def hooked(self) -> bool:
        return self.layers is not None

    @property
    def kwargs(self) -> dict[str, bool]:
        """What the forward needs besides: nothing when hooked; output_hidden_states otherwise."""
        return {} if self.hooked else {"output_hidden_states": True}

    def __enter__(self) -> AuxStates:
        if self.layers is not None:
            for i in sorted(set(self.ids)):
                self._handles.append(self.layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, i: int) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._captured[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def states(self, out: Any = None) -> torch.Tensor:
        """[B, T, len(ids) x hidden]: the captured inputs, or `out.hidden_states` when not hooked."""
        if self.hooked:
            return torch.cat([self._captured[i] for i in self.ids], -1)
        return torch.cat([out.hidden_states[i] for i in self.ids], -1)
