"""The drafting strategies of engine/decoding/drafting.py, found by name in one registry: every one is lossless (greedy
output == target-only, chi-squared against the target's exact distribution at temperature 0.8 / top-k 50), and
each follows its reference round by round: transformers' assisted generation for `model` (constant),
`heuristic` and `confidence:T`, transformers' PromptLookupCandidateGenerator for `prompt-lookup:N`."""

import collections
import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from engine.config.drafter_specs import (
    SERVING_ENGINES,
    DeclarationError,
    DrafterSpec,
    Serving,
    canonical_drafter,
    drafter_usage,
    needs_draft_model,
    parse_drafter,
)
from engine.config.drafter_specs import SPECS as DRAFTER_SPECS
from engine.decoding import drafting, runs, verification
from engine.decoding.drafting import (
    ConfidenceDrafter,
    HeuristicDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    Proposal,
    SuffixDrafter,
    drafter_class,
    heuristic_next_k,
    make_drafter,
)
from engine.decoding.records import ACCEPTED, BONUS, DISCARDED, REJECTED
from engine.decoding.sampling import SamplingConfig, probabilities
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import speculative_metrics
from tests import tiny_models as tm
from tests.test_engine_sampling import chi2_pvalue

SPECS = ["model", "heuristic", "confidence:0.5", "prompt-lookup:1", "prompt-lookup:3", "suffix", "suffix:8"]
PROMPTS = ["t5", "t9 t3 t22 t9 t3", "t40 t41 t2 t8 t9 t10 t11 t12 t13 t14 t15 t16 t17 t18 t19 t20 t21 t22 t23 t24 t25"]
NEW = 40


# --- the registry and spec strings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("model", ("model", None)),
        ("heuristic", ("heuristic", None)),
        (" confidence:0.5 ", ("confidence", 0.5)),
        ("confidence:.25", ("confidence", 0.25)),
        ("prompt-lookup:3", ("prompt-lookup", 3)),
        ("prompt-lookup: 1", ("prompt-lookup", 1)),
    ],
)
def test_parse_drafter(spec, parsed):
    assert parse_drafter(spec) == parsed


@pytest.mark.parametrize(
    "spec, words",
    [
        ("confidence:1.5", ["'1.5'", "0 < T < 1", "confidence:0.5"]),
        ("confidence:0", ["'0'", "0 < T < 1"]),
        ("confidence:nan", ["'nan'", "0 < T < 1"]),
        ("confidence:x", ["'x'", "0 < T < 1"]),
        ("confidence", ["needs a probability threshold", "confidence:0.5"]),
        ("prompt-lookup:0", ["'0'", "integer from 1", "prompt-lookup:3"]),
        ("prompt-lookup:2.5", ["'2.5'", "integer from 1"]),
        ("prompt-lookup", ["needs the longest n-gram", "prompt-lookup:3"]),
        ("heuristic:3", ["takes no parameter", "use heuristic"]),
        ("model:2", ["takes no parameter", "use model"]),
        ("heuristc", ["unknown drafter 'heuristc'", "did you mean 'heuristic'", "prompt-lookup:N"]),
        ("eagle", ["unknown drafter 'eagle'", "model, heuristic, confidence:T"]),
        ("", ["empty drafter spec", "model, heuristic"]),
    ],
)
def test_bad_specs_are_refused_in_one_line_naming_the_fix(spec, words):
    with pytest.raises(DraftLabError) as err:
        parse_drafter(spec)
    message = str(err.value)
    assert "\n" not in message and "use" in message
    for word in words:
        assert word in message


def test_registry_entries_are_complete():
    for name, spec in DRAFTER_SPECS.items():
        assert spec.name == name and spec.usage.split(":")[0] == name and spec.summary
        assert (spec.parameter is None) == (":" not in spec.usage)
        assert callable(drafter_class(name).from_spec) and isinstance(spec.needs_model, bool)
        if spec.parameter:  # its example is a valid spec, its default a valid parameter
            assert parse_drafter(spec.parameter.example)[0] == name
            assert spec.parameter.valid(spec.parameter.default)
    # (needs a draft model, constant k, reads the target's hidden states) of the drafters there are (a new one adds)
    capabilities = {name: (s.needs_model, s.constant_k, s.needs_hidden_states) for name, s in DRAFTER_SPECS.items()}
    assert {
        "model": (True, True, False),
        "heuristic": (True, False, False),
        "confidence": (True, False, False),
        "prompt-lookup": (False, False, False),
        "suffix": (False, False, False),
        "eagle3": (True, True, True),
    }.items() <= capabilities.items()
    assert (
        canonical_drafter(" confidence:0.50") == "confidence:0.5"
        and canonical_drafter("prompt-lookup:03") == "prompt-lookup:3"
    )
    assert canonical_drafter("confidence:0.123456789") == "confidence:0.123456789"


def test_every_declaration_has_its_registered_class_and_every_class_its_declaration():
    assert set(drafting.DRAFTERS) == set(DRAFTER_SPECS)
    assert all(drafting.DRAFTERS[name].spec is spec for name, spec in DRAFTER_SPECS.items())
    assert all(drafter_class(name) is cls for name, cls in drafting.DRAFTERS.items())


def test_every_declaration_maps_every_engine_deploy_writes():
    from storage.serving import deploy

    assert set(deploy.ENGINES) <= set(SERVING_ENGINES)
    for name, spec in DRAFTER_SPECS.items():
        assert set(spec.serving) == set(SERVING_ENGINES), name
        assert all(isinstance(spec.serving[engine], Serving) for engine in deploy.ENGINES)
        assert all(spec.serving[engine].how or spec.serving[engine].notes for engine in SERVING_ENGINES), name


def test_a_declaration_without_an_engines_mapping_fails_when_declared():
    serving = {engine: Serving(None, notes=("cannot",)) for engine in SERVING_ENGINES}
    for engine in SERVING_ENGINES:
        partial = {e: s for e, s in serving.items() if e != engine}
        with pytest.raises(DeclarationError, match=f"'lookahead'.*missing {engine}"):
            DrafterSpec("lookahead", "draft from a Jacobi window", serving=partial)
    with pytest.raises(DeclarationError, match="unknown tgi"):
        DrafterSpec("lookahead", "draft from a Jacobi window", serving={**serving, "tgi": Serving("x")})
    with pytest.raises(DeclarationError, match="sglang"):
        DrafterSpec("lookahead", "draft from a Jacobi window", serving={**serving, "sglang": Serving(None)})
    DrafterSpec("lookahead", "draft from a Jacobi window", serving=serving)  # complete: declared


def test_a_class_and_its_declaration_must_name_each_other(monkeypatch):
    with pytest.raises(DeclarationError, match="declares no drafter 'lookahead'"):
        drafting.drafter("lookahead")
    with pytest.raises(DeclarationError, match="ModelDrafter already implements 'model'"):
        drafting.drafter("model")(type("AnotherModel", (ModelDrafter,), {}))
    assert drafting.DRAFTERS["model"] is ModelDrafter
    spec = DrafterSpec("lookahead", "draft from a Jacobi window", serving=_nowhere())
    monkeypatch.setitem(DRAFTER_SPECS, "lookahead", spec)
    with pytest.raises(DeclarationError, match="without a class: lookahead"):
        drafting._check_registry()


def _nowhere() -> dict:
    return {engine: Serving(None, notes=(f"{engine} cannot serve it",)) for engine in SERVING_ENGINES}


def test_a_new_drafter_is_one_class_and_its_declaration(monkeypatch):
    monkeypatch.setitem(
        DRAFTER_SPECS,
        "repeat-last",
        DrafterSpec("repeat-last", "the last token, k times", needs_model=False, constant_k=False, serving=_nowhere()),
    )
    monkeypatch.setattr(drafting, "DRAFTERS", dict(drafting.DRAFTERS))

    @drafting.drafter("repeat-last")
    class RepeatLast(drafting.HostDrafter):
        """Proposes the last token again, k times (a point mass each)."""

        @classmethod
        def from_spec(cls, param, *, draft_model, vocab_size, k, cfg, eos_ids):
            return cls(vocab_size, k, eos_ids)

        def begin_row(self, history, prompt_index):
            return None

        def follow(self, state, history, max_tokens):
            return history[-1:] * max_tokens

    assert RepeatLast.spec is DRAFTER_SPECS["repeat-last"]
    assert "repeat-last" in drafter_usage() and not needs_draft_model("repeat-last")
    p = dataclasses.replace(_pair("llama"), draft=None)
    cfg = SamplingConfig(temperature=0, max_new_tokens=20)
    ids = runs.encode_prompts(p, PROMPTS, 20)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), PROMPTS, ids))
    spec = list(runs.run_prompts(runs.speculative_decoder(p, cfg, 3, drafter="repeat-last"), PROMPTS, ids))
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]


def test_make_drafter_builds_each_class_and_needs_a_model_only_when_it_drafts_with_one():
    target = tm.llama(0, layers=1)
    cfg = SamplingConfig()
    built = {spec: make_drafter(spec, draft_model=target, vocab_size=64, k=3, cfg=cfg) for spec in SPECS}
    assert [type(d) for d in built.values()] == [
        ModelDrafter,
        HeuristicDrafter,
        ConfidenceDrafter,
        PromptLookupDrafter,
        PromptLookupDrafter,
        SuffixDrafter,
        SuffixDrafter,
    ]
    assert built["suffix"].cache.depth == 24 and built["suffix:8"].cache.depth == 8
    assert built["confidence:0.5"].threshold == 0.5 and built["prompt-lookup:3"].max_ngram == 3
    assert all(d.k == 3 for d in built.values())
    make_drafter("prompt-lookup:2", draft_model=None, vocab_size=64, k=3, cfg=cfg)
    for spec in ("model", "heuristic", "confidence:0.5"):
        with pytest.raises(DraftLabError, match="none is loaded.*prompt-lookup:N"):
            make_drafter(spec, draft_model=None, vocab_size=64, k=3, cfg=cfg)
    with pytest.raises(DraftLabError, match="k must be a positive integer"):
        make_drafter("prompt-lookup:2", draft_model=None, vocab_size=64, k=0, cfg=cfg)


def test_speculative_decoder_keeps_its_signature_and_defaults_to_model():
    p = _pair("llama")
    cfg = SamplingConfig(temperature=0, max_new_tokens=8)
    assert type(runs.speculative_decoder(p, cfg, 2).drafter) is ModelDrafter
    assert type(runs.speculative_decoder(p, cfg, 2, None, "heuristic").drafter) is HeuristicDrafter
    with pytest.raises(DraftLabError, match="unknown drafter"):
        runs.speculative_decoder(p, cfg, 2, drafter="eagle")
    no_draft = dataclasses.replace(p, draft=None)
    assert type(runs.speculative_decoder(no_draft, cfg, 2, drafter="prompt-lookup:2").drafter) is PromptLookupDrafter
    with pytest.raises(DraftLabError, match="none is loaded"):
        runs.speculative_decoder(no_draft, cfg, 2)
    assert runs.context_limit(no_draft) == 256


# --- lossless: greedy ------------------------------------------------------------------------------------------


def _pair(family: str, noise: float = 0.6, eos: bool = True, sharpness: float = 4.0):
    build = getattr(tm, family)
    target = build(0, layers=2, sharpness=sharpness, eos=tm.EOS if eos else None)
    return tm.pair(target, tm.noisy_copy(target, seed=1, noise=noise), tm.tokenizer(64, eos=eos))


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def family(request):
    p = _pair(request.param)
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    return p, cfg, ids, list(runs.run_prompts(runs.baseline_decoder(p, cfg), PROMPTS, ids))


def check_rounds(result, limit):
    """The round identities every drafter's records keep."""
    assert sum(len(r.emitted_ids) for r in result.rounds) == result.new_tokens
    left = limit
    for r in result.rounds:
        outcomes = [t.outcome for t in r.draft_tokens]
        assert len(outcomes) == r.k <= left - 1
        assert outcomes == sorted(outcomes, key=[ACCEPTED, REJECTED, DISCARDED].index)
        assert outcomes.count(ACCEPTED) == r.accepted and outcomes.count(REJECTED) <= 1
        assert r.emitted_ids[: r.accepted] == [t.token_id for t in r.draft_tokens[: r.accepted]]
        assert [t.position for t in r.draft_tokens] == list(range(1, r.k + 1))
        left -= len(r.emitted_ids)


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("spec", SPECS)
def test_every_drafter_greedy_equals_target_only(family, spec, k):
    p, cfg, ids, base = family
    if not needs_draft_model(spec):
        p = dataclasses.replace(p, draft=None)  # prompt lookup runs without a draft model at all
    spec_results = list(runs.run_prompts(runs.speculative_decoder(p, cfg, k, drafter=spec), PROMPTS, ids))
    assert [s.output_ids for s in spec_results] == [b.output_ids for b in base]
    for s in spec_results:
        check_rounds(s, NEW)
    tokens = [t for s in spec_results for r in s.rounds for t in r.draft_tokens]
    m = speculative_metrics(spec_results, base)
    assert m["proposed"] > 0 and 0 < m["accepted"]
    if not needs_draft_model(spec):  # model-free: point masses, no logits
        assert all(math.isnan(t.kl) and t.p_draft == 1.0 and t.beta == t.p_target for t in tokens)
        assert all(r.draft_forwards == 0 for s in spec_results for r in s.rounds)
    else:
        assert all(math.isfinite(t.kl) for t in tokens)
        assert all(r.draft_forwards == r.k for s in spec_results for r in s.rounds)
    if spec != "model" and k > 1:
        assert len({r.k for s in spec_results for r in s.rounds}) > 1  # k_r varies per round


@pytest.mark.parametrize("family_name", ["llama", "gpt2"])
def test_target_as_its_own_draft_accepts_everything(family_name):
    """A draft sweep including the target itself as the draft: greedy, every draft is accepted (alpha == 1)."""
    target = getattr(tm, family_name)(0, layers=2, sharpness=4.0)
    p = tm.pair(target, target)
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), PROMPTS, ids))
    for k in (1, 2, 4, 8):
        res = list(runs.run_prompts(runs.speculative_decoder(p, cfg, k, drafter="model"), PROMPTS, ids))
        m = speculative_metrics(res, base)
        assert [s.output_ids for s in res] == [b.output_ids for b in base]
        assert m["alpha"] == 1.0 and m["rejected"] == 0 and m["accepted"] > 0
        # Every round but an EOS-cut last one emits all its drafts plus a bonus.
        for s in res:
            assert all(r.accepted == r.k and r.emitted_kinds[-1] == BONUS for r in s.rounds[:-1])


# --- lossless: sampling ----------------------------------------------------------------------------------------

V, SAMPLE_NEW, SAMPLES, SAMPLE_K = 6, 4, 1200, 3
SAMPLING = SamplingConfig(temperature=0.8, top_k=50, max_new_tokens=SAMPLE_NEW, seed=11)


@pytest.fixture(scope="module")
def sampling_setup():
    target = tm.llama(0, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)
    draft = tm.llama(7, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)  # independent: often disagrees
    p = tm.pair(target, draft, tm.tokenizer(V, eos=False))
    prompt_ids = runs.encode_prompts(p, ["t2 t3 t2"], SAMPLE_NEW)[0]  # t2 recurs: prompt lookup drafts at once
    return p, prompt_ids


def exact_joint(model, prompt_ids, cfg):
    """P(t1..tn | prompt) under the target's processed distributions (cfg), by enumerating every continuation."""
    with torch.no_grad():
        probs, seqs = torch.ones(1), prompt_ids
        for _ in range(cfg.max_new_tokens):
            nxt = probabilities(model(seqs).logits[:, -1, :V], cfg)
            probs = (probs[:, None] * nxt).reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(seqs.shape[0])[:, None]], 1)
    return probs.numpy()


def sample_counts(p, prompt_ids, spec, cfg):
    decoder = runs.speculative_decoder(p, cfg, SAMPLE_K, drafter=spec)
    counts, rounds = np.zeros(V**cfg.max_new_tokens), []
    for i in range(SAMPLES):  # prompt index i -> generator seeded by (seed, i): independent draws
        result = decoder.generate("", prompt_ids, i)
        counts[np.ravel_multi_index(result.output_ids, (V,) * cfg.max_new_tokens)] += 1
        rounds += result.rounds
    return counts, rounds


@pytest.mark.parametrize("spec", ["model", "heuristic", "confidence:0.7", "prompt-lookup:2"])
def test_every_drafter_samples_the_targets_distribution(sampling_setup, spec):
    p, prompt_ids = sampling_setup
    if not needs_draft_model(spec):
        p = dataclasses.replace(p, draft=None)
    counts, rounds = sample_counts(p, prompt_ids, spec, SAMPLING)
    assert chi2_pvalue(counts, exact_joint(p.target.model, prompt_ids, SAMPLING)) > 1e-3
    # The test only means something if drafts were both accepted and rejected, with k_r varying.
    assert sum(r.accepted for r in rounds) > 200 and sum(r.rejected for r in rounds) > 200
    assert len(collections.Counter(r.k for r in rounds)) > 1
    if spec.startswith("confidence"):  # stopped early in some rounds, drafted all three in others
        ks = collections.Counter(r.k for r in rounds if r.round_index == 0)
        assert ks[SAMPLE_K] > 50 and ks[2] > 50


def test_point_masses_outside_the_targets_top_k_stay_lossless(sampling_setup):
    """top-k 3 of 6: prompt lookup often proposes a token the target's filter removed (p_t(x) = 0, rejected
    for sure); the correction then comes from the rest of p_t."""
    p, _ = sampling_setup
    p = dataclasses.replace(p, draft=None)
    cfg = dataclasses.replace(SAMPLING, top_k=3)
    prompt_ids = runs.encode_prompts(p, ["t0 t1 t0"], SAMPLE_NEW)[0]
    counts, rounds = sample_counts(p, prompt_ids, "prompt-lookup:2", cfg)
    tokens = [t for r in rounds for t in r.draft_tokens]
    assert sum(t.p_target == 0 for t in tokens) > 500 and sum(t.outcome == ACCEPTED for t in tokens) > 200
    assert chi2_pvalue(counts, exact_joint(p.target.model, prompt_ids, cfg)) > 1e-3


def test_a_broken_point_mass_correction_is_detected(sampling_setup, monkeypatch):
    """Correcting from p_t instead of p_t without the rejected token biases prompt lookup: the chi-squared sees it."""
    p, prompt_ids = sampling_setup
    p = dataclasses.replace(p, draft=None)
    monkeypatch.setattr(verification, "residual_distribution", lambda p_t, p_d: p_t)
    counts, _ = sample_counts(p, prompt_ids, "prompt-lookup:2", SAMPLING)
    assert chi2_pvalue(counts, exact_joint(p.target.model, prompt_ids, SAMPLING)) < 1e-6


def test_verify_treats_a_point_mass_exactly():
    """p_d = one-hot(x): accept with probability p_t(x); on rejection draw from max(0, p_t - onehot(x)), i.e.
    p_t with x removed, renormalised; a token the target rules out is always rejected, a certain one accepted."""
    cfg = SamplingConfig(temperature=1.0)
    p_t = torch.tensor([[0.1, 0.6, 0.3, 0.0], [0.25, 0.25, 0.25, 0.25]])
    g = torch.Generator().manual_seed(0)
    draws = 20000
    proposal = Proposal.point_masses([[1]], 4, torch.device("cpu"))
    outcomes = collections.Counter()
    for _ in range(draws):
        n, nxt = verify_one(proposal, p_t, cfg, g)
        outcomes[(int(n), int(nxt))] += 1
    accepted = sum(c for (n, _), c in outcomes.items() if n == 1)
    assert abs(accepted / draws - 0.6) < 4 * math.sqrt(0.6 * 0.4 / draws)
    rejected = {t: c for (n, t), c in outcomes.items() if n == 0}
    assert set(rejected) <= {0, 2}  # never the rejected token itself, never a zero-probability one
    assert abs(rejected[0] / sum(rejected.values()) - 0.25) < 0.03  # 0.1 / (0.1 + 0.3)
    assert torch.equal(verification.residual_distribution(p_t[0], proposal.probs[0, 0]), torch.tensor([0.1, 0, 0.3, 0]))
    for token, expected in ((3, 0), (1, 1)):  # p_t(x) = 0: always rejected; p_t(x) = 1: always accepted
        certain = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
        single = Proposal.point_masses([[token]], 4, torch.device("cpu"))
        assert {int(verify_one(single, certain, cfg, g)[0]) for _ in range(200)} == {expected}


def verify_one(proposal, p_target, cfg, generator):
    """The verification of a one-row proposal against p_target [k + 1, V]: (accepted, next token)."""
    n, next_token = verification.verify_rows(
        proposal.tokens, proposal.probs, proposal.ks, proposal.valid, p_target[None], cfg, [generator]
    )[:2]
    return n[0], next_token[0]


# --- each drafter follows its reference round by round ---------------------------------------------------------

HF_SETTINGS = {  # our spec -> the assistant generation_config transformers needs for the same rounds
    "model": dict(num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0),
    "heuristic": dict(num_assistant_tokens_schedule="heuristic", assistant_confidence_threshold=0.0),
    "confidence:0.2": dict(num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.2),
}


def hf_assisted_rounds(target, draft, prompt_ids, k, settings, new):
    """(candidates, matches) of every round of transformers' greedy assisted generation, and its output."""
    from transformers.generation import candidate_generator as cg

    rounds = []
    original = cg.AssistedCandidateGenerator.update_candidate_strategy

    def spy(self, input_ids, scores, num_matches):
        rounds.append((scores.shape[1] - 1, int(num_matches)))
        return original(self, input_ids, scores, num_matches)

    draft.generation_config.num_assistant_tokens = k  # "heuristic" writes its last k back here after a call
    for key, value in settings.items():
        setattr(draft.generation_config, key, value)
    cg.AssistedCandidateGenerator.update_candidate_strategy = spy
    try:
        out = target.generate(
            prompt_ids,
            assistant_model=draft,
            do_sample=False,
            max_new_tokens=new,
            attention_mask=torch.ones_like(prompt_ids),
            pad_token_id=0,
        )
    finally:
        cg.AssistedCandidateGenerator.update_candidate_strategy = original
    return rounds, out[0, prompt_ids.shape[1] :].tolist()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def good_draft_family(request):
    """A draft that often agrees (so k grows under the heuristic), peaked distributions (top probabilities around
    0.1-0.3, so a threshold of 0.2 both stops and lets rounds run) and no EOS (transformers' assistant would stop
    drafting at one)."""
    return _pair(request.param, noise=0.25, eos=False, sharpness=12.0)


@pytest.mark.parametrize("spec", list(HF_SETTINGS))
def test_model_drafters_match_transformers_assisted_generation_round_by_round(good_draft_family, spec):
    p = good_draft_family
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    decoder = runs.speculative_decoder(p, cfg, 3, drafter=spec)
    ks = set()
    for i, (prompt, prompt_ids) in enumerate(zip(PROMPTS, ids)):
        ours = decoder.generate(prompt, prompt_ids, i)
        theirs, output = hf_assisted_rounds(p.target.model, p.draft.model, prompt_ids, 3, HF_SETTINGS[spec], NEW)
        assert ours.output_ids == output
        assert [(r.k, r.accepted) for r in ours.rounds] == theirs
        ks |= set(uncapped_ks(ours, 3))
    assert ks == {3} if spec == "model" else len(ks) > 1


def uncapped_ks(result, k):
    """k_r of the rounds the token budget did not cap (near the end a round may draft fewer than k)."""
    done, ks = 0, []
    for r in result.rounds:
        if NEW - done - 1 >= k:
            ks.append(r.k)
        done += len(r.emitted_ids)
    return ks


@pytest.mark.parametrize("start_k", [1, 2, 5])
def test_heuristic_k_follows_transformers_schedule(good_draft_family, start_k):
    """k_r of every round == the rule applied to the recorded rounds (k += 2 after a round whose k_r drafts
    were all accepted, else max(1, k - 1)), capped by the budget; the same numbers as transformers' own
    AssistedCandidateGenerator.update_candidate_strategy when fed those rounds."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    p = good_draft_family
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    results = list(runs.run_prompts(runs.speculative_decoder(p, cfg, start_k, drafter="heuristic"), PROMPTS, ids))
    grew = shrank = 0
    for prompt_ids, result in zip(ids, results):
        p.draft.model.generation_config.num_assistant_tokens = start_k
        p.draft.model.generation_config.num_assistant_tokens_schedule = "heuristic"
        p.draft.model.generation_config.assistant_confidence_threshold = 0.0
        hf = AssistedCandidateGenerator(prompt_ids, p.draft.model, GenerationConfig(max_length=10**6), {})
        k, done = start_k, 0
        for r in result.rounds:
            assert r.k == min(k, NEW - done - 1) == min(int(hf.num_assistant_tokens), NEW - done - 1)
            k = heuristic_next_k(k, r.k, r.accepted)
            hf.update_candidate_strategy(prompt_ids, torch.zeros(1, r.k + 1, 64), r.accepted)
            done += len(r.emitted_ids)
        ks = uncapped_ks(result, 1)
        grew += sum(b == a + 2 for a, b in zip(ks, ks[1:]))
        shrank += sum(b == a - 1 for a, b in zip(ks, ks[1:]))
    assert grew > 0 and shrank > 0


def test_confidence_stops_where_the_drafts_top_probability_falls_below_the_threshold(good_draft_family):
    """Greedy: a draft's p_draft is its distribution's top probability. Every draft but a round's last has top
    probability >= T; a round shorter than min(k, cap) ends on a draft below T (which is kept and verified)."""
    p = good_draft_family
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    threshold, k = 0.2, 5
    results = list(
        runs.run_prompts(runs.speculative_decoder(p, cfg, k, drafter=f"confidence:{threshold}"), PROMPTS, ids)
    )
    early = full = 0
    for result in results:
        done = 0
        for r in result.rounds:
            cap = min(k, NEW - done - 1)
            tops = [t.p_draft for t in r.draft_tokens]
            assert all(top >= threshold for top in tops[:-1])
            if r.k < cap:
                assert tops and tops[-1] < threshold
                early += 1
            elif r.k > 1:
                full += 1
            done += len(r.emitted_ids)
    assert early > 5 and full > 0


# --- prompt lookup ---------------------------------------------------------------------------------------------


def lookup(sequence, max_ngram, k, eos=()):
    drafter = PromptLookupDrafter(max_ngram, 100, k, eos)
    drafter.start([torch.tensor(sequence)], [list(sequence)], [0])
    proposal = drafter.propose([torch.tensor(sequence)], [list(sequence)], [None], [k])
    return proposal.tokens[0, : proposal.ks[0]].tolist()


def reference_lookup(seq, max_ngram, k, eos=()):
    """Brute force: longest n-gram (max_ngram >= n >= 1) ending seq with an earlier occurrence; its earliest one."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        for start in range(len(seq) - n):
            if seq[start : start + n] == seq[-n:]:
                follow = seq[start + n : start + n + k]
                return follow[: next((i for i, t in enumerate(follow) if t in eos), len(follow))]
    return []


def test_prompt_lookup_proposes_the_continuation_of_the_longest_match():
    assert lookup([7, 4, 8, 3, 4, 9, 3, 4], 2, 3) == [9, 3, 4]  # the 2-gram (3, 4) wins over the 1-gram (4)
    assert lookup([7, 4, 8, 3, 4, 9, 3, 4], 1, 3) == [8, 3, 4]  # 1-grams only: (4) first occurs at index 1
    assert lookup([5, 8, 5, 9, 5], 1, 3) == [8, 5, 9]  # the earliest occurrence, as transformers takes it
    assert lookup([5, 6, 7, 5, 6], 2, 9) == [7, 5, 6]  # the continuation may run up to the sequence's end
    assert lookup([5, 6, 7, 5, 6], 2, 2) == [7, 5]  # at most k
    assert lookup([5, 6, 1, 2, 5, 6], 2, 3, eos={1}) == []  # cut before the first EOS (transformers)
    assert lookup([1, 2, 3, 4], 3, 3) == []  # no earlier occurrence: no drafts
    assert lookup([4], 3, 3) == []


def test_prompt_lookup_equals_transformers_prompt_lookup_candidate_generator():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(0)
    for trial in range(400):
        seq = [rng.randrange(2 + trial % 6) for _ in range(rng.randrange(1, 30))]
        n, k = rng.randrange(1, 5), rng.randrange(1, 8)
        eos = {0} if trial % 3 == 0 else set()
        hf = PromptLookupCandidateGenerator(torch.tensor(sorted(eos)) if eos else None, k, n, max_length=10**6)
        candidates, _ = hf.get_candidates(torch.tensor([seq]))
        expected = candidates[0, len(seq) :].tolist()
        assert lookup(seq, n, k, eos) == expected == reference_lookup(seq, n, k, eos), (seq, n, k, eos)


def test_prompt_lookup_index_grows_with_the_sequence():
    """Between rounds the drafter reads only the new tokens; proposals equal a fresh lookup every time."""
    rng = random.Random(1)
    seq = [rng.randrange(4) for _ in range(5)]
    drafter = PromptLookupDrafter(3, 10, 4, ())
    drafter.start([torch.tensor(seq)], [list(seq)], [0])
    for _ in range(60):
        seq += [rng.randrange(4) for _ in range(rng.randrange(1, 4))]
        proposal = drafter.propose([torch.tensor(seq)], [list(seq)], [None], [4])
        got = proposal.tokens[0, : proposal.ks[0]].tolist()
        assert got == reference_lookup(seq, 3, 4)


@pytest.mark.parametrize("family_name", ["llama", "gpt2"])
def test_prompt_lookup_rounds_and_no_match_fallback(family_name):
    """Without a draft model: each round proposes the lookup of the sequence so far (capped by the budget);
    where nothing matches the round has no drafts and emits one target token (a bonus). Candidates equal
    transformers' generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=N) round by round."""
    from transformers.generation import candidate_generator as cg

    p = dataclasses.replace(_pair(family_name, eos=False), draft=None)
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    base = list(runs.run_prompts(runs.baseline_decoder(p, cfg), PROMPTS, ids))
    k, n = 4, 2
    results = list(runs.run_prompts(runs.speculative_decoder(p, cfg, k, drafter=f"prompt-lookup:{n}"), PROMPTS, ids))
    assert [s.output_ids for s in results] == [b.output_ids for b in base]
    empty = 0
    for prompt_ids, result in zip(ids, results):
        seq, done = prompt_ids[0].tolist(), 0
        hf_lengths = []
        original = cg.PromptLookupCandidateGenerator.get_candidates

        def spy(self, input_ids, original=original, hf_lengths=hf_lengths, **kwargs):
            candidates, logits = original(self, input_ids, **kwargs)
            hf_lengths.append(candidates.shape[1] - input_ids.shape[1])
            return candidates, logits

        cg.PromptLookupCandidateGenerator.get_candidates = spy
        try:
            out = p.target.model.generate(
                prompt_ids,
                prompt_lookup_num_tokens=k,
                max_matching_ngram_size=n,
                do_sample=False,
                max_new_tokens=NEW,
                pad_token_id=0,
                attention_mask=torch.ones_like(prompt_ids),
            )
        finally:
            cg.PromptLookupCandidateGenerator.get_candidates = original
        assert out[0, prompt_ids.shape[1] :].tolist() == result.output_ids
        assert len(hf_lengths) == len(result.rounds)
        for r, hf_length in zip(result.rounds, hf_lengths):
            cap = NEW - done - 1
            assert [t.token_id for t in r.draft_tokens] == reference_lookup(seq, n, min(k, cap))
            assert r.k == min(hf_length, cap)  # transformers crops past the budget after verifying instead
            if r.k == 0:
                empty += 1
                assert len(r.emitted_ids) == 1 and r.emitted_kinds == [BONUS] and r.draft_forwards == 0
            seq += r.emitted_ids
            done += len(r.emitted_ids)
    assert empty > 0 and sum(r.k > 0 for s in results for r in s.rounds) > 0


def test_draftlab_run_with_a_model_free_drafter_and_no_draft_loads_the_target_alone(tmp_path, model_dirs, capsys):
    """`draftlab run --drafter prompt-lookup:3` without --draft: the experiment stores no draft and its baseline and
    runs load the target alone (an empty draft name was once loaded as a model directory and failed every run)."""
    import json

    from app.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t5 t6 t5 t6 t5\nt9 t3 t9 t3\n")
    db = f"sqlite:///{tmp_path / 'free.db'}"
    assert (
        main(
            [
                "run",
                "--target",
                model_dirs["target"],
                "--drafter",
                "prompt-lookup:3",
                "--prompts",
                str(prompts),
                "--k",
                "2",
                "--max-new-tokens",
                "8",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--db",
                db,
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"]["status"] == "done"
    (run,) = doc["runs"]
    assert (run["status"], run["drafter"], run["draft"], run["outputs_match_baseline"]) == (
        "done",
        "prompt-lookup:3",
        None,
        True,
    )


def test_the_drafter_help_lists_every_declaration(monkeypatch):
    from engine.config import variables

    assert all(spec.usage in variables.VARIABLES["drafter"].help for spec in DRAFTER_SPECS.values())
    spec = DrafterSpec("repeat-last", "the last token, k times", needs_model=False, serving=_nowhere())
    monkeypatch.setitem(DRAFTER_SPECS, "repeat-last", spec)
    assert "repeat-last" in variables._drafter_help()
