"""What drafting over another vocabulary costs: demo-draft (demo-target's tokenizer) against demo-draft-othervocab (its
own 2,048-token tokenizer, drafting over the 49 % of demo-target's vocabulary both share), acceptance by token type.

    python benchmarks/bench_vocab_intersection.py                  # code and english validation prompts, k 4
    python benchmarks/bench_vocab_intersection.py --sets code:validation --k 3 --max-new-tokens 32 --temperature 0.8

Acceptance only (no timing): every prompt decoded with each draft through the engine's one loop (greedy unless
--temperature; sampled runs draft greedily, as vLLM serves a draft of another vocabulary). Per draft and token type
(engine/text/token_types.py, of the draft token) it prints the verified drafts, the acceptance rate with its 95 %
Wilson interval (engine/metrics/stats.py), and for the cross-vocabulary draft the rejections whose correction was a
token outside the shared vocabulary (`outside_vocab`, one the draft could not have proposed) as a share of the
verified drafts: the acceptance the intersection itself costs, beside what the smaller, differently trained draft
costs. Greedy outputs are checked equal to the target alone.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the imports below (noqa: E402) come from the repository root

from engine.decoding import runs  # noqa: E402
from engine.decoding.sampling import SamplingConfig  # noqa: E402
from engine.metrics.stats import wilson_interval  # noqa: E402
from engine.models.loading import load_pair, with_draft  # noqa: E402
from engine.models.vocab_bridge import outside_share, stamp  # noqa: E402
from engine.text.prompt_sets import load_prompts  # noqa: E402

DRAFTS = ("demo-draft", "demo-draft-othervocab")


def measure(pair, prompts: list[str], cfg: SamplingConfig, k: int) -> tuple[dict, list[list[int]]]:
    """{token type: [verified, accepted, outside_vocab]} over every prompt, and the outputs."""
    ids = runs.encode_prompts(pair, prompts, cfg.max_new_tokens)
    decoder = runs.speculative_decoder(pair, cfg, k)
    counts: dict = defaultdict(lambda: [0, 0, 0])
    outputs = []
    for result in runs.run_prompts(decoder, prompts, ids):
        stamp([result], pair.draft.model)
        outputs.append(result.output_ids)
        for r in result.rounds:
            for t in r.draft_tokens:
                if t.outcome == "discarded":
                    continue
                c = counts[t.token_type]
                c[0] += 1
                c[1] += t.outcome == "accepted"
                c[2] += t.outside_vocab or 0
    return dict(counts), outputs


def rate(accepted: int, verified: int) -> str:
    lo, hi = wilson_interval(accepted, verified) or (float("nan"), float("nan"))
    return f"{accepted / verified:.3f} [{lo:.3f}, {hi:.3f}]" if verified else "—"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="code:validation,english:validation")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args(argv)
    prompts = [p for name in args.sets.split(",") for p in load_prompts(name) if isinstance(p, str)]  # plain sets
    draft_sampling = "greedy" if args.temperature > 0 else "probabilistic"
    cfg = SamplingConfig(
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0, draft_sampling=draft_sampling
    )
    base = load_pair("demo-target", DRAFTS[0], "cpu")
    pairs = {DRAFTS[0]: base, DRAFTS[1]: with_draft(base, DRAFTS[1])}
    alone = None
    if cfg.greedy:
        ids = runs.encode_prompts(base, prompts, cfg.max_new_tokens)
        alone = [r.output_ids for r in runs.run_prompts(runs.baseline_decoder(base, cfg), prompts, ids)]
    other = pairs[DRAFTS[1]]
    assert other.mapping is not None
    encoded = [runs.encode_prompts(base, [p], cfg.max_new_tokens)[0][0].tolist() for p in prompts]
    print(
        f"{len(prompts)} prompts ({args.sets}), k {args.k}, {args.max_new_tokens} new tokens, temperature "
        f"{args.temperature:g}; {DRAFTS[1]}: coverage {other.vocab_coverage:.1%} ({other.mapping.shared:,} shared "
        f"tokens), {outside_share(other.mapping, encoded):.1%} of the prompts' tokens outside it\n"
    )
    results = {}
    for name, pair in pairs.items():
        counts, outputs = measure(pair, prompts, cfg, args.k)
        if alone is not None:
            assert outputs == alone, f"{name}: greedy outputs differ from the target alone"
        results[name] = counts
    types = sorted({t for c in results.values() for t in c}, key=lambda t: -results[DRAFTS[0]].get(t, [0])[0])
    print(f"| token type | {DRAFTS[0]} α [95 %] (n) | {DRAFTS[1]} α [95 %] (n) | its rejections outside the vocab |")
    print("|---|---|---|---|")
    for t in [*types, "all"]:
        row = []
        for name in DRAFTS:
            c = results[name].get(t) if t != "all" else [sum(v[i] for v in results[name].values()) for i in range(3)]
            row.append(f"{rate(c[1], c[0])} ({c[0]})" if c else "—")
        c = (
            results[DRAFTS[1]].get(t)
            if t != "all"
            else [sum(v[i] for v in results[DRAFTS[1]].values()) for i in range(3)]
        )
        share = f"{c[2]} ({c[2] / c[0]:.1%} of verified)" if c and c[0] else "—"
        print(f"| {t} | {row[0]} | {row[1]} | {share} |")
    if alone is not None:
        print("\ngreedy outputs equal the target alone for both drafts")


if __name__ == "__main__":
    main()
