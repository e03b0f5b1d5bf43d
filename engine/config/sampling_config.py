"""A run's sampling settings as the engine takes them: temperature, top-k, top-p, the seed, the token budget and
how the draft proposes. Plain Python, no torch (engine/config/run_config.py builds one; engine/decoding/sampling.py
applies it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.config.drafter_specs import DRAFT_SAMPLING
from engine.config.variables import DEFAULT_VERIFY, MIN_TEMPERATURE, VERIFY_RULES
from engine.errors import DraftLabError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    max_new_tokens: int = 128
    # How a draft model proposes (engine/decoding/drafting.py): "probabilistic" draws each draft from p_d; "greedy"
    # proposes p_d's argmax and verification treats it as a point mass (still lossless), as vLLM's V1 drafter long did.
    draft_sampling: str = "probabilistic"
    # The temperature a draft model proposes at (engine/decoding/drafting.py): 0 = the target's. Verification uses the
    # distribution the draft sampled from, so any value is lossless; only acceptance changes.
    draft_temperature: float = 0.0
    # How the target verifies the drafts (engine/decoding/verification.py): "standard" token by token, or "block"
    # (engine/decoding/block_verification.py). Both lossless; block accepts at least as many in expectation.
    verify: str = DEFAULT_VERIFY
    # Token trees (engine/decoding/token_trees.py): branches per node (1 = a chain, SGLang's --speculative-eagle-topk;
    # not the sampling top_k) and tree nodes verified per round, root included (SGLang's
    # --speculative-num-draft-tokens; 0 = every node the expansion makes).
    tree_topk: int = 1
    tree_tokens: int = 0

    def __post_init__(self) -> None:
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise DraftLabError(
                f"draft sampling must be one of {', '.join(DRAFT_SAMPLING)} (got {str(self.draft_sampling)[:40]!r})"
            )
        if self.verify not in VERIFY_RULES:
            raise DraftLabError(f"verify must be one of {', '.join(VERIFY_RULES)} (got {str(self.verify)[:40]!r})")
        if self.temperature < 0:
            raise DraftLabError(f"temperature must be >= 0 (got {self.temperature}); use 0 for greedy decoding")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise DraftLabError(
                f"temperature {self.temperature:g} is too small to compute with (a value above 0 must "
                f"be at least {MIN_TEMPERATURE:g}); use 0 for greedy decoding"
            )
        if self.draft_temperature < 0 or 0 < self.draft_temperature < MIN_TEMPERATURE:
            raise DraftLabError(
                f"draft temperature {self.draft_temperature:g} is not 0 (the target's) or at least "
                f"{MIN_TEMPERATURE:g}; use e.g. 0.5"
            )
        if self.top_k < 0:
            raise DraftLabError(f"top-k must be >= 0 (got {self.top_k}); use 0 to disable it")
        if not 0 < self.top_p <= 1:
            raise DraftLabError(f"top-p must be in (0, 1] (got {self.top_p}); use 1.0 to disable it")
        if self.tree_topk < 1:
            raise DraftLabError(f"tree topk must be >= 1 (got {self.tree_topk}); use 1 for a chain")
        if self.tree_tokens < 0 or self.tree_tokens == 1:
            raise DraftLabError(f"tree tokens must be 0 or >= 2 (got {self.tree_tokens}); use 0 for the whole tree")
        if self.max_new_tokens <= 0:
            raise DraftLabError(f"max-new-tokens must be > 0 (got {self.max_new_tokens})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_draft(self) -> SamplingConfig:
        """The settings a draft model proposes under: these, at the draft temperature when one is set."""
        return replace(self, temperature=self.draft_temperature) if self.draft_temperature else self
