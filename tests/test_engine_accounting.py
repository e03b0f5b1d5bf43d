"""Round accounting under cuts (SPEC "One round"): a round cut by EOS or by max_new_tokens counts only the
drafts whose slot reached the output. An accepted draft past the cut is not accepted, a refused one past
the cut is not rejected: both are discarded, whichever of the two cuts ended the round."""

import copy

import pytest

from engine.decoding import runs
from engine.decoding.records import ACCEPTED, DISCARDED, REJECTED
from engine.decoding.sampling import SamplingConfig
from engine.metrics.metrics_oracle import speculative_metrics
from tests import tiny_models as tm


def _check_round(r):
    outcomes = [t.outcome for t in r.draft_tokens]
    assert r.accepted == outcomes.count(ACCEPTED) == r.emitted_kinds.count(ACCEPTED)
    assert r.emitted_ids[: r.accepted] == [t.token_id for t in r.draft_tokens[: r.accepted]]
    # A rejection counts only when its correction was emitted.
    assert outcomes.count(REJECTED) == r.emitted_kinds.count("correction")


@pytest.mark.parametrize("budget", [1, 3, 5])
def test_max_new_tokens_cut_counts_only_emitted_drafts(budget):
    target = tm.llama(0, layers=2, sharpness=4.0)
    p = tm.pair(target, copy.deepcopy(target))  # the draft is the target: every draft is accepted
    cfg = SamplingConfig(temperature=0, max_new_tokens=budget)
    ids = runs.encode_prompts(p, ["t3 t4 t5"], budget)
    result = runs.speculative_decoder(p, cfg, 8).generate("t3 t4 t5", ids[0], 0)
    assert result.new_tokens == budget
    for r in result.rounds:
        _check_round(r)
    m = speculative_metrics([result])
    # Every emitted token is an accepted draft or the round's bonus/correction: accepted <= new tokens.
    assert m["accepted"] <= result.new_tokens and m["rejected"] == 0


def _settle(drafted, accepted, next_token, budget=100):
    from engine.decoding.records import settle_round

    return settle_round(drafted, accepted, next_token, {tm.EOS}, budget)


def test_settle_round_without_cut():
    assert _settle([5, 6, 7], 1, 9) == ([5, 9], [ACCEPTED, "correction"], 1, [ACCEPTED, REJECTED, DISCARDED])
    assert _settle([5, 6], 2, 9) == ([5, 6, 9], [ACCEPTED, ACCEPTED, "bonus"], 2, [ACCEPTED, ACCEPTED])
    assert _settle([], 0, 9) == ([9], ["bonus"], 0, [])  # a round with no drafts: one plain target step


@pytest.mark.parametrize("cut", ["eos", "budget"])
def test_eos_and_budget_cuts_are_counted_alike(cut):
    """The same cut after the first two drafts, made by an accepted EOS or by the token budget."""
    second = tm.EOS if cut == "eos" else 6
    budget = 100 if cut == "eos" else 2
    # All four accepted: the two past the cut are discarded, not accepted, and the bonus is dropped.
    assert _settle([5, second, 7, 8], 4, 9, budget) == (
        [5, second],
        [ACCEPTED] * 2,
        2,
        [ACCEPTED, ACCEPTED, DISCARDED, DISCARDED],
    )
    # Draft 3 refused, but its correction falls past the cut: discarded too, not rejected.
    assert _settle([5, second, 7], 2, 9, budget) == ([5, second], [ACCEPTED] * 2, 2, [ACCEPTED, ACCEPTED, DISCARDED])


def test_eos_correction_is_a_rejection():
    assert _settle([5, 6], 1, tm.EOS) == ([5, tm.EOS], [ACCEPTED, "correction"], 1, [ACCEPTED, REJECTED])
