"""The `tree` rule: each finished token-tree run against the chain at the same k, which one gained, in speedup with
the verdict's 95 % intervals (each run's paired bootstrap over prompts) and in tokens per round (what the tree's extra
branches buy), and the verify nodes the tree paid for it.

It fires (info) per tree run with a chain partner: a tree that gains is served (a --tree-tokens sweep finds the
smallest that keeps it); a chain that gains, or a tie, keeps the chain.

A run's partner is the finished chain run (tree_topk 1) of the same experiment with every other run parameter equal
(engine/config/run_config.py's RUN_PARAMETERS but the tree's two): in a tree_topk sweep, the topk-1 run at the same k;
in a grid, at the same batch size. Plain pandas over the runs query's rows, no SQL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from engine.config.run_config import RUN_PARAMETERS
from engine.config.tree_shape import MAX_TREE_TOKENS, full_tree_nodes, is_tree, verified_nodes
from storage.analysis.findings.base import _Context, _finding

TREE_KEYS = ("tree_topk", "tree_tokens")
_SAME = tuple(name for name in RUN_PARAMETERS if name not in TREE_KEYS)


@dataclass(frozen=True)
class Side:
    run_id: int
    speedup: float
    ci: tuple[float, float] | None
    tokens_per_round: float
    nodes: int  # nodes verified per round, the root included

    def text(self) -> str:
        ci = f" ({self.ci[0]:.2f}–{self.ci[1]:.2f})" if self.ci else " (no interval)"
        return f"{self.speedup:.2f}×{ci}, {self.tokens_per_round:.2f} tokens per round"


@dataclass(frozen=True)
class TreeAgainstChain:
    k: int
    topk: int
    tree_tokens: int
    tree: Side
    chain: Side
    gained: str  # "tree", "chain" or "neither" (intervals overlap, or one is missing)

    @property
    def extra_tokens(self) -> float:
        return self.tree.tokens_per_round - self.chain.tokens_per_round

    def as_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "tree_topk": self.topk,
            "tree_tokens": self.tree_tokens,
            "gained": self.gained,
            **{
                f"{name}_{key}": value
                for name, side in (("tree", self.tree), ("chain", self.chain))
                for key, value in (
                    ("run_id", side.run_id),
                    ("speedup", side.speedup),
                    ("speedup_ci", list(side.ci) if side.ci else None),
                    ("tokens_per_round", side.tokens_per_round),
                    ("nodes", side.nodes),
                )
            },
        }


def _number(value: Any) -> float:
    return float(value) if value is not None and not (isinstance(value, float) and math.isnan(value)) else math.nan


def _whole(value: Any) -> int:
    """A stored whole number, 0 where missing (NULL, NaN)."""
    number = _number(value)
    return 0 if math.isnan(number) else int(number)


def _side(row: pd.Series) -> Side:
    lo, hi = _number(row.get("speedup_ci_lo")), _number(row.get("speedup_ci_hi"))
    topk = int(row["tree_topk"]) if is_tree(row) else 1
    tokens = _whole(row.get("tree_tokens")) if is_tree(row) else 0
    return Side(
        int(row["run_id"]),
        _number(row["speedup"]),
        None if math.isnan(lo) or math.isnan(hi) else (lo, hi),
        _number(row["tokens_per_round"]),
        verified_nodes(int(row["k"]), topk, tokens),
    )


def _same(a: pd.Series, b: pd.Series) -> bool:
    """Every run parameter but the tree's equal (NULL equals NULL: a column an older run lacks)."""
    for name in _SAME:
        x, y = a.get(name), b.get(name)
        missing_x, missing_y = x is None or x != x, y is None or y != y
        if missing_x != missing_y or (not missing_x and x != y):
            return False
    return True


def _gained(tree: Side, chain: Side) -> str:
    if tree.ci is None or chain.ci is None:
        return "neither"
    if tree.ci[0] > chain.ci[1]:
        return "tree"
    if tree.ci[1] < chain.ci[0]:
        return "chain"
    return "neither"


def tree_against_chain(runs: pd.DataFrame) -> list[TreeAgainstChain]:
    """Each finished tree run with a measured speedup beside its chain partner (module doc), in run order; runs
    without a partner are left out."""
    measured = runs[runs["speedup"].notna() & runs["k"].notna()] if len(runs) else runs
    trees = [row for _, row in measured.iterrows() if is_tree(row)]
    chains = [row for _, row in measured.iterrows() if not is_tree(row)]
    found = []
    for tree in trees:
        partner = next((chain for chain in chains if _same(tree, chain)), None)
        if partner is None:
            continue
        t, c = _side(tree), _side(partner)
        found.append(
            TreeAgainstChain(
                int(tree["k"]), int(tree["tree_topk"]), _whole(tree.get("tree_tokens")), t, c, _gained(t, c)
            )
        )
    return found


def _tree(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (token trees): each finished tree run against the chain at the same k with every other setting equal
    (tree_against_chain, above): which gained in speedup (95 % intervals apart, else neither) and what the
    tree's branches bought in tokens per round for the nodes it verified. The chain formula does not model trees:
    tree runs have no formula prediction (storage/records/run_rows.py)."""
    found = []
    for pair in tree_against_chain(ctx.done):
        tree, chain, k = pair.tree, pair.chain, pair.k
        shape = f"tree_topk {pair.topk}, {tree.nodes} nodes verified per round"
        title = (
            f"The token tree ({shape}) beats the chain at k = {k}"
            if pair.gained == "tree"
            else f"The chain beats the token tree ({shape}) at k = {k}"
            if pair.gained == "chain"
            else f"The token tree ({shape}) and the chain at k = {k} are tied"
        )
        detail = (
            f"Tree {tree.text()}; chain {chain.text()}: the branches bought {pair.extra_tokens:+.2f} tokens per "
            f"round for {tree.nodes} verified nodes against the chain's {chain.nodes}"
            + (
                "."
                if pair.gained != "neither"
                else f" and the speedup intervals {'overlap' if tree.ci and chain.ci else 'are not both measured'}."
            )
        )
        if pair.gained == "tree":
            sizes = sorted({0, k + 1, min(2 * (k + 1), full_tree_nodes(k, pair.topk), MAX_TREE_TOKENS)})
            next_ = (
                "Serve the tree (SGLang takes it: see deploy); sweep --tree-tokens for the smallest tree that keeps it."
            )
            prefill = ctx.prefill(
                title,
                sweep="tree_tokens",
                values=",".join(map(str, sizes)),
                k_auto=None,
                k=k,
                tree_topk=pair.topk,
                tree_tokens=None,
            )
        else:
            next_ = (
                "Keep the chain (--tree-topk 1, what every engine serves), or try a smaller tree (--tree-tokens) "
                "whose verify costs less."
            )
            prefill = None
        found.append(_finding("tree", "info", title, detail, "speedup", next_, prefill, pair.as_dict()))
    return found
