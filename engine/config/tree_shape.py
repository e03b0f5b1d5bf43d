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
    check_tree({"k": 4, "tree_topk": 2, "tree_tokens": 4, "drafter": "model"}) -> DraftLabError (5 at least)

Plain Python, no torch: storage and pages import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.config.drafter_specs import drafter_spec, example_specs
from engine.errors import DraftLabError

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


def check_tree(settings: Mapping[str, Any], form: bool = False) -> None:
    """Refuse, in one line naming the fix, a tree the rest of one run's settings cannot draft: a drafter that cannot
    branch (its declaration's `branches`), or tree_tokens that cannot hold a path of depth k (below k + 1). With
    `form` the New-experiment form's field names, else the CLI's flags."""
    tokens = int(settings.get("tree_tokens") or 0)
    said_topk, said_tokens = (
        ("tree branches per node", "tree nodes verified per round") if form else ("--tree-topk", "--tree-tokens")
    )
    if tokens == 1:
        raise DraftLabError(
            f"{said_tokens} 1 verifies the root alone, no draft; use {said_tokens} 0 (the whole tree) or 2 or more"
        )
    if not is_tree(settings):
        return
    topk, k = int(settings["tree_topk"]), int(settings["k"])
    drafter = str(settings.get("drafter") or "model")
    if not drafter_spec(drafter).branches:
        can = ", ".join(example_specs(branches=True))
        raise DraftLabError(
            f"drafter {drafter!r} drafts one chain and cannot branch ({said_topk} {topk}); use {said_topk} 1, "
            f"or a drafter that branches: {can}"
        )
    if tokens and tokens < k + 1:
        raise DraftLabError(
            f"{said_tokens} {tokens} cannot hold a path of depth k={k} (it needs k + 1 = {k + 1}, the root "
            f"included); use {said_tokens} {k + 1} or more, 0 for the whole tree, or a smaller k"
        )
