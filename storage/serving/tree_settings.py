"""How each serving engine takes a token-tree run (SPEC "Token trees": k = the depth, tree_topk, tree_tokens), for
the engines' tabs (storage/serving/engines/).

    SGLang        --speculative-num-steps k --speculative-eagle-topk tree_topk --speculative-num-draft-tokens N,
                  N the nodes verified with the root (tree_tokens, or the whole tree: 1 + topk + (k - 1) topk²,
                  engine/config/tree_shape.py). SGLang's EAGLE worker (STANDALONE runs it too) drafts the same dynamic
                  tree per round, EAGLE-2's.
    vLLM          Not expressible. vLLM 0.32 (vllm/config/speculative.py, the build `draftlab confirm` serves) has no
                  token-tree key and refuses unknown ones; the releases that had one took `speculative_token_tree`
                  for EAGLE methods only: a static tree, a list of tuples of child indices fixed at startup, while
                  the lab's is chosen per round. The tab serves the depth-k chain.
    llama.cpp,    Not expressible: one chain per round (--draft-max; num_assistant_tokens).
    transformers

Checked: sgl-project/sglang docs/advanced_features/speculative_decoding.md (the three flags, EAGLE-2's tree; with
topk 1 num-draft-tokens is forced to num-steps + 1, the root counted); vllm 0.32.0 vllm/config/speculative.py (no
tree field; @config forbids extra keys).
"""

from __future__ import annotations

from typing import Any

from engine.config.tree_shape import is_tree, verified_nodes

SGLANG_TOPK, SGLANG_TOKENS = "--speculative-eagle-topk", "--speculative-num-draft-tokens"

_CHAIN_INSTEAD = (
    "these settings serve the chain of depth k={k} (the tree's top-1 path), whose acceptance is the lab's "
    "tree_topk 1 run at k={k}, not this run's: measure that run for what {engine} serves."
)
_NO_TREE = {
    "vllm": "Not expressible: vLLM 0.32 drafts chains only (vllm/config/speculative.py has no token-tree key and "
    "refuses unknown ones). Older vLLM releases took speculative_token_tree for EAGLE methods only: a static tree "
    "(a list of tuples of child indices) fixed at startup, where the lab's tree, as SGLang's, is chosen per round "
    "from the draft's scores; " + _CHAIN_INSTEAD,
    "llama_cpp": "Not expressible: llama.cpp drafts one chain per round (--draft-max), no token tree; "
    + _CHAIN_INSTEAD,
    "transformers": "Not expressible: transformers' assisted generation drafts one chain per round "
    "(num_assistant_tokens), no token tree; " + _CHAIN_INSTEAD,
}
ENGINE_NAMES = {"vllm": "vLLM", "llama_cpp": "llama.cpp", "transformers": "transformers"}


def tree_nodes(cfg: dict[str, Any]) -> int | None:
    """The nodes a tree run verifies per round, the root included; None for a chain."""
    if not is_tree(cfg):
        return None
    return verified_nodes(int(cfg["k"]), int(cfg["tree_topk"]), int(cfg.get("tree_tokens") or 0))


def sglang_tree(cfg: dict[str, Any], flags: list[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], list[str]]:
    """SGLang's (flag, value) pairs for the run with its tree's topk and verified nodes in place of the chain's, and
    the note saying so; a chain's (or a drafting without those flags) as they are, no note."""
    nodes = tree_nodes(cfg)
    names = [flag for flag, _ in flags]
    if nodes is None or SGLANG_TOPK not in names or SGLANG_TOKENS not in names:
        return flags, []
    topk, k = int(cfg["tree_topk"]), int(cfg["k"])
    shaped = [
        (flag, topk if flag == SGLANG_TOPK else nodes if flag == SGLANG_TOKENS else value) for flag, value in flags
    ]
    whole = "every node the expansion makes" if not cfg.get("tree_tokens") else f"the best {nodes - 1} nodes"
    return shaped, [
        f"Token tree: SGLang drafts EAGLE-2's dynamic tree as DraftLab measured it, chosen per round: the {topk} "
        f"best children of each frontier node over k={k} steps, then {whole} by cumulative draft probability, "
        f"verified with the root (--speculative-num-draft-tokens {nodes} counts the root)."
    ]


def no_tree_note(cfg: dict[str, Any], engine: str) -> list[str]:
    """For an engine that drafts chains only: what it cannot express of a tree run (nothing for a chain)."""
    if tree_nodes(cfg) is None:
        return []
    return [_NO_TREE[engine].format(k=cfg["k"], engine=ENGINE_NAMES[engine])]


def confirm_refusal(document: dict[str, Any], what: str = "confirm") -> str | None:
    """Why vLLM cannot `what` (`draftlab confirm`, or a server cost profile's prediction) a deploy document's run,
    one line with the fix: it drafts a token tree, which vLLM would serve as the depth-k chain (so the server's
    acceptance would not be this run's); None for a chain. `document`: {"configuration": engine_settings'
    configuration, "run_id"}."""
    cfg = document.get("configuration") or {}
    if tree_nodes(cfg) is None:
        return None
    return (
        f"run {document.get('run_id')} drafts a token tree (tree_topk {int(cfg['tree_topk'])}), which vLLM cannot "
        f"serve (it drafts chains): {what} the chain at k={cfg['k']} (a --tree-topk 1 run), or serve the tree with "
        f"SGLang (`draftlab export --format deploy`)"
    )
