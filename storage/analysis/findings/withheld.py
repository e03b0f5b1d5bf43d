"""A confirm measurement whose speedup is withheld (storage/records/confirms.py's `withheld`), one of the `confirm`
rule's findings (confirm.py calls it per measurement).

It fires as an error where sampled outputs differ from the server's own target-only ones (the server's speculation
changed the output distribution; VLLM_CPU_SAMPLING_CAUSE names a cause), else as a warning where the speedup exceeds
the server's tokens per step (the timing, not a result)."""

from __future__ import annotations

import json
from typing import Any

from storage.analysis.findings.base import _cap, _finding

# Why a sampled server's outputs can differ with speculation, read in vLLM 0.32.0's CPU build and reproduced by calling
# its expand_batch_to_tokens (docs/metrics.md, "Confirm in a serving engine").
VLLM_CPU_SAMPLING_CAUSE = (
    "A cause in vLLM 0.32's CPU build: vllm/utils/cpu_triton_utils.py's _expand_kernel_impl writes into an int64 "
    "copy of its output (_ensure_int64), so the rejection sampler's expand_batch_to_tokens returns uninitialised "
    "memory for the float32 temperatures and apply_sampling_constraints divides the verified logits by it; greedy "
    "requests return before that, so greedy outputs stay equal."
)


def _withheld(r: Any, where: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Rule: a measurement whose speedup is withheld (storage/records/confirms.py's `withheld`): sampled outputs that
    differ from the server's own target-only ones (an error: the server's speculation changed the output distribution),
    or a speedup above the server's tokens per step (a warning: the timing, not a result). Greedy outputs that differ
    are the "changes the outputs" error already."""
    warning = r.speedup_warning if isinstance(r.speedup_warning, str) else None
    test = json.loads(r.outputs_test) if isinstance(r.outputs_test, str) else None
    if test is not None and test.get("differs"):
        return [
            _finding(
                "confirm",
                "error",
                f"In vLLM, {where}: speculation changed the output distribution in this server",
                f"{_cap(warning or 'no speedup is shown')} (sampled with the experiment's settings, against the same "
                f"server's target-only answers to the same prompts; {test['tests']}, family-wise α {test['alpha']:g}). "
                f"{VLLM_CPU_SAMPLING_CAUSE}",
                "confirm",
                "Serve without speculation under sampling in this server until it is fixed (greedy requests are not "
                "affected), or confirm in another build or engine.",
                None,
                {**data, "outputs_test": test},
            )
        ]
    if (
        warning is None
        or r.outputs_match_server_baseline == r.outputs_match_server_baseline
        and r.outputs_match_server_baseline is not None
        and r.outputs_match_server_baseline < 1
    ):
        return []
    return [
        _finding(
            "confirm",
            "warning",
            f"In vLLM, {where} has no speedup to show",
            _cap(warning) + ".",
            "confirm",
            "Confirm again with more passes (--repeats) on a quieter machine.",
            None,
            {**data, "speedup_warning": warning},
        )
    ]
