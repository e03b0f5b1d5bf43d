"""A draft with another tokenizer drafts over the tokens both vocabularies share (engine/models/vocab_bridge.py, vLLM's
use_heterogeneous_vocab) and stays lossless: greedy equals target-only token for token at batch 1 and 3, sampled
outputs (probabilistic and greedy drafts) pass chi-squared against the target's exact joint. The draft only ever
proposes shared tokens, and a draft that is the target re-indexed into its own vocabulary proposes exactly the target's
choice wherever that is shared. Broken mappings, an unmasked draft and a p_d not renormalized over the intersection are
detected."""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.decoding import drafting, runs
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import speculative_metrics
from engine.models import vocab_bridge
from engine.models.loading import LoadedModel, ModelPair, bridged, pair_vocabulary
from tests import test_engine_sampling as sampling_tests
from tests import tiny_models as tm
from tests.meaning import missing
from tests.test_engine_batched import decode_in_batches
from tests.test_engine_sampling import NEW, V, chi2_pvalue, exact_joint, sample_counts, sample_counts_with

BIG = 64
PROMPTS = ["t5", "t9 t3 t22", "t40 t41 t2 t8 t9 t10 t11", "t7 t7 t8", "t30 t31 t2 t3"]
STEPS = 24


def word_tokenizer(words: list[str], unk: str, eos: str | None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose id i is words[i]."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, eos_token=eos)


def draft_words(vocab: int, shared: int, extras: int, seed: int) -> list[str]:
    """The target's first `shared` words in a shuffled order, then `extras` words the target lacks, shuffled in."""
    g = np.random.default_rng(seed)
    words = [f"t{i}" for i in range(shared)] + [f"x{i}" for i in range(extras)]
    return [words[i] for i in g.permutation(len(words))]


def cross_pair(target, draft, draft_tok, vocab: int) -> ModelPair:
    eos = None if target.config.eos_token_id is None else f"t{tm.EOS}"
    target_tok = word_tokenizer([f"t{i}" for i in range(vocab)], "t0", eos)
    width = target.get_output_embeddings().weight.shape[0]
    size, mapping = pair_vocabulary(target_tok, draft_tok, width, draft.get_output_embeddings().weight.shape[0])
    plain = ModelPair(
        LoadedModel("target", "memory", target, target_tok),
        LoadedModel("draft", "memory", draft, draft_tok),
        torch.device("cpu"),
        torch.float32,
        size,
    )
    return bridged(plain, mapping)


def reindexed_copy(target, words: list[str], seed: int):
    """The target with its vocabulary re-indexed as `words` (a word the target lacks gets random rows): on a context
    of shared tokens it scores each shared token exactly as the target does."""
    draft = tm.llama(seed, layers=2, vocab=len(words), sharpness=4.0)
    state = target.state_dict()
    own = draft.state_dict()
    for name, value in state.items():
        if value.shape == own[name].shape:
            own[name] = value.clone()
    for d, w in enumerate(words):
        if w.startswith("t"):
            t = int(w[1:])
            own["model.embed_tokens.weight"][d] = state["model.embed_tokens.weight"][t]
            own["lm_head.weight"][d] = state["lm_head.weight"][t]
    draft.load_state_dict(own)
    return draft.eval()


@pytest.fixture(scope="module")
def greedy_setup():
    target = tm.llama(0, layers=2, sharpness=4.0)
    words = draft_words(BIG, shared=48, extras=12, seed=3)
    p = cross_pair(target, reindexed_copy(target, words, 5), word_tokenizer(words, "x0", "t1"), BIG)
    cfg = SamplingConfig(temperature=0, max_new_tokens=STEPS)
    ids = runs.encode_prompts(p, PROMPTS, STEPS)
    alone = runs.baseline_decoder(p, cfg)
    return p, cfg, ids, [alone.generate(q, i, n).output_ids for n, (q, i) in enumerate(zip(PROMPTS, ids))]


def test_the_pair_is_an_intersection_pair_with_its_coverage(greedy_setup):
    p, *_ = greedy_setup
    assert p.vocab == "intersection" and p.mapping is not None
    assert p.mapping.shared == 48 and p.vocab_coverage == pytest.approx(48 / BIG)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_target_only(greedy_setup, batch):
    p, cfg, ids, alone = greedy_setup
    rows = decode_in_batches(runs.speculative_decoder(p, cfg, 3), PROMPTS, ids, batch)
    assert [r.output_ids for r in rows] == alone
    m = speculative_metrics(rows)
    assert 0 < m["accepted"] < m["proposed"]  # both outcomes happen: the equality means something


def proposals_follow_the_target(p, cfg, ids):
    """(slots checked, slots that break the rule): a greedy re-indexed copy proposes the target's own choice
    wherever that choice is shared and the context held only shared tokens, so such a draft is never rejected."""
    shared = p.mapping.shared_target_ids()
    decoder = runs.speculative_decoder(p, cfg, 3)
    checked = broken = 0
    for n, (q, i) in enumerate(zip(PROMPTS, ids)):
        result = decoder.generate(q, i, n)
        context = i[0].tolist() + result.output_ids[:1]  # the prefill's token belongs to no round
        for r in result.rounds:
            for t, token in zip(r.draft_tokens, r.emitted_ids):  # draft i owns output slot i
                assert t.token_id in shared  # the draft proposes shared tokens only
                if set(context) <= shared and token in shared:
                    checked += 1
                    broken += t.outcome != "accepted"
                context.append(token)
            context += r.emitted_ids[len(r.draft_tokens) :]  # the bonus token
    return checked, broken


def test_a_reindexed_copy_proposes_the_targets_shared_choice(greedy_setup):
    p, cfg, ids, _ = greedy_setup
    checked, broken = proposals_follow_the_target(p, cfg, ids)
    assert checked >= 10 and broken == 0


def test_a_wrong_id_mapping_is_detected(greedy_setup):
    p, cfg, ids, _ = greedy_setup
    bridge = p.draft.model
    right = bridge.shared_draft
    bridge.shared_draft = right.roll(1)  # each shared target id reads its neighbour's draft logit
    try:
        _, broken = proposals_follow_the_target(p, cfg, ids)
    finally:
        bridge.shared_draft = right
    assert broken > 0


def test_a_draft_unmasked_outside_the_intersection_is_detected(greedy_setup, monkeypatch):
    p, cfg, ids, _ = greedy_setup
    real = vocab_bridge.VocabBridge.bridged

    def unmasked(self, input_ids, **kwargs):
        out = real(self, input_ids, **kwargs)
        out.logits = torch.nan_to_num(out.logits, neginf=10.0)  # tokens outside the intersection proposable
        return out

    monkeypatch.setattr(vocab_bridge.VocabBridge, "bridged", unmasked)
    with pytest.raises(AssertionError):
        proposals_follow_the_target(p, cfg, ids)


def test_proposals_are_distributions_over_the_shared_tokens(greedy_setup):
    p, _, ids, _ = greedy_setup
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=4, seed=2)
    drafter = drafting.make_drafter("model", draft_model=p.draft.model, vocab_size=p.vocab_size, k=3, cfg=cfg)
    seqs = [i[0] for i in ids[:3]]
    drafter.start(seqs, [s.tolist() for s in seqs], [0, 1, 2])
    gens = [torch.Generator().manual_seed(s) for s in range(3)]
    proposal = drafter.propose(seqs, [s.tolist() for s in seqs], gens, [3, 3, 3])
    outside = torch.tensor([t not in p.mapping.shared_target_ids() for t in range(p.vocab_size)])
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(3, 3))
    assert proposal.probs[..., outside].abs().max() == 0
    assert proposal.raw_logits is None  # KL against the target is infinite: recorded NaN


# --- sampling: chi-squared against the target's exact joint (tests/test_engine_sampling.py's helpers) ----------


SAMPLES = 500  # draws per chi-squared test (tests/test_engine_sampling.py's helpers take 2000: too slow here)


@pytest.fixture
def sampled_setup(monkeypatch, sampled_pair):
    monkeypatch.setattr(sampling_tests, "SAMPLES", SAMPLES)
    return sampled_pair


@pytest.fixture(scope="module")
def sampled_pair():
    target = tm.llama(0, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)
    words = ["t2", "x0", "t0", "t3", "x1", "t1"]  # t4, t5 missing; x0, x1 extra; reordered
    draft = tm.llama(7, layers=1, vocab=len(words), hidden=16, sharpness=25.0, eos=None)
    p = cross_pair(target, draft, word_tokenizer(words, "x0", "x1"), V)
    prompt_ids = runs.encode_prompts(p, ["t2 t3"], NEW)[0]
    return p, prompt_ids, exact_joint(target, prompt_ids)


def test_sampled_outputs_follow_the_target(sampled_setup):
    p, prompt_ids, probs = sampled_setup
    assert chi2_pvalue(sample_counts(p, prompt_ids), probs) > 1e-3


def test_greedy_drafts_as_vllm_serves_them_follow_the_target(sampled_setup):
    p, prompt_ids, probs = sampled_setup
    counts, rate = sample_counts_with(p, prompt_ids, draft_sampling="greedy")
    assert chi2_pvalue(counts, probs) > 1e-3 and 0 < rate < 1


def test_a_p_draft_not_renormalized_over_the_intersection_is_detected(sampled_setup, monkeypatch):
    """Drafting from the intersection but verifying with the draft's own mass on those tokens (not renormalized
    over them) biases the output."""
    p, prompt_ids, probs = sampled_setup
    real_bridged, real_probabilities = vocab_bridge.VocabBridge.bridged, drafting.probabilities
    mass = {}

    def remember(self, input_ids, **kwargs):
        out = self.draft(input_ids=self.to_draft[input_ids], **kwargs)
        mass["shared"] = out.logits.float().softmax(-1)[..., self.shared_draft].sum(-1)[:, -1:]
        return real_bridged(self, input_ids, **kwargs)

    monkeypatch.setattr(vocab_bridge.VocabBridge, "bridged", remember)
    monkeypatch.setattr(drafting, "probabilities", lambda logits, cfg: real_probabilities(logits, cfg) * mass["shared"])
    assert chi2_pvalue(sample_counts(p, prompt_ids), probs) < 1e-6


# --- refusals -----------------------------------------------------------------------------------------------


def test_a_pair_sharing_no_tokens_is_one_line():
    with pytest.raises(DraftLabError) as err:
        pair_vocabulary(tm.tokenizer(BIG), tm.tokenizer(BIG, prefix="u"), BIG, BIG)
    assert "\n" not in str(err.value)
    assert not missing(str(err.value), "share 0", "64", "pick a draft"), err.value


def test_a_draft_tokenizer_without_unk_or_eos_is_one_line():
    words = draft_words(BIG, shared=40, extras=4, seed=1)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    with pytest.raises(DraftLabError) as err:
        pair_vocabulary(tm.tokenizer(BIG), PreTrainedTokenizerFast(tokenizer_object=tok), BIG, len(words))
    assert not missing(str(err.value), "draft tokenizer", "unk", "EOS"), err.value


def test_one_tokenizer_stays_a_shared_pair():
    size, mapping = pair_vocabulary(tm.tokenizer(BIG), tm.tokenizer(BIG), BIG, 80)
    assert (size, mapping) == (BIG, None)


# --- end to end: `draftlab run --json` carries the vocabulary; the by-type breakdown counts its cost -------------


def test_a_run_reports_its_vocabulary_and_the_rejections_it_could_not_avoid(tmp_path_factory, capsys):
    from storage import open_store
    from storage.records import queries as q
    from tests.cli_runs import run_json

    base = tmp_path_factory.mktemp("othervocab")
    target = tm.llama(0, layers=2, sharpness=4.0)
    words = draft_words(BIG, shared=48, extras=12, seed=3)
    dirs = {"target": str(base / "target"), "draft": str(base / "draft")}
    target.save_pretrained(dirs["target"])
    tm.tokenizer(BIG).save_pretrained(dirs["target"])
    reindexed_copy(target, words, 5).save_pretrained(dirs["draft"])
    word_tokenizer(words, "x0", "t1").save_pretrained(dirs["draft"])
    doc, db = run_json(base, dirs, capsys, "--k", "3", "--max-new-tokens", "24")
    run = doc["runs"][0]
    assert run["vocab"] == "intersection" and run["vocab_coverage"] == pytest.approx(48 / BIG)
    assert run["outputs_match_baseline"] is True
    by_type = q.acceptance_by_type(open_store(db), run["run_id"])
    rejected = by_type["verified"].sum() - by_type["accepted"].sum()
    # the re-indexed copy is only ever refused for a target token it could not propose (or after reading one)
    assert 0 < by_type["outside_vocab"].sum() <= rejected
    # findings name the intersection's cost, from the same GROUP BY
    from storage.analysis.findings import findings

    found = [f for f in findings(open_store(db), doc["experiment_id"]) if f["kind"] == "vocab"]
    assert len(found) == 1 and found[0]["data"]["outside_vocab"] == by_type["outside_vocab"].sum(), found
    assert found[0]["data"]["vocab_coverage"] == pytest.approx(48 / BIG)


def test_prompts_outside_the_intersection_are_warned_about():
    words = draft_words(BIG, shared=48, extras=12, seed=3)
    _, mapping = pair_vocabulary(tm.tokenizer(BIG), word_tokenizer(words, "x0", "t1"), BIG, len(words))
    assert vocab_bridge.prompt_warning(mapping, [[3, 4, 5], [9, 10]]) is None
    warning = vocab_bridge.prompt_warning(mapping, [[3, 50, 5], [9, 60]])
    assert warning is not None and not missing(warning, "40.0%", "outside", "unk"), warning
    assert not missing(vocab_bridge.describe(mapping), "48", "75.0%", "intersection"), vocab_bridge.describe(mapping)


def test_the_shipped_draft_of_another_vocabulary_runs_losslessly_with_demo_target():
    from engine.models.loading import load_pair

    p = load_pair("demo-target", "demo-draft-othervocab", "cpu")
    assert p.vocab == "intersection" and 0.3 < p.vocab_coverage < 0.7  # its own, smaller vocabulary
    prompts = ["def fibonacci(n):", "import os\nfor name in"]
    cfg = SamplingConfig(temperature=0, max_new_tokens=16)
    ids = runs.encode_prompts(p, prompts, 16)
    alone = [runs.baseline_decoder(p, cfg).generate(q, i, n).output_ids for n, (q, i) in enumerate(zip(prompts, ids))]
    rows = decode_in_batches(runs.speculative_decoder(p, cfg, 3), prompts, ids, 2)
    assert [r.output_ids for r in rows] == alone and speculative_metrics(rows)["accepted"] > 0


def test_the_forms_pair_check_reports_the_vocabulary_and_warns_about_the_prompts(tmp_path):
    from transformers import LlamaConfig

    from pages.widgets.pair_check import check_pair_names, prompt_vocab_warning, wait_warm

    wait_warm()
    words = draft_words(BIG, shared=48, extras=12, seed=3)
    for name, tok in (("target", tm.tokenizer(BIG)), ("draft", word_tokenizer(words, "x0", "t1"))):
        tok.save_pretrained(tmp_path / name)
        config = LlamaConfig(
            vocab_size=len(tok), hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
        )
        config.save_pretrained(tmp_path / name)
    target, draft = str(tmp_path / "target"), str(tmp_path / "draft")
    check = check_pair_names(target, draft)
    assert check.ok and check.vocab == "intersection" and check.vocab_coverage == pytest.approx(0.75)
    assert not missing(check.message, "48", "75.0%", "intersection"), check.message
    assert prompt_vocab_warning(target, draft, ["t3 t4 t5", "t9 t10"]) is None
    warning = prompt_vocab_warning(target, draft, ["t3 t50 t5", "t9 t60"])
    assert warning is not None and "40.0%" in warning
    assert prompt_vocab_warning(target, target, ["t3 t50"]) is None  # one tokenizer: nothing to warn about
