"""How each serving engine takes a run's verification rule (SPEC "Verification rule": `--verify standard|block`), for
the engines' tabs (storage/serving/engines/). A standard run needs nothing anywhere (every engine verifies token by
token); a block run:

    vLLM          speculative_config "rejection_sample_method": "block" (vllm 0.32 vllm/config/speculative.py:
                  RejectionSampleMethod = Literal["standard", "synthetic", "block"], default "standard"; the rule is
                  vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py's, the one the lab runs,
                  engine/decoding/block_verification.py).
    SGLang        Not expressible: its verification knobs are --speculative-use-rejection-sampling (the standard
                  rule) and --speculative-accept-threshold-single / -acc (thresholds that trade losslessness for
                  acceptance); no block rule (python/sglang/srt/server_args.py).
    llama.cpp     Not expressible: the target samples and compares each draft token in turn
                  (common_sampler_sample_and_accept_n); --draft-p-min only stops drafting early.
    transformers  Not expressible: assisted generation verifies with _speculative_sampling (Leviathan et al.'s
                  algorithm 1, token by token; transformers 5 generation/utils.py), no block rule.

What an engine that cannot express it serves is the standard rule on the same drafts, which the block run measured
too: its accepted_standard (the run JSON's key, the detail page's per-position chart).
"""

from __future__ import annotations

from typing import Any

BLOCK = "block"
_STANDARD_INSTEAD = (
    "these settings verify with the standard rule (token by token), lossless too but accepting fewer drafts in "
    "expectation: what it accepts on these drafts is this run's accepted_standard, and the lab's verify=standard "
    "run measures its speed."
)
_NO_BLOCK = {
    "sglang": "Not expressible: SGLang has no block verification (its --speculative-use-rejection-sampling is the "
    "standard rule; --speculative-accept-threshold-single / -acc are lossy thresholds); " + _STANDARD_INSTEAD,
    "llama_cpp": "Not expressible: llama.cpp verifies each draft token in turn (--draft-p-min only stops drafting "
    "early), no block verification; " + _STANDARD_INSTEAD,
    "transformers": "Not expressible: transformers' assisted generation verifies token by token "
    "(_speculative_sampling, Leviathan et al.'s algorithm 1), no block verification; " + _STANDARD_INSTEAD,
}


def is_block(cfg: dict[str, Any]) -> bool:
    return str(cfg.get("verify") or "").strip() == BLOCK


def vllm_verify(cfg: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The speculative_config keys and notes of a block run for vLLM (nothing for a standard run)."""
    if not is_block(cfg):
        return {}, []
    note = (
        'rejection_sample_method "block": vLLM verifies the drafts as a block (Sun et al. 2024), the rule DraftLab '
        "measured (--verify block); the key is recent (vLLM 0.32): an older vLLM refuses it, and without it vLLM "
        "verifies token by token (this run's accepted_standard)."
    )
    if cfg.get("greedy"):
        note += " At temperature 0 both rules accept the target's argmax alike."
    return {"rejection_sample_method": BLOCK}, [note]


def no_block_note(cfg: dict[str, Any], engine: str) -> list[str]:
    """For an engine that verifies token by token only: what it cannot express of a block run (nothing else)."""
    return [_NO_BLOCK[engine]] if is_block(cfg) else []
