"""A token tree's shape as a run asks for it, and the one check that the shape fits the rest of the run.

SGLang's three knobs, DraftLab's names (../shared/SPEC.md "Token trees"):

    k            --speculative-num-steps         the tree's depth (draft steps per round)
    tree_topk    --speculative-eagle-topk        branches per node (1 = a chain); not the sampling top-k
    tree_tokens  --speculative-num-draft-tokens  tree nodes verified per round, the root (the last verified token)
                                                 included; 0 = every node the expansion makes

The expansion (EAGLE-2's, as SGLang shapes it) keeps topk children of the root, then at each further depth the
topk best children of each of the topk kept nodes: topk + (k - 1) * topk² candidate nodes, of which the best
tree_tokens - 1 are verified. A chain (topk 1) verifies its k drafts and the root whatever tree_tokens says.

    full_tree_nodes(k=3, topk=2) -> 11  (the root, 2, then 4 and 4)

Plain Python, no torch: storage and pages import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_TREE_TOPK = 16  # branches per node: SGLang's EAGLE topk tops out at single digits in its own tuning grid
# Nodes verified per round: k up to 64 (variables.MAX_K) times 16 branches; a verify forward over more than a
# thousand positions costs more than any draft saves.
MAX_TREE_TOKENS = 1024


def full_tree_nodes(k: int, topk: int) -> int:
    """The nodes the expansion makes for depth k and topk branches, the root included (tree_tokens 0 verifies all)."""
    k, topk = int(k), int(topk)
    return 1 + k if topk <= 1 else 1 + topk + max(k - 1, 0) * topk * topk


def verified_nodes(k: int, topk: int, tree_tokens: int) -> int:
    """The nodes a round verifies, the root included: a chain's k + 1, else tree_tokens (0: the whole tree)."""
    full = full_tree_nodes(k, topk)
    return full if int(topk) <= 1 or not tree_tokens else min(int(tree_tokens), full)


def is_tree(settings: Mapping[str, Any]) -> bool:
    """Whether a run's settings (a mapping, or a runs row's getter) draft a tree (tree_topk above 1)."""
    topk = settings.get("tree_topk")
    return topk is not None and topk == topk and int(topk) > 1
