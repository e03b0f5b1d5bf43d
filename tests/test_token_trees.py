"""Token trees (engine/decoding/token_trees.py, engine/decoding/tree_verification.py) are lossless: greedy tree
decoding equals target-only decoding token for token at batch 1 and batch 3 (prompts of different lengths, several
depths, branchings and tree sizes); sampled tree decoding follows the target's exact distribution (chi-squared) and a
batched sampled row equals that prompt alone; the same for an EAGLE-3 head's tree. Mutations that break the rule are
caught: a rejected child left in the residual, a tree mask that lets a node see its siblings, a child accepted by the
draft's rank. The records hold one row per depth with sibling ranks."""

import numpy as np
import pytest
import torch

from engine.decoding import runs, token_trees, tree_verification
from engine.decoding.drafting import make_drafter
from engine.decoding.records import ACCEPTED
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from tests import tiny_models as tm
from tests.meaning import missing
from tests.test_eagle3 import target_pair, with_draft, write_head
from tests.test_engine_sampling import NEW, SAMPLES, K, V, chi2_pvalue, exact_joint, setup  # noqa: F401 - fixture
from tests.test_engine_sliding import build

PROMPTS = ["t5", "t9 t3 t22", "t40 t41 t2 t8 t9 t10 t11 t12 t13 t14 t15"]
TOKENS = 20
SHAPES = [(3, 2, 0), (4, 3, 6), (2, 4, 0), (5, 2, 8)]  # (k = depth, tree topk, tree tokens)


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def family(request):
    target = getattr(tm, request.param)(0, layers=2, sharpness=4.0)
    pair = tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.6))
    ids = runs.encode_prompts(pair, PROMPTS, TOKENS)
    alone = runs.baseline_decoder(pair, SamplingConfig(temperature=0, max_new_tokens=TOKENS))
    return pair, ids, [alone.generate(p, i, n).output_ids for n, (p, i) in enumerate(zip(PROMPTS, ids))]


def tree_outputs(family, k, topk, size, batched):
    pair, ids, _ = family
    cfg = SamplingConfig(temperature=0, max_new_tokens=TOKENS, tree_topk=topk, tree_tokens=size)
    decoder = runs.speculative_decoder(pair, cfg, k)
    if batched:
        return decoder.generate_batch(PROMPTS, ids, list(range(len(PROMPTS))))
    return [decoder.generate(p, i, n) for n, (p, i) in enumerate(zip(PROMPTS, ids))]


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_tree_equals_target_only_at_batch_1_and_3(family, shape):
    expected = family[2]
    for batched in (False, True):
        results = tree_outputs(family, *shape, batched)
        assert [r.output_ids for r in results] == expected, (shape, batched)
        assert all(r.tree_nodes for res in results for r in res.rounds[1:2])  # tree rounds, not chains


def test_tree_records_hold_one_row_per_depth_with_sibling_ranks(family):
    k, topk, size = 3, 2, 0
    results = tree_outputs(family, k, topk, size, batched=True)
    full = topk + (k - 1) * topk * topk  # every node the expansion makes
    for round_ in (r for res in results for r in res.rounds):
        tokens = round_.draft_tokens
        assert [t.position for t in tokens] == list(range(1, len(tokens) + 1))
        assert round_.accepted == sum(t.outcome == ACCEPTED for t in tokens) and len(tokens) <= round_.k <= k
        assert all(t.sibling_rank is not None and 0 <= t.sibling_rank < topk for t in tokens)
        assert all(t.siblings is not None and t.sibling_rank < t.siblings <= topk for t in tokens)
        # the rejected node and those below it are the top-1 chain under the last accepted node
        assert all(t.sibling_rank == 0 for t in tokens if t.outcome != ACCEPTED)
        if round_.k == k:
            assert round_.tree_nodes == full


def test_greedy_tree_accepts_off_the_top_1_chain(family):
    rounds = [r for res in tree_outputs(family, 3, 3, 0, batched=False) for r in res.rounds]
    off_chain = [r for r in rounds if any(t.outcome == ACCEPTED and t.sibling_rank for t in r.draft_tokens)]
    assert off_chain  # a weak draft's second or third choice was the target's


def test_greedy_mask_letting_a_node_see_its_siblings_is_detected(family, monkeypatch):
    real = token_trees.ancestor_mask

    def with_siblings(parents, valid, depth):
        siblings = (parents[:, :, None] == parents[:, None, :]) & valid[:, None, :] & valid[:, :, None]
        return real(parents, valid, depth) | siblings

    monkeypatch.setattr(token_trees, "ancestor_mask", with_siblings)
    assert [r.output_ids for r in tree_outputs(family, 3, 3, 0, batched=False)] != family[2]


def test_greedy_child_accepted_by_the_drafts_rank_is_detected(family, monkeypatch):
    def top_ranked(kids, kid_tokens, p):
        first = torch.zeros_like(kids, dtype=torch.bool)
        first[:, 0] = kids[:, 0] >= 0
        return first

    monkeypatch.setattr(tree_verification, "greedy_match", top_ranked)
    assert [r.output_ids for r in tree_outputs(family, 3, 3, 0, batched=False)] != family[2]


def tree_counts(p, prompt_ids, topk, size=0, rows=250, drafter="model"):
    """Output counts of SAMPLES sampled tree decodes of the fixture's prompt (prompt index i: its own generator),
    decoded `rows` at a time (a batched row equals that prompt alone: test below)."""
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=11, tree_topk=topk, tree_tokens=size)
    decoder = runs.speculative_decoder(p, cfg, K, drafter=drafter)
    counts = np.zeros(V**NEW)
    for start in range(0, SAMPLES, rows):
        for result in decoder.generate_batch(["t2 t3"] * rows, [prompt_ids] * rows, list(range(start, start + rows))):
            counts[np.ravel_multi_index(result.output_ids, (V,) * NEW)] += 1
    return counts


@pytest.mark.parametrize("topk, size", [(3, 0), (2, 4)])
def test_sampled_tree_follows_target_distribution(setup, topk, size):  # noqa: F811 - the fixture
    p, prompt_ids, probs = setup
    assert chi2_pvalue(tree_counts(p, prompt_ids, topk, size), probs) > 1e-3


def test_sampled_tree_keeping_a_rejected_child_in_the_residual_is_detected(setup, monkeypatch):  # noqa: F811
    p, prompt_ids, probs = setup
    monkeypatch.setattr(tree_verification, "without_rejected", lambda p, x, rejected: p)
    assert chi2_pvalue(tree_counts(p, prompt_ids, 3), probs) < 1e-6


def test_sampled_tree_accepts_non_top_1_children(setup):  # noqa: F811 - the fixture
    p, prompt_ids, _ = setup
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=5, tree_topk=3)
    decoder = runs.speculative_decoder(p, cfg, K)
    rounds = [r for i in range(60) for r in decoder.generate("t2 t3", prompt_ids, i).rounds]
    ranks = [t.sibling_rank for r in rounds for t in r.draft_tokens if t.outcome == ACCEPTED]
    assert any(ranks) and 0 in ranks


def test_batched_sampled_tree_row_equals_that_prompt_alone(family):
    pair, ids, _ = family
    cfg = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=TOKENS, seed=4, tree_topk=3, tree_tokens=8)
    decoder = runs.speculative_decoder(pair, cfg, 3)
    batch = decoder.generate_batch(PROMPTS, ids, list(range(len(PROMPTS))))
    alone = [decoder.generate(p, i, n) for n, (p, i) in enumerate(zip(PROMPTS, ids))]
    assert [r.output_ids for r in batch] == [r.output_ids for r in alone]
    assert [[x.accepted for x in r.rounds] for r in batch] == [[x.accepted for x in r.rounds] for r in alone]


def test_a_drafter_that_cannot_branch_is_refused_in_one_line():
    cfg = SamplingConfig(tree_topk=2)
    with pytest.raises(DraftLabError) as err:
        make_drafter("suffix:8", draft_model=None, vocab_size=V, k=3, cfg=cfg)
    assert not missing(str(err.value), "suffix", "--tree-topk 1", "model"), err.value
    with pytest.raises(DraftLabError) as bad:
        SamplingConfig(tree_topk=0)
    assert not missing(str(bad.value), "tree topk", "1"), bad.value
    block = SamplingConfig(tree_topk=2, verify="block")
    with pytest.raises(DraftLabError) as rule:
        make_drafter("model", draft_model=tm.llama(0, layers=1, vocab=V), vocab_size=V, k=3, cfg=block)
    assert not missing(str(rule.value), "'block'", "--verify standard", "--tree-topk 1"), rule.value


@pytest.mark.parametrize("vocab, draft_vocab", [(4, None), (64, 40)])
def test_eagle3_head_tree_equals_target_only_at_batch_1_and_3(tmp_path, vocab, draft_vocab):
    target = tm.llama(0, layers=4, vocab=vocab, sharpness=4.0, eos=None)
    pair = with_draft(target_pair(target, vocab), write_head(tmp_path / "head", target, draft_vocab=draft_vocab))
    prompts = ["t2 t3 t0", "t1", "t0 t2 t3 t1 t2"]
    ids = runs.encode_prompts(pair, prompts, TOKENS)
    alone = runs.baseline_decoder(pair, SamplingConfig(temperature=0, max_new_tokens=TOKENS))
    expected = [alone.generate(p, i, n).output_ids for n, (p, i) in enumerate(zip(prompts, ids))]
    cfg = SamplingConfig(temperature=0, max_new_tokens=TOKENS, tree_topk=2, tree_tokens=6)
    decoder = runs.speculative_decoder(pair, cfg, 3, drafter="eagle3")
    results = [decoder.generate(p, i, n) for n, (p, i) in enumerate(zip(prompts, ids))]
    assert [r.output_ids for r in results] == expected
    batch = decoder.generate_batch(prompts, ids, list(range(len(prompts))))
    assert [r.output_ids for r in batch] == expected
    assert all(r.tree_nodes == 5 for res in results for r in res.rounds[1:] if r.k == 3)


def test_eagle3_head_tree_follows_target_distribution(tmp_path):
    target = tm.llama(0, layers=4, vocab=V, hidden=16, sharpness=25.0, eos=None)
    pair = with_draft(target_pair(target, V), write_head(tmp_path / "head", target, draft_vocab=4))
    prompt_ids = runs.encode_prompts(pair, ["t2 t3"], NEW)[0]
    counts = tree_counts(pair, prompt_ids, 3, drafter="eagle3")
    assert chi2_pvalue(counts, exact_joint(target, prompt_ids)) > 1e-3


def test_a_sliding_window_model_is_refused_for_trees_in_one_line():
    target = build("mistral")
    pair = tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.5))
    cfg = SamplingConfig(temperature=0, max_new_tokens=8, tree_topk=2)
    ids = runs.encode_prompts(pair, ["t3 t4 t5"], 8)
    with pytest.raises(DraftLabError) as err:
        runs.speculative_decoder(pair, cfg, 3).generate("t3 t4 t5", ids[0], 0)
    assert not missing(str(err.value), "sliding-window", "--tree-topk 1"), err.value
    assert "\n" not in str(err.value)
