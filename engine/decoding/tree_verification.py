"""Verifying a token tree (engine/decoding/token_trees.py) for B rows at once, and what a verified tree round
records.

One target forward per round scores [each row's pending tokens, every tree node] (`tree_forward`): a pending token
attends causally as in a chain round, a node attends to the committed prefix and its own ancestors (not its siblings
or cousins) at position L + depth - 1, so each node's logits are the target's next-token distribution after the path
to it. Rows are ragged (different node counts): the padding attends to itself only and is never read.

The rule (`verify_tree`), from the root down:
  - greedy: descend while the target's argmax at the current node is one of its children; the next token is the
    argmax where the walk stops (at a leaf, the bonus);
  - sampled: recursive rejection sampling with point-mass drafts (each child is the draft's deterministic top-k
    token), SpecInfer's multi-draft rule for deterministic candidates. At the current node, with p the target's
    distribution there, try its children in rank order: accept child x with probability p(x) / sum(p); on rejection
    remove x from p (p(x) = 0: normalize(max(0, p - onehot(x)))) and try the next child against what is left. Each
    try is one speculative-sampling step against a point mass, whose output follows the p it started from, so by
    induction the node's token follows the target's distribution. An accepted child continues with the target's
    distribution at it; when every child is rejected the correction is drawn from the residual; at a leaf the bonus
    from p.
Row r draws steps_r x topk uniforms (one per (depth, rank) slot, used or not) and then its correction / bonus from
generators[r], so a row never depends on the rows beside it: a batched row equals that prompt decoded alone.

Records. A tree round's draft_tokens are the path verification walked, one row per depth (position = depth): the
accepted nodes (with their sibling_rank and how many siblings were verified), then the top-ranked child of the last
accepted node as rejected (if it has children) and the top-1 chain below it as discarded. Round.k is the depth
drafted, Round.tree_nodes the nodes verified.

Cache. After the round the target's cache keeps the committed prefix and the accepted path's columns (`keep_path`:
the other nodes' columns become holes, so a one-row cache takes masked forwards until its next compaction); the
draft's cache keeps the committed prefix, and the next round's first draft forward feeds it the accepted path with
the next token (a + 1 columns, where a chain round feeds one or two). An EAGLE-3 head gets the target's states at
the pending tokens and the path's nodes (`path_states`), as after a chain round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from engine.decoding.batched_cache import BatchCache
from engine.decoding.records import Round
from engine.decoding.sampling import SamplingConfig, sample_rows
from engine.decoding.token_trees import DraftTree
from engine.decoding.verification import STATS, VerifiedRow, draft_stats, round_record
from engine.text.token_types import CodeContext, TokenTyper


class TreeVerdict(NamedTuple):
    """What verification decided for B rows, on the device."""

    accepted: torch.Tensor  # [B] nodes accepted along the path
    next_tokens: torch.Tensor  # [B] the correction where the walk stopped, or the bonus at a leaf
    path: torch.Tensor  # [B, S] node index accepted at each depth (-1 past the path)
    path_tokens: torch.Tensor  # [B, S] their tokens (0 past the path)


@dataclass(frozen=True)
class TreeRow:
    """One row's verified tree round on the host: the walked path as a VerifiedRow (its `drafted` are the path's
    tokens, one per depth) and what the tree adds per depth."""

    row: VerifiedRow
    sibling_ranks: list[int]  # of each path node
    siblings: list[int]  # children verified under its parent
    nodes: int  # nodes verified this round
    depth: int  # depth drafted

    @property
    def accepted(self) -> int:
        return self.row.accepted


class TreeRound(NamedTuple):
    """A verified tree round of B rows on the host (as VerifiedRound for a chain): each row's TreeRow and the
    caches' trailing hole counts read with it."""

    rows: list[TreeRow]
    target_holes: int | None
    drafter_holes: int | None


def tree_forward(
    target: BatchCache,
    pending: torch.Tensor,
    pending_valid: torch.Tensor,
    tree: DraftTree,
    hidden_layers: list[int] | None = None,
) -> Any:
    """The target's logits [B, N + 1, V] of one forward over [pending (left-padded, P), tree nodes (N)]: entry 0
    scores the root's children (after the last pending token), entry i + 1 node i's children. With hidden_layers,
    (logits, states [B, P + N, D]) as BatchCache.forward returns them."""
    batch, width = pending.shape
    count = tree.tokens.shape[1]
    cached = target.width
    new = width + count
    attend = torch.zeros(batch, new, cached + new, dtype=torch.bool, device=pending.device)
    attend[:, :, :cached] = target.mask[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool, device=pending.device).tril()
    attend[:, :width, cached : cached + width] = causal[None] & pending_valid[:, None, :]
    attend[:, width:, cached : cached + width] = pending_valid[:, None, :]
    attend[:, width:, cached + width :] = tree.ancestors & tree.valid[:, None, :]
    columns = torch.arange(new, device=pending.device)
    attend[:, columns, cached + columns] = True  # every query sees itself (padding too: no empty softmax)
    before = target.lengths[:, None]
    pending_positions = (before + pending_valid.long().cumsum(1) - 1).clamp(min=0)
    node_positions = before + pending_valid.sum(1, keepdim=True) + (tree.depths - 1).clamp(min=0)
    return target.forward(
        torch.cat([pending, tree.tokens], 1),
        torch.cat([pending_valid, tree.valid], 1),
        keep=count + 1,
        hidden_layers=hidden_layers,
        attend=attend,
        positions=torch.cat([pending_positions, node_positions], 1),
    )


def keep_path(target: BatchCache, tree: DraftTree, path: torch.Tensor) -> None:
    """After the round, the target's cache keeps the committed prefix and the accepted path (its nodes' columns
    already hold keys at their own positions); every other node's column becomes a hole."""
    count = tree.tokens.shape[1]
    on_path = (torch.nn.functional.one_hot(path.clamp(min=0), count).bool() & (path >= 0)[..., None]).any(1)
    off = torch.zeros_like(target.mask)
    off[:, target.width - count :] = tree.valid & ~on_path
    target.forget(off)


def path_states(states: torch.Tensor, pending_width: int, path: torch.Tensor) -> torch.Tensor:
    """The target's states [B, P + S, D] at the pending tokens, then at the path's nodes in depth order (from the
    tree forward's [B, P + N, D]): the layout TargetStates reads the committed positions from."""
    nodes = states[:, pending_width:].gather(1, path.clamp(min=0)[..., None].expand(-1, -1, states.shape[-1]))
    return torch.cat([states[:, :pending_width], nodes], 1)


def verify_tree(
    tree: DraftTree, p_target: torch.Tensor, cfg: SamplingConfig, generators: list[torch.Generator]
) -> TreeVerdict:
    """The rule of the module docstring for B rows: p_target [B, N + 1, V] as `tree_forward` orders it."""
    batch = p_target.shape[0]
    device = p_target.device
    depth, topk = max(tree.steps, default=0), tree.topk
    rows = torch.arange(batch, device=device)
    current = torch.full((batch,), -1, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, depth), -1, dtype=torch.long, device=device)
    if not cfg.greedy:
        draws = [torch.rand(s * topk, generator=g, device=device) for s, g in zip(tree.steps, generators)]
        u = torch.stack(
            [torch.nn.functional.pad(d, (0, (depth - s) * topk), value=1.0) for d, s in zip(draws, tree.steps)]
        )
        u = u.view(batch, depth, topk)
    p = p_target[:, 0].clone()
    for d in range(depth):
        kids = tree.children[rows, current + 1]  # [B, topk] by rank
        kid_tokens = tree.tokens.gather(1, kids.clamp(min=0))
        moved = torch.zeros(batch, dtype=torch.bool, device=device)
        step = current.clone()
        if cfg.greedy:
            match = greedy_match(kids, kid_tokens, p) & ~done[:, None]
            moved = match.any(1)
            step = torch.where(moved, kids.gather(1, match.long().argmax(1, keepdim=True))[:, 0], current)
        else:
            for j in range(topk):
                live = (kids[:, j] >= 0) & ~done & ~moved
                x = kid_tokens[:, j : j + 1]
                px = p.gather(1, x)[:, 0]
                accept = live & (u[:, d, j] * p.sum(-1) < px)
                p = without_rejected(p, x, live & ~accept)
                moved = moved | accept
                step = torch.where(accept, kids[:, j], step)
        path[:, d] = torch.where(moved, step, -1)
        current = step
        p = torch.where(moved[:, None], p_target[rows, current + 1], p)
        done = done | ~moved
    accepted = (path >= 0).long().sum(1)
    if cfg.greedy:
        next_tokens = p.argmax(-1)
    else:
        p = torch.where(p.sum(-1, keepdim=True) > 0, p, p_target[rows, current + 1])  # rounding left no mass
        next_tokens = sample_rows(p, cfg, generators)
    path_tokens = torch.where(path >= 0, tree.tokens.gather(1, path.clamp(min=0)), 0)
    return TreeVerdict(accepted, next_tokens, path, path_tokens)


def greedy_match(kids: torch.Tensor, kid_tokens: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[B, topk]: which children (kids [B, topk], -1: none) are the target's argmax of p [B, V]."""
    return (kids >= 0) & (kid_tokens == p.argmax(-1, keepdim=True))


def without_rejected(p: torch.Tensor, x: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """The residual after a point-mass draft x [B, 1] was rejected in the rows `rejected` [B]:
    normalize(max(0, p - onehot(x))) is p with x removed (unnormalized: sampling and the next test divide by the
    sum)."""
    return p.scatter(1, x, torch.where(rejected[:, None], 0.0, p.gather(1, x)))


def tree_rows_to_host(
    tree: DraftTree,
    draft_probs: torch.Tensor,
    draft_logits: torch.Tensor | None,
    p_target: torch.Tensor,
    target_logits: torch.Tensor,
    verdict: TreeVerdict,
    target_holes: torch.Tensor | None = None,
    drafter_holes: torch.Tensor | None = None,
) -> TreeRound:
    """What a tree round records for B rows, computed on the device and moved to the host in ONE transfer, with
    the caches' 0-d trailing hole counts (None: not read): each row's TreeRow (module docstring, Records)."""
    batch, count = tree.tokens.shape
    rows = torch.arange(batch, device=tree.tokens.device)[:, None]
    at_parent = tree.parents + 1  # each node is scored by its parent's entry
    stats = torch.stack(
        draft_stats(tree.tokens, draft_probs, draft_logits, p_target[rows, at_parent], target_logits[rows, at_parent])
    )
    holes = [h.reshape(1) for h in (target_holes, drafter_holes) if h is not None]
    ints = [verdict.accepted, verdict.next_tokens, verdict.path, tree.tokens, tree.parents, tree.ranks]
    flat = torch.cat([torch.cat([t.reshape(-1) for t in ints] + holes).double(), stats.reshape(-1).double()]).tolist()
    depth = verdict.path.shape[1]
    cuts = [batch, batch, batch * depth, batch * count, batch * count, batch * count, len(holes)]
    parts, at = [], 0
    for n in cuts:
        parts.append(flat[at : at + n])
        at += n
    stat = flat[at:]
    accepted, nexts, paths, tokens, parents, ranks, read = parts
    out = []
    for r in range(batch):
        n, a = tree.nodes[r], int(accepted[r])
        node = slice(r * count, r * count + n)
        row_parents, row_ranks = [int(v) for v in parents[node]], [int(v) for v in ranks[node]]
        kids: dict[int, list[int]] = {}
        for i in sorted(range(n), key=lambda i: row_ranks[i]):
            kids.setdefault(row_parents[i], []).append(i)
        walked = [int(v) for v in paths[r * depth : r * depth + a]]
        below = kids.get(walked[-1] if walked else -1, [])
        while below:  # the top-ranked child of the last accepted node, then the top-1 chain under it
            walked.append(below[0])
            below = kids.get(below[0], [])

        def column(i: int, nodes: list[int] = walked, base: int = r * count) -> list[float]:
            return [stat[i * batch * count + base + j] for j in nodes]

        out.append(
            TreeRow(
                VerifiedRow(
                    accepted=a,
                    next_token=int(nexts[r]),
                    drafted=[int(tokens[r * count + j]) for j in walked],
                    accepted_standard=None,  # the standard rule's round: trees verify with their own rule
                    **{name: column(i) for i, name in enumerate(STATS)},
                ),
                sibling_ranks=[row_ranks[j] for j in walked],
                siblings=[len(kids[row_parents[j]]) for j in walked],
                nodes=n,
                depth=tree.steps[r],
            )
        )
    tail = iter(int(v) for v in read)
    target_read, drafter_read = (None if h is None else next(tail) for h in (target_holes, drafter_holes))
    return TreeRound(out, target_read, drafter_read)


def record_round(
    typer: TokenTyper,
    eos_ids: set[int],
    prompt_index: int,
    round_index: int,
    row: VerifiedRow | TreeRow,
    budget: int,
    draft_s: float,
    verify_s: float,
    forwards: int,
    context: CodeContext | None = None,
) -> Round:
    """The Round a verified row settles into: a chain row's round_record; a tree row's is round_record's over the
    walked path, each draft token with its sibling rank and siblings, k the depth drafted and tree_nodes the nodes
    verified."""
    path = row if isinstance(row, VerifiedRow) else row.row
    round_ = round_record(typer, eos_ids, prompt_index, round_index, path, budget, draft_s, verify_s, forwards, context)
    if isinstance(row, VerifiedRow):
        return round_
    round_.draft_tokens = [
        replace(t, sibling_rank=rank, siblings=siblings)
        for t, rank, siblings in zip(round_.draft_tokens, row.sibling_ranks, row.siblings)
    ]
    round_.k, round_.tree_nodes = row.depth, row.nodes
    return round_
