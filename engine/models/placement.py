"""Where a target/draft pair goes when the target may not fit one GPU: its weight bytes from its config alone (no
weights loaded), and the fewest of the visible GPUs that hold the pair, with the `max_memory` budget accelerate's
`device_map="auto"` gets for the target.

The draft sits on the first GPU (where the inputs and the target's embedding are; accelerate's top-level hook
returns the target's logits there), so the first GPU's budget for the target is what the draft leaves.
HEADROOM of each GPU's free memory is kept out of every budget for the KV caches, the activations and the CUDA
context; the plan is an estimate, not a guarantee (a too-tight GPU still fails with CUDA out of memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import DraftLabError
from engine.wording import noun, plural

HEADROOM = 0.2  # fraction of each GPU's free memory left for KV caches, activations and the CUDA context


@dataclass(frozen=True)
class Placement:
    gpus: int  # how many GPUs, the first ones in index order
    max_memory: dict[int, int] | None  # the target's budget per GPU index for from_pretrained; None: one GPU


def weight_bytes(source: str, dtype: torch.dtype, trust_remote_code: bool = False) -> int:
    """Bytes of a model's weights in `dtype`, from its config alone: the model is built on the meta device (no
    memory, no download but config.json), its parameters counted once each (tied weights once)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize


def free_gpu_memory() -> list[int]:
    """Free bytes on each GPU torch sees (none without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]


def plan(
    target_bytes: int,
    draft_bytes: int,
    free: list[int],
    target: str = "the target",
    dtype: torch.dtype = torch.bfloat16,
    headroom: float = HEADROOM,
) -> Placement:
    """The fewest GPUs (the first ones of `free`, bytes free per GPU) that hold the target and, on the first GPU,
    the draft: Placement(1, None) when both fit on the first; else Placement(n, max_memory) with the target's
    budget per GPU. A pair that fits no prefix of `free` is a DraftLabError naming the sizes and the fixes."""
    usable = [int(f * (1 - headroom)) for f in free]
    need = target_bytes + draft_bytes
    if usable and need <= usable[0]:
        return Placement(1, None)
    for n in range(2, len(usable) + 1):
        if need <= sum(usable[:n]) and draft_bytes < usable[0]:
            return Placement(n, budget(free[:n], draft_bytes, headroom))
    have = (
        f"the {plural(len(free), 'visible GPU')} {noun(len(free), 'has', 'have')} {' + '.join(_gb(f) for f in free)} "
        "free"
        if free
        else "torch sees no GPU"
    )
    dtype_fix = " or --dtype bfloat16" if dtype.itemsize > 2 else ""
    draft = f" (+ {_gb(draft_bytes)} for the draft)" if draft_bytes else ""
    raise DraftLabError(
        f"{target} needs ~{_gb(target_bytes)} in {str(dtype).removeprefix('torch.')}{draft} but {have}, "
        f"{headroom:.0%} kept for the KV cache; give the worker more GPUs (plain `draftlab worker` sees them all, "
        f"or a group: `draftlab worker --devices cuda:0+cuda:1`){dtype_fix}"
    )


def budget(free: list[int], draft_bytes: int, headroom: float = HEADROOM) -> dict[int, int]:
    """The target's `max_memory` over these GPUs: each GPU's free bytes less the headroom, less the draft on the
    first."""
    usable = [int(f * (1 - headroom)) for f in free]
    return {i: u - (draft_bytes if i == 0 else 0) for i, u in enumerate(usable)}


def model_devices(*models: torch.nn.Module) -> tuple[torch.device, ...]:
    """The devices the models' parameters live on, in index order (several for a model dispatched by accelerate)."""
    found = {p.device for model in models for p in model.parameters()}
    return tuple(sorted(found, key=lambda d: (d.type, -1 if d.index is None else d.index)))


def _gb(n: int) -> str:
    return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"
