"""Suffix trees of bounded depth and the cache of previous responses that suffix decoding drafts from.

This follows arctic-inference's SuffixDecodingCache (the implementation vLLM runs for `method: "suffix"`; its
package builds only against a CUDA torch and vLLM, so it is rewritten here in plain Python, same rules):

- A tree of depth D holds every substring of length <= D of the sequences put in it, each node counting the
  occurrences of the string that leads to it (a trie; arctic compresses paths, which changes memory, not counts).
- `speculate(context, max_tokens)`: for match lengths m = 1, 2, ... up to D - 1 (and the context's length - 1),
  the node of the context's last m tokens, if any (none: longer matches cannot exist, stop); from it a path follows
  the most frequent child (ties: the child seen first) while the path's estimated probability (the product of
  child count / parent count along it) stays >= min_token_prob, for at most min(max_tokens, m x max_spec_factor +
  max_spec_offset) tokens. The score is the sum of the probabilities of the path's tokens; the best score wins, a
  longer match winning ties.
- The cache keeps one tree per active request over its prompt and output so far, and one global tree over earlier
  responses; a draft comes from whichever of the two scores higher (the request's own on a tie).

What DraftLab adds for measurement (a lab repeats and re-decodes prompts, a server does not): responses are cached
by prompt index, one per index (re-decoding a prompt replaces its response), a request never sees its own earlier
response (`start_request` evicts it, so repeats and the warm-up cannot inflate acceptance), and the global tree is
bounded by MAX_CACHED_TOKENS response tokens, evicting the oldest response first (vLLM bounds it by a request count,
suffix_decoding_max_cached_requests). Plain Python, no torch.
"""

from __future__ import annotations

MAX_SPEC_FACTOR = 1.0  # vLLM's suffix_decoding_max_spec_factor
MAX_SPEC_OFFSET = 0.0
MIN_TOKEN_PROB = 0.1  # vLLM's suffix_decoding_min_token_prob
MAX_CACHED_TOKENS = 65_536  # response tokens the global tree holds at most


class Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] = {}


class SuffixTree:
    """Every substring of length <= depth of the sequences added, with occurrence counts."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = Node()

    def start(self) -> list[Node]:
        """The open suffixes of a new sequence (just the root): pass them to `append`."""
        return [self.root]

    def append(self, active: list[Node], token: int) -> list[Node]:
        """Add `token` to the sequence whose open suffixes (the nodes of its last 0..depth-1 tokens, root first) are
        `active`; returns the sequence's new open suffixes."""
        self.root.count += 1
        grown = [self.root]
        for node in active:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
            child.count += 1
            if len(grown) < self.depth:
                grown.append(child)
        return grown

    def extend(self, tokens: list[int]) -> None:
        """Add one whole sequence."""
        active = self.start()
        for token in tokens:
            active = self.append(active, token)

    def remove(self, tokens: list[int]) -> None:
        """Take out one whole sequence that was added with `extend` (counts go down; empty nodes go)."""
        active = [self.root]
        for token in tokens:
            self.root.count -= 1
            grown = [self.root]
            for node in active:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                elif len(grown) < self.depth:
                    grown.append(child)
            active = grown

    def speculate(
        self,
        context: list[int],
        max_tokens: int,
        min_token_prob: float = MIN_TOKEN_PROB,
        max_spec_factor: float = MAX_SPEC_FACTOR,
        max_spec_offset: float = MAX_SPEC_OFFSET,
    ) -> tuple[list[int], float]:
        """(tokens, score) of the best path continuing the context's suffix (module docstring)."""
        context = context[-self.depth :]
        best: list[int] = []
        best_score = 0.0
        for m in range(1, len(context)):
            node = self.root
            for token in context[len(context) - m :]:
                found = node.children.get(token)
                if found is None:
                    return best, best_score
                node = found
            budget = min(max_tokens, int(m * max_spec_factor + max_spec_offset + 1e-6))
            path: list[int] = []
            prob, score = 1.0, 0.0
            while len(path) < budget and node.children:
                token, child = max(node.children.items(), key=lambda item: item[1].count)  # first of equals
                prob *= child.count / node.count
                if prob < min_token_prob:
                    break
                path.append(token)
                score += prob
                node = child
            if score >= best_score:
                best, best_score = path, score
        return best, best_score


class Request:
    """One prompt being decoded: its own tree over the prompt and the output so far."""

    def __init__(self, index: int, depth: int, prompt: list[int]) -> None:
        self.index = index
        self.tree = SuffixTree(depth)
        self.active = self.tree.start()
        self.seen = 0
        self.grow(prompt)

    def grow(self, history: list[int]) -> None:
        for token in history[self.seen :]:
            self.active = self.tree.append(self.active, token)
        self.seen = len(history)


class SuffixCache:
    def __init__(self, depth: int, max_cached_tokens: int = MAX_CACHED_TOKENS) -> None:
        self.depth = depth
        self.max_cached_tokens = max_cached_tokens
        self.responses: dict[int, list[int]] = {}  # prompt index -> its response, oldest first
        self.cached_tokens = 0
        self.tree = SuffixTree(depth)

    def start_request(self, index: int, prompt: list[int]) -> Request:
        self.evict(index)  # a prompt never drafts from its own earlier response (a repeat, the warm-up)
        return Request(index, self.depth, prompt)

    def speculate(self, request: Request, history: list[int], max_tokens: int) -> list[int]:
        """The draft for the request whose committed tokens are `history` (at most max_tokens tokens)."""
        request.grow(history)
        own, own_score = request.tree.speculate(history, max_tokens)
        other, other_score = self.tree.speculate(history, max_tokens)
        return own if own_score >= other_score else other

    def add_response(self, index: int, response: list[int]) -> None:
        """Cache a finished response (replacing that prompt's earlier one); the oldest go past the bound."""
        self.evict(index)
        if not response or len(response) > self.max_cached_tokens:
            return
        self.responses[index] = list(response)
        self.tree.extend(response)
        self.cached_tokens += len(response)
        while self.cached_tokens > self.max_cached_tokens:
            self.evict(next(iter(self.responses)))

    def evict(self, index: int) -> None:
        response = self.responses.pop(index, None)
        if response is not None:
            self.tree.remove(response)
            self.cached_tokens -= len(response)
