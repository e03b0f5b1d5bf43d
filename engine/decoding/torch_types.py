"""What the decoder's annotations call the things mypy reads as Any (pyproject's [tool.mypy] does not follow torch
or transformers: their types cost minutes per run and change with each release), and torch.inference_mode as a
decorator that keeps the function's signature for the type checker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

Model = Any  # a transformers causal LM, or an EAGLE-3 head (engine/models/eagle3.py): a torch.nn.Module
Tokenizer = Any  # a transformers tokenizer
Mark = Any  # a point in the device's work queue (engine/decoding/clock.py): a CUDA event or a perf_counter reading

_Function = TypeVar("_Function", bound=Callable[..., Any])


def inference_mode(function: _Function) -> _Function:
    """torch.inference_mode() around `function` (no autograd records), its signature kept."""
    return cast(_Function, torch.inference_mode()(function))
