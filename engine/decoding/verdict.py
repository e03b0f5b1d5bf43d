"""What a verification rule decides for the B rows of a round, on the device (engine/decoding/verification.py: the
standard rule and the dispatch; engine/decoding/block_verification.py: block verification)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Verdict(NamedTuple):
    """What verification decided for B rows, on the device (no host sync yet)."""

    accepted: torch.Tensor  # [B] drafts each row accepted (the standard rule: in order until its first rejection)
    next_tokens: torch.Tensor  # [B] each row's correction (at its first rejection) or bonus (after its last draft)
    # [B] what the standard rule would have accepted on the same drafts with the same uniforms: block verification
    # only (None under the standard rule)
    accepted_standard: torch.Tensor | None = None
