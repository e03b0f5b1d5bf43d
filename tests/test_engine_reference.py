"""The cached loop produces the same rounds as a reference that recomputes the whole prefix every round
(no KV cache, no rollback): caching and cache rollback change nothing but speed."""

import pytest
import torch

from engine.decoding import runs
from engine.decoding.sampling import SamplingConfig, probabilities, prompt_generator, sample
from engine.decoding.verification import rows_to_host, verify_rows
from tests import tiny_models as tm


@torch.no_grad()
def reference_rounds(target, draft, vocab, cfg, prompt_ids, prompt_index, k, eos_ids):
    """(drafted ids, accepted, emitted, outcomes, p_draft, p_target, beta, kl, target entropy) per round, recomputing
    every prefix; the target's entropy straight from its logits (H = -sum p log p), not through the loop's code."""
    g = prompt_generator(cfg.seed, prompt_index, "cpu")
    full = lambda model, seq: model(seq).logits[0, :, :vocab]  # noqa: E731
    seq, out, rounds = prompt_ids, [], []
    while len(out) < cfg.max_new_tokens and not (out and out[-1] in eos_ids):
        k_r = min(k, cfg.max_new_tokens - len(out) - 1)  # the round's k_r + 1 tokens fit the budget
        cur = seq
        tokens = torch.empty(0, dtype=torch.long)
        probs = raw = torch.empty(0, vocab)
        for _ in range(k_r):
            logits = full(draft, cur)[-1]
            p = probabilities(logits, cfg)
            t = sample(p, cfg, g)
            tokens, probs, raw = (
                torch.cat([tokens, t.view(1)]),
                torch.cat([probs, p[None]]),
                torch.cat([raw, logits[None]]),
            )
            cur = torch.cat([cur, t.view(1, 1)], 1)
        t_logits = full(target, cur)[-(k_r + 1) :]
        p_t = probabilities(t_logits, cfg)
        n, nxt = verify_rows(tokens[None], probs[None], [k_r], None, p_t[None], cfg, [g])[:2]
        row = rows_to_host(tokens[None], probs[None], raw[None], [k_r], p_t[None], t_logits[None], n, nxt).rows[0]
        emitted = row.drafted[: row.accepted] + [row.next_token]
        for j, tok in enumerate(emitted):
            if tok in eos_ids:
                emitted = emitted[: j + 1]
                break
        emitted = emitted[: cfg.max_new_tokens - len(out)]
        accepted = min(row.accepted, len(emitted))  # EOS and budget cuts alike: only emitted drafts count
        outcomes = [
            "accepted" if i < accepted else "rejected" if i == row.accepted < len(emitted) else "discarded"
            for i in range(k_r)
        ]
        log_t = t_logits[:k_r].float().log_softmax(-1)
        entropy = (-(log_t.exp() * log_t).sum(-1)).tolist()
        rounds.append((row.drafted, accepted, emitted, outcomes, row.p_draft, row.p_target, row.beta, row.kl, entropy))
        out += emitted
        seq = torch.cat([seq, torch.tensor([emitted])], 1)
    return out, rounds


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_loop_matches_full_recompute(family, temperature):
    target = getattr(tm, family)(0, layers=2, sharpness=4.0)
    p = tm.pair(target, tm.noisy_copy(target, 1, 0.6))
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=30, seed=4)
    prompts = ["t3 t4 t5", "t9 t10 t11 t12 t13 t14 t15 t16"]
    ids = runs.encode_prompts(p, prompts, cfg.max_new_tokens)
    decoder = runs.speculative_decoder(p, cfg, 3)
    total_rounds = rejections = 0
    for i, prompt_ids in enumerate(ids):
        got = decoder.generate(prompts[i], prompt_ids, i)
        out, ref = reference_rounds(target, p.draft.model, p.vocab_size, cfg, prompt_ids, i, 3, runs.eos_ids(p))
        assert got.output_ids == out
        assert len(got.rounds) == len(ref)
        for r, (drafted, accepted, emitted, outcomes, p_d, p_t, beta, kl, entropy) in zip(got.rounds, ref):
            assert [t.token_id for t in r.draft_tokens] == drafted
            assert r.emitted_ids == emitted
            assert r.accepted == accepted
            assert [t.outcome for t in r.draft_tokens] == outcomes
            for t, *expected in zip(r.draft_tokens, p_d, p_t, beta, kl, entropy):
                got_stats = [t.p_draft, t.p_target, t.beta, t.kl, t.target_entropy]
                assert got_stats == pytest.approx(expected, rel=1e-3, abs=1e-5)
            assert all(t.target_entropy is not None and t.target_entropy > 0.01 for t in r.draft_tokens)
        total_rounds += len(ref)
        rejections += sum(r.rejected for r in got.rounds)
    assert total_rounds >= 8 and rejections >= 2  # rollbacks really happened
