"""Token trees drafted by a draft model: the dynamic tree EAGLE-2 and SGLang draft (SGLang's
`--speculative-num-steps` = k, `--speculative-eagle-topk` = SamplingConfig.tree_topk, `--speculative-num-draft-tokens`
= SamplingConfig.tree_tokens, root included), for B rows at once; the target verifies it in
engine/decoding/tree_verification.py.

Shape. Step 0 feeds what each row's draft cache lacks and ranks the root's children: the draft's top `topk` tokens
of its processed distribution. Each further step s feeds the `topk` frontier nodes (depth s) in one forward, each
attending to the committed prefix and its own ancestors (a tree mask: BatchCache.forward's `attend`) at position
L + s - 1 (L = the row's committed length, depth d sits at L + d - 1), and every frontier node gets its top `topk`
children; the next frontier is the `topk` best of those topk^2 children by cumulative draft log-probability. After k
steps the tree keeps the `tree_tokens - 1` best candidates overall by that score (every candidate when tree_tokens is
0). Ties go to the earlier candidate; a child never scores above its parent (log p <= 0) and is created after it, so
the kept set always holds every kept node's ancestors. Children are the draft's top-k tokens (deterministic), so
verification treats each as a point mass. Rows drafting fewer steps (their token budget) keep fewer candidates: rows
are ragged, padded to the widest.

Cost. k draft forwards (step 0 over the pending tokens, then `topk` columns per step: `Round.draft_forwards` counts
steps, as for a chain). After drafting, the draft's cache rolls back to the committed prefix (the tree's columns
become holes, trimmed with the round); the next round feeds the accepted path again with the pending tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.decoding.batched_cache import BatchCache, to_device
from engine.decoding.sampling import SamplingConfig, probabilities


@dataclass
class DraftTree:
    """A round's token trees for B rows, on the device, node i of row r in creation order (a parent before its
    children), padded to N nodes (`valid`)."""

    tokens: torch.Tensor  # [B, N] token ids (0 on padding)
    parents: torch.Tensor  # [B, N] the parent's node index, -1 for the root's children (and padding)
    depths: torch.Tensor  # [B, N] 1-based depth (0 on padding)
    ranks: torch.Tensor  # [B, N] rank among its siblings in the draft's distribution (0 = the draft's top-1)
    valid: torch.Tensor  # [B, N] real nodes
    ancestors: torch.Tensor  # [B, N, N] node j is node i or one of its ancestors
    children: torch.Tensor  # [B, N + 1, topk] node index of each rank's child (-1: none); entry 0 is the root
    steps: list[int]  # depth each row drafted (its k this round)
    nodes: list[int]  # real nodes per row
    topk: int


@dataclass
class DraftedTree:
    """What `draft_tree` hands the drafter: the tree, each node's draft distribution at its parent (the processed
    one its rank came from, [B, N, V]; the raw logits too, or None) and the batched draft forwards it took."""

    tree: DraftTree
    probs: torch.Tensor
    raw: torch.Tensor
    forwards: int


# One tree step's draft forward: (tokens [B, topk], valid [B, topk], attend, positions, parent_slots [B, topk])
# -> logits [B, topk, V]; parent_slots[r, j] is the column, among the previous step's fed nodes (the root's at step 1:
# 0), of node j's parent (an EAGLE-3 head feeds each node with its parent's own output state).
TreeStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def draft_tree(
    lm: BatchCache,
    logits: torch.Tensor,
    steps: list[int],
    topk: int,
    tree_tokens: int,
    cfg: SamplingConfig,
    step: TreeStep,
) -> DraftedTree | None:
    """Draft each row's tree (module docstring) after the round's first draft forward gave the root's logits [B, V]
    (the draft's cache then holds each row's committed prefix); steps[r] is row r's depth (0: no tree), `step` one
    further forward. The draft's cache is rolled back to the prefix. None when no row drafts."""
    batch, device, depth = len(steps), lm.device, max(steps, default=0)
    if depth == 0:
        return None
    topk = min(topk, lm.vocab_size)
    prefix = lm.lengths.clone()  # real tokens before the tree: depth d sits at position prefix + d - 1
    base = lm.width  # the prefix's columns; the tree's start after them
    p = probabilities(logits, cfg)
    dists, raws = [p[:, None]], [logits[:, None]]
    top = p.topk(topk, -1)
    ranks = torch.arange(topk, device=device)
    tokens, scores = [top.indices], [top.values.log()]
    parents, child_ranks = [torch.full((batch, topk), -1, device=device)], [ranks.expand(batch, -1)]
    sources = [torch.zeros(batch, topk, dtype=torch.long, device=device)]  # index of the parent's distribution
    depth_of = [1] * topk
    frontier = ranks.expand(batch, -1)  # candidate index of each node the next step expands
    chains = torch.zeros(batch, topk, 0, dtype=torch.long, device=device)  # their ancestors' cache columns
    parent_slots = torch.zeros(batch, topk, dtype=torch.long, device=device)
    for s in range(1, depth):
        going = to_device([s < st for st in steps], device, torch.bool)
        feed = torch.cat(tokens, 1).gather(1, frontier)
        columns = lm.width + ranks  # where this step's nodes land in the cache
        attend = torch.zeros(batch, topk, lm.width + topk, dtype=torch.bool, device=device)
        attend[:, :, :base] = lm.mask[:, None, :base]
        attend.scatter_(2, torch.cat([chains, columns[None, :, None].expand(batch, -1, 1)], 2), True)
        positions = (prefix + s - 1)[:, None].expand(-1, topk)
        logits = step(feed, going[:, None].expand(-1, topk), attend, positions, parent_slots)
        p = probabilities(logits, cfg)
        dists.append(p)
        raws.append(logits)
        top = p.topk(topk, -1)  # [B, frontier node, child rank]
        child_scores = (torch.cat(scores, 1).gather(1, frontier)[:, :, None] + top.values.log()).reshape(batch, -1)
        tokens.append(top.indices.reshape(batch, -1))
        scores.append(child_scores)
        parents.append(frontier.repeat_interleave(topk, 1))
        child_ranks.append(ranks.repeat(topk).expand(batch, -1))
        sources.append((1 + (s - 1) * topk + ranks).repeat_interleave(topk).expand(batch, -1))
        depth_of += [s + 1] * topk * topk
        best = torch.sort(child_scores, dim=1, descending=True, stable=True).indices[:, :topk]
        parent_slots = best // topk
        grown = torch.cat([chains, columns[None, :, None].expand(batch, -1, 1)], 2)  # a child's: its parent's + it
        chains = grown.gather(1, parent_slots[:, :, None].expand(-1, -1, grown.shape[2]))
        frontier = len(depth_of) - topk * topk + best
    lm.rollback(prefix)  # the tree's columns become holes: the cache keeps the committed prefix
    counts = [topk + (st - 1) * topk * topk if st else 0 for st in steps]
    nodes = [min(tree_tokens - 1, c) if tree_tokens else c for c in counts]
    tree = _keep_best(
        torch.cat(tokens, 1),
        torch.cat(scores, 1),
        torch.cat(parents, 1),
        torch.cat(child_ranks, 1),
        to_device(depth_of, device),
        steps,
        nodes,
        topk,
    )
    src = torch.cat(sources, 1).gather(1, tree.index)
    pick = src[..., None].expand(-1, -1, p.shape[-1])
    probs = torch.cat(dists, 1).gather(1, pick).masked_fill(~tree.tree.valid[..., None], 0.0)
    raw = torch.cat(raws, 1).gather(1, pick)
    return DraftedTree(tree.tree, probs, raw, depth)


@dataclass
class _Kept:
    tree: DraftTree
    index: torch.Tensor  # [B, N] the candidate index of each kept node


def _keep_best(
    tokens: torch.Tensor,
    scores: torch.Tensor,
    parents: torch.Tensor,
    ranks: torch.Tensor,
    depths: torch.Tensor,
    steps: list[int],
    nodes: list[int],
    topk: int,
) -> _Kept:
    """The nodes[r] best candidates of row r (candidates [B, G]; ties to the earlier, real ones first), in creation
    order, as a DraftTree."""
    batch, count = tokens.shape
    device = tokens.device
    width = max(nodes)
    real = depths[None, :] <= to_device(steps, device)[:, None]
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    order = order.gather(1, torch.sort((~real).gather(1, order).to(torch.int8), dim=1, stable=True).indices)
    slots = torch.arange(width, device=device)
    chosen = torch.where(slots[None, :] < to_device(nodes, device)[:, None], order[:, :width], count)
    chosen = chosen.sort(1).values  # creation order; padding (count) last
    valid = chosen < count
    index = chosen.clamp(max=count - 1)
    where = torch.full((batch, count + 1), -1, dtype=torch.long, device=device)
    where.scatter_(1, chosen, slots.expand(batch, -1).clone())
    parent_of = parents.gather(1, index)
    node_parents = torch.where(valid & (parent_of >= 0), where.gather(1, parent_of.clamp(min=0)), -1)
    ancestors = ancestor_mask(node_parents, valid, max(steps))
    node_ranks = torch.where(valid, ranks.gather(1, index), 0)
    children = torch.full((batch, (width + 1) * topk + 1), -1, dtype=torch.long, device=device)
    flat = torch.where(valid, (node_parents + 1) * topk + node_ranks, (width + 1) * topk)
    children.scatter_(1, flat, torch.where(valid, slots, -1))
    tree = DraftTree(
        tokens=torch.where(valid, tokens.gather(1, index), 0),
        parents=node_parents,
        depths=torch.where(valid, depths[index], 0),
        ranks=node_ranks,
        valid=valid,
        ancestors=ancestors,
        children=children[:, :-1].view(batch, width + 1, topk),
        steps=list(steps),
        nodes=list(nodes),
        topk=topk,
    )
    return _Kept(tree, index)


def ancestor_mask(parents: torch.Tensor, valid: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, N, N]: node j is node i or one of its ancestors (what node i attends to among the tree's nodes), for
    parents [B, N] (-1: a child of the root) of trees at most `depth` deep."""
    width = parents.shape[1]
    ancestors = torch.eye(width, dtype=torch.bool, device=parents.device).expand(parents.shape[0], -1, -1)
    ancestors = ancestors & valid[:, :, None]
    current = parents
    for _ in range(depth):
        has = current >= 0
        ancestors = ancestors | (torch.nn.functional.one_hot(current.clamp(min=0), width).bool() & has[..., None])
        current = torch.where(has, parents.gather(1, current.clamp(min=0)), -1)
    return ancestors
