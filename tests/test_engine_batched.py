"""Batched decoding (engine/decoding/speculative.py, engine/decoding/baseline.py: one loop, batch 1 its one-row case) is
lossless per row: greedy rows equal the target-only decoding of that prompt alone token for token, and yield the records
a
one-row decode of it yields (Llama-style and GPT-2-style pairs,
every drafter, batch 1, 3 and 8, prompts of different lengths); sampled rows follow the target's exact
distribution at batch 8 (chi-squared, T 1 / top-p 0.95 and top-k); rows finishing at different times leave the
batch. Broken rollback, compaction or correction rule is detected."""

import math
from typing import Any

import numpy as np
import pytest
import torch

from engine.config.drafter_specs import SPECS
from engine.decoding import drafting, runs, speculative, verification
from engine.decoding.batched_cache import BatchCache
from engine.decoding.sampling import SamplingConfig, probabilities
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import speculative_metrics
from tests import tiny_models as tm
from tests.test_engine_sampling import chi2_pvalue

PROMPTS = [
    "t5",
    "t9 t3 t22",
    "t40 t41 t2 t8 t9 t10 t11 t12 t13 t14 t15 t16 t17 t18 t19 t20 t21 t22 t23 t24 t25",
    "t7 t7 t8",
    "t3 t4 t5 t6 t3 t4 t5",
    "t30 t31",
    "t11 t12 t13 t11 t12 t13 t11 t12 t13 t11",
    "t50 t2 t60 t2 t50 t2",
]
NEW = 32
K = 3
DRAFTERS = ["model", "heuristic", "confidence:0.5", "prompt-lookup:2", "suffix:8"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def family(request):
    target = getattr(tm, request.param)(0, layers=2, sharpness=4.0)
    pair = tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.6))
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(pair, PROMPTS, NEW)
    alone = runs.baseline_decoder(pair, cfg)
    return pair, cfg, ids, [alone.generate(p, i, n).output_ids for n, (p, i) in enumerate(zip(PROMPTS, ids))]


_batch1_cache: dict[Any, Any] = {}


def batch1_rounds(family, drafter):
    """The batch-1 speculative loop's results for every prompt (the records a batched row must reproduce)."""
    key = (id(family), drafter)
    if key not in _batch1_cache:
        pair, cfg, ids, _ = family
        decoder = runs.speculative_decoder(pair, cfg, K, drafter=drafter)
        _batch1_cache[key] = [decoder.generate(p, i, n) for n, (p, i) in enumerate(zip(PROMPTS, ids))]
    return _batch1_cache[key]


def decode_in_batches(decoder, prompts, ids, batch):
    """Every prompt decoded in consecutive batches of `batch` (the last holding what is left), in order."""
    out = []
    for s in range(0, len(prompts), batch):
        e = min(s + batch, len(prompts))
        out += decoder.generate_batch(prompts[s:e], ids[s:e], list(range(s, e)))
    return out


def same_records(row, ref):
    """A batched row's rounds and draft tokens equal the batch-1 loop's (the timings aside)."""
    assert len(row.rounds) == len(ref.rounds)
    for a, b in zip(row.rounds, ref.rounds):
        assert (a.prompt_index, a.round_index, a.k, a.accepted, a.emitted_ids, a.emitted_kinds) == (
            b.prompt_index,
            b.round_index,
            b.k,
            b.accepted,
            b.emitted_ids,
            b.emitted_kinds,
        )
        assert [(t.position, t.token_id, t.text, t.token_type, t.outcome) for t in a.draft_tokens] == [
            (t.position, t.token_id, t.text, t.token_type, t.outcome) for t in b.draft_tokens
        ]
        for ta, tb in zip(a.draft_tokens, b.draft_tokens):
            assert ta.p_draft == pytest.approx(tb.p_draft, abs=1e-4)
            assert ta.p_target == pytest.approx(tb.p_target, abs=1e-4)
            assert ta.beta == pytest.approx(tb.beta, abs=1e-4)
            assert (math.isnan(ta.kl) and math.isnan(tb.kl)) or ta.kl == pytest.approx(tb.kl, abs=1e-3)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_rows_equal_target_only_alone_and_batch1_records(family, drafter, batch):
    pair, cfg, ids, alone = family
    decoder = runs.speculative_decoder(pair, cfg, K, drafter=drafter)
    rows = decode_in_batches(decoder, PROMPTS, ids, batch)
    assert [r.output_ids for r in rows] == alone
    assert [r.prompt_index for r in rows] == list(range(len(PROMPTS)))
    # Suffix decoding drafts from earlier prompts' responses too, and a batch's rows enter that cache only when
    # the batch ends: at batch B a row sees fewer responses than at batch 1, so only its output is batch-invariant.
    if batch == 1 or not drafter.startswith("suffix"):
        for row, ref in zip(rows, batch1_rounds(family, drafter)):
            same_records(row, ref)
    m = speculative_metrics(rows)
    # The comparison means something only if drafts are both accepted and rejected, at different counts per row.
    assert 0 < m["accepted"] < m["proposed"] and m["rejected"] > 0


def test_batched_target_only_equals_alone(family):
    pair, cfg, ids, alone = family
    for batch in (3, 8):
        rows = decode_in_batches(runs.baseline_decoder(pair, cfg), PROMPTS, ids, batch)
        assert [r.output_ids for r in rows] == alone
        assert all(r.decode_steps == r.new_tokens - 1 and r.wall_seconds > 0 for r in rows)


def test_compaction_every_round_stays_exact(family, monkeypatch):
    """Realigning the caches whenever a hole exists (not only past 2x) changes nothing."""
    pair, cfg, ids, alone = family
    monkeypatch.setattr(speculative, "COMPACT_SLACK", 0)
    monkeypatch.setattr(drafting, "COMPACT_SLACK", 0)
    decoder = runs.speculative_decoder(pair, cfg, K)
    decoder.compact_ratio = 1.0
    rows = decoder.generate_batch(PROMPTS, ids, list(range(len(PROMPTS))))
    assert decoder.target.compactions > len(PROMPTS)  # more than one per finishing row: it did realign
    assert [r.output_ids for r in rows] == alone


def test_broken_rollback_is_detected(family, monkeypatch):
    """Mutation: a rollback that keeps rejected drafts' columns visible breaks greedy equality."""
    pair, cfg, ids, alone = family
    monkeypatch.setattr(BatchCache, "rollback", lambda self, lengths: None)
    rows = runs.speculative_decoder(pair, cfg, K).generate_batch(PROMPTS, ids, list(range(len(PROMPTS))))
    assert [r.output_ids for r in rows] != alone


def test_broken_compaction_is_detected(family, monkeypatch):
    """Mutation: realigning the mask but not the keys/values breaks greedy equality."""
    pair, cfg, ids, alone = family
    original = BatchCache.compact

    def mask_only(self, rows=None):
        layers = [(layer, layer.keys, layer.values) for layer in self.cache.layers]
        original(self, rows)
        if rows is None:  # realignment only: put the old (unmoved) tensors back
            for layer, keys, values in layers:
                layer.keys, layer.values = keys, values

    monkeypatch.setattr(BatchCache, "compact", mask_only)
    decoder = runs.speculative_decoder(pair, cfg, K)
    decoder.compact_ratio = 1.0
    monkeypatch.setattr(speculative, "COMPACT_SLACK", 0)
    monkeypatch.setattr(drafting, "COMPACT_SLACK", 0)
    rows = decoder.generate_batch(PROMPTS, ids, list(range(len(PROMPTS))))
    assert [r.output_ids for r in rows] != alone


# --- rows finishing at different times -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eos_pair():
    target = tm.llama(3, sharpness=3.0, eos=tm.EOS)
    with torch.no_grad():  # make EOS likely so it is actually hit mid-generation
        target.lm_head.weight[tm.EOS] += 0.9 * target.lm_head.weight.std() * 2
    return tm.pair(target, tm.noisy_copy(target, 2, 0.5))


@pytest.mark.parametrize("drafter", ["model", "prompt-lookup:2", None])
def test_rows_finishing_at_different_times_leave_the_batch(eos_pair, drafter, monkeypatch):
    prompts = [f"t{i} t{i + 1}" + f" t{i + 2}" * (i % 5) for i in range(2, 18)]
    cfg = SamplingConfig(temperature=0, max_new_tokens=30)
    ids = runs.encode_prompts(eos_pair, prompts, 30)
    alone = [b.output_ids for b in runs.run_prompts(runs.baseline_decoder(eos_pair, cfg), prompts, ids)]
    lengths = sorted({len(a) for a in alone})
    assert any(a[-1] == tm.EOS for a in alone) and len(lengths) > 3, "the test needs rows ending at different times"
    widths = []
    forward = BatchCache.forward

    def counting(self, ids_, valid, keep=None, **options):
        if self is decoder.target:
            widths.append(ids_.shape[0])
        return forward(self, ids_, valid, keep, **options)

    monkeypatch.setattr(BatchCache, "forward", counting)
    decoder = (
        runs.baseline_decoder(eos_pair, cfg)
        if drafter is None
        else runs.speculative_decoder(eos_pair, cfg, 4, drafter=drafter)
    )
    rows = decoder.generate_batch(prompts, ids, list(range(len(prompts))))
    assert [r.output_ids for r in rows] == alone
    # Finished rows stop costing work: the target's forwards shrink as rows finish, down to the last row alone.
    assert widths[0] == len(prompts) and widths[-1] == 1 and widths == sorted(widths, reverse=True)
    assert len(set(widths)) > 3
    # Each row's wall time is its own latency: rows that finished sooner report less.
    walls = {len(a): r.wall_seconds for a, r in zip(alone, rows)}
    assert walls[lengths[0]] <= walls[lengths[-1]]


# --- sampled rows follow the target's distribution -------------------------------------------------------------

V, NEW_S, SAMPLES = 6, 3, 1200
SAMPLED_PROMPTS = ["t2 t3", "t4 t1 t5 t0 t3"]  # different lengths in one batch: left padding in play


@pytest.fixture(scope="module")
def sampled_pair():
    target = tm.llama(0, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)
    draft = tm.llama(7, layers=1, vocab=V, hidden=16, sharpness=25.0, eos=None)  # independent: often disagrees
    return tm.pair(target, draft, tm.tokenizer(V, eos=False))


def exact_joint(model, prompt_ids, cfg):
    """P(t1, t2, t3 | prompt) under the target's processed distributions (temperature, top-k, top-p)."""
    with torch.no_grad():
        probs, seqs = torch.ones(1), prompt_ids
        for _ in range(NEW_S):
            nxt = probabilities(model(seqs).logits[:, -1, :V], cfg)
            probs = (probs[:, None] * nxt).reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(seqs.shape[0])[:, None]], 1)
    return probs.numpy()


def sampled_pvalues(pair, cfg, drafter):
    ids = runs.encode_prompts(pair, SAMPLED_PROMPTS, NEW_S)
    decoder = runs.speculative_decoder(pair, cfg, 2, drafter=drafter)
    counts = [np.zeros(V**NEW_S) for _ in SAMPLED_PROMPTS]
    for b in range(SAMPLES * len(SAMPLED_PROMPTS) // 8):  # batches of 8 rows, both prompts alternating
        index = list(range(b * 8, b * 8 + 8))  # prompt index -> its own generator: independent draws
        rows = decoder.generate_batch([SAMPLED_PROMPTS[i % 2] for i in index], [ids[i % 2] for i in index], index)
        for i, row in zip(index, rows):
            counts[i % 2][np.ravel_multi_index(row.output_ids, (V,) * NEW_S)] += 1
    return [chi2_pvalue(c, exact_joint(pair.target.model, i, cfg)) for c, i in zip(counts, ids)]


TOP_P = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=NEW_S, seed=11)
TOP_K = SamplingConfig(temperature=1.0, top_k=3, max_new_tokens=NEW_S, seed=12)
GREEDY_DRAFTS = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=NEW_S, seed=13, draft_sampling="greedy")


@pytest.mark.parametrize(
    "cfg, drafter",
    [
        (TOP_P, "model"),
        (TOP_K, "model"),
        (TOP_P, "prompt-lookup:1"),
        (TOP_K, "confidence:0.6"),
        (TOP_P, "heuristic"),
        (GREEDY_DRAFTS, "model"),
    ],
)
def test_sampled_rows_follow_target_distribution_at_batch_8(sampled_pair, cfg, drafter):
    assert min(sampled_pvalues(sampled_pair, cfg, drafter)) > 1e-3


def test_broken_correction_rule_is_detected_at_batch_8(sampled_pair, monkeypatch):
    # Drawing the correction from p_t instead of normalize(max(0, p_t - p_d)) biases the output.
    monkeypatch.setattr(verification, "residual_distribution", lambda p_t, p_d: p_t)
    assert min(sampled_pvalues(sampled_pair, TOP_P, "model")) < 1e-6


def test_sampled_row_draws_as_the_batch1_loop_does(sampled_pair):
    """A row draws from its own prompt's generator, in the batch-1 loop's order: the same prompt index gives the
    batch-1 loop's output, whatever decodes beside it (exactly, as long as the batched forward's float rounding
    flips no draw: none does for these tiny models)."""
    ids = runs.encode_prompts(sampled_pair, SAMPLED_PROMPTS, NEW_S)
    for drafter, sampling in (("model", "probabilistic"), ("prompt-lookup:1", "probabilistic"), ("model", "greedy")):
        cfg = SamplingConfig(temperature=1.0, top_k=4, max_new_tokens=NEW_S, seed=5, draft_sampling=sampling)
        single = runs.speculative_decoder(sampled_pair, cfg, 2, drafter=drafter)
        alone = [single.generate(SAMPLED_PROMPTS[i % 2], ids[i % 2], i).output_ids for i in range(16)]
        decoder = runs.speculative_decoder(sampled_pair, cfg, 2, drafter=drafter)
        together = decoder.generate_batch(
            [SAMPLED_PROMPTS[i % 2] for i in range(16)], [ids[i % 2] for i in range(16)], list(range(16))
        )
        assert [r.output_ids for r in together] == alone
        assert len(set(map(tuple, alone))) > 4  # the draws differ from row to row


# --- the registry and the input checks ------------------------------------------------------------------------


def test_every_drafter_spec_has_its_drafter_class():
    assert set(drafting.DRAFTERS) == set(SPECS)
    assert all(drafting.drafter_class(name).spec is spec for name, spec in SPECS.items())


@pytest.mark.parametrize("size", [0, -1, 2.5, True, "4"])
def test_bad_batch_size_is_refused_in_one_line(family, size):
    pair, cfg, ids, _ = family
    with pytest.raises(DraftLabError, match="batch size must be a positive integer"):
        list(runs.run_batches(runs.baseline_decoder(pair, cfg), PROMPTS, ids, size))


def test_run_batches_covers_every_prompt_once_in_order(family):
    pair, cfg, ids, alone = family
    batches = list(runs.run_batches(runs.baseline_decoder(pair, cfg), PROMPTS, ids, 3))
    assert [len(b) for b in batches] == [3, 3, 2]  # the last batch holds what is left
    assert [r.output_ids for b in batches for r in b] == alone


def test_peak_cache_bytes_grow_with_the_batch(family):
    pair, cfg, ids, _ = family
    peaks = []
    for batch in (1, 8):
        decoder = runs.speculative_decoder(pair, cfg, K)
        decoder.generate_batch(PROMPTS[:batch], ids[:batch], list(range(batch)))
        peaks.append(decoder.peak_cache_bytes())
    assert 0 < peaks[0] < peaks[1]


def test_broken_row_drop_is_detected(eos_pair, monkeypatch):
    """Mutation: when rows leave, keeping the wrong rows' keys/values (the mask right) breaks greedy equality."""
    prompts = [f"t{i} t{i + 1}" + f" t{i + 2}" * (i % 5) for i in range(2, 18)]
    cfg = SamplingConfig(temperature=0, max_new_tokens=30)
    ids = runs.encode_prompts(eos_pair, prompts, 30)
    alone = [b.output_ids for b in runs.run_prompts(runs.baseline_decoder(eos_pair, cfg), prompts, ids)]
    original = BatchCache.select

    def shuffled(self, rows):
        layers = [(layer, layer.keys, layer.values) for layer in self.cache.layers]
        original(self, rows)
        wrong = rows[1:] + rows[:1]
        for (_layer, keys, values), new in zip(layers, self.cache.layers):
            index = torch.tensor(wrong)
            new.keys = keys.index_select(0, index)[:, :, keys.shape[2] - new.keys.shape[2] :]
            new.values = values.index_select(0, index)[:, :, values.shape[2] - new.values.shape[2] :]

    monkeypatch.setattr(BatchCache, "select", shuffled)
    rows = runs.speculative_decoder(eos_pair, cfg, 4).generate_batch(prompts, ids, list(range(len(prompts))))
    assert [r.output_ids for r in rows] != alone
