"""Suffix decoding's trees (engine/decoding/suffix_tree.py) follow arctic-inference's rules, checked against a brute
force over substring counts; responses leave the tree exactly; a prompt never drafts from its own earlier response, so
repeating a prompt (the timing protocol's repeats, the warm-up) cannot inflate its acceptance."""

import dataclasses
import random

import pytest

from engine.decoding import runs
from engine.decoding.sampling import SamplingConfig
from engine.decoding.suffix_tree import MIN_TOKEN_PROB, SuffixCache, SuffixTree
from tests import tiny_models as tm


def substring_stats(seqs: list[list[int]], depth: int):
    """(occurrences, first-seen order) of every substring of length <= depth, in insertion order."""
    counts: dict[tuple[int, ...], int] = {}
    first: dict[tuple[int, ...], int] = {}
    for seq in seqs:
        for start in range(len(seq)):
            for end in range(start + 1, min(start + depth, len(seq)) + 1):
                key = tuple(seq[start:end])
                counts[key] = counts.get(key, 0) + 1
                first.setdefault(key, len(first))
    return counts, first


def brute_speculate(seqs, depth, context, max_tokens, min_prob=MIN_TOKEN_PROB):
    """The module docstring's rule, from substring counts alone."""
    counts, first = substring_stats(seqs, depth)
    context = context[-depth:]
    best, best_score = [], 0.0
    for m in range(1, len(context)):
        pattern = tuple(context[len(context) - m :])
        if pattern not in counts:
            break
        path, prob, score, node = [], 1.0, 0.0, pattern
        while len(path) < min(max_tokens, m) and len(node) < depth:
            children = [key for key in counts if len(key) == len(node) + 1 and key[:-1] == node]
            if not children:
                break
            child = max(children, key=lambda key: (counts[key], -first[key]))
            prob *= counts[child] / counts[node]
            if prob < min_prob:
                break
            path.append(child[-1])
            score += prob
            node = child
        if score >= best_score:
            best, best_score = path, score
    return best, best_score


@pytest.mark.parametrize("seed", range(6))
def test_speculation_follows_the_brute_force_rule(seed):
    rng = random.Random(seed)
    depth = rng.choice([3, 5, 8])
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(5, 40))] for _ in range(rng.randrange(1, 4))]
    tree = SuffixTree(depth)
    for seq in seqs:
        tree.extend(seq)
    for _ in range(25):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        k = rng.randrange(1, 9)
        got, score = tree.speculate(context, k)
        want, want_score = brute_speculate(seqs, depth, context, k)
        assert got == want and score == pytest.approx(want_score), (seqs, context, k)


def test_a_known_case():
    tree = SuffixTree(8)
    tree.extend([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4])
    # "1 2 3" occurs 3 times, followed by 4 twice and 5 once: 4 (p 2/3), then "1" after "1 2 3 4" (p 2/3 x 1/2 < 0.1?
    # no: 1/3 >= 0.1), at most as many tokens as the match is long.
    assert tree.speculate([9, 1, 2, 3], 8)[0] == [4, 1, 2]
    assert tree.speculate([9, 1, 2, 3], 1)[0] == [4]
    assert tree.speculate([7, 7], 8) == ([], 0.0)  # no match at all


def test_removing_a_sequence_leaves_the_tree_of_the_others():
    rng = random.Random(3)
    a, b = ([rng.randrange(5) for _ in range(50)] for _ in range(2))
    both, only_b = SuffixTree(6), SuffixTree(6)
    both.extend(a)
    both.extend(b)
    both.remove(a)
    only_b.extend(b)

    def shape(node):
        return node.count, {t: shape(c) for t, c in node.children.items()}

    assert shape(both.root) == shape(only_b.root)


def test_the_cache_never_drafts_from_a_prompts_own_response_and_stays_bounded():
    cache = SuffixCache(8, max_cached_tokens=30)
    cache.add_response(0, [5, 6, 7, 8, 9, 10])
    request = cache.start_request(1, [1, 5, 6])
    # prompt 0's response continues "5 6"; a match of 2 tokens drafts at most 2 (max_spec_factor 1)
    assert cache.speculate(request, [1, 5, 6], 4) == [7, 8]
    cache.add_response(1, [5, 6, 1, 1, 1, 1])
    own = cache.start_request(1, [2, 5, 6])  # prompt 1 again: its own earlier response is gone
    assert 1 not in cache.responses
    assert cache.speculate(own, [2, 5, 6], 4) == [7, 8]
    for index in range(2, 10):  # 6 tokens each: the oldest responses leave past 30 tokens
        cache.add_response(index, [index] * 6)
    assert cache.cached_tokens <= 30 and 0 not in cache.responses and 9 in cache.responses


def test_repeating_prompts_does_not_inflate_suffix_acceptance():
    """The timing protocol decodes each prompt R times in a row (prompt-major, after a warm-up): every repeat of a
    prompt must draft exactly as its first decode did, which a cache holding its own response would break (the
    repeat would find its whole output there). Earlier prompts' responses are used: the point of the cache."""
    target = tm.llama(0, layers=2, sharpness=4.0)
    p = dataclasses.replace(tm.pair(target, target), draft=None)  # suffix decoding needs no draft model
    cfg = SamplingConfig(temperature=0, max_new_tokens=24)
    prompts = ["t3 t4 t5 t3 t4", "t9 t10 t9 t10 t11", "t3 t4 t9 t10"]
    ids = runs.encode_prompts(p, prompts, 24)
    decoder = runs.speculative_decoder(p, cfg, 4, drafter="suffix:8")
    for n, (text, prompt_ids) in enumerate(zip(prompts, ids)):
        repeats = [decoder.generate(text, prompt_ids, n) for _ in range(3)]
        shapes = [[(r.k, r.accepted) for r in result.rounds] for result in repeats]
        assert shapes[1] == shapes[0] and shapes[2] == shapes[0], n
    assert len(decoder.drafter.cache.responses) == len(prompts)
