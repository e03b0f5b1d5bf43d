"""Every drafting strategy on a pair, with the engine API directly (no database): alpha, tokens/round, mean k_r and
the paired speedup per (drafter, k), plus the best k per drafter; then prompt lookup alone on other prompt sets.

    python benchmarks/bench_drafters.py  # demo-target / demo-draft, code:validation, greedy, 48 tokens
    python benchmarks/bench_drafters.py --drafters model,prompt-lookup:2 --k 1,2,4 --repeats 3

Timing: arms (the target-only baseline and every (drafter, k)) are interleaved per prompt, in a rotating order,
`--repeats` times each; a prompt's time per arm is the median of its repeats, and an arm's speedup is
sum over prompts of the baseline's times / sum of the arm's (paired: same prompts, same moments). Each decoder
gets one untimed warm-up generation first. Greedy, so alpha, rounds and outputs do not vary between repeats;
`match` says the output equals the target-only output token for token.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from typing import Any

import torch

from engine.config.drafter_specs import needs_draft_model
from engine.decoding.runs import WARMUP_TOKENS, baseline_decoder, encode_prompts, speculative_decoder
from engine.decoding.sampling import SamplingConfig
from engine.metrics.metrics_oracle import outputs_match, speculative_metrics
from engine.models.loading import load_pair
from engine.text.chat import render
from engine.text.prompt_sets import load_prompts

BASELINE = ("baseline", 0)


def measure(pair, prompts: list[str], arms: list[tuple[str, int]], cfg: SamplingConfig, repeats: int) -> dict:
    """{arm: (results of the first repeat, per-prompt median seconds)} for the baseline and every (spec, k)."""
    decoders: dict[Any, Any] = {BASELINE: baseline_decoder(pair, cfg)}
    decoders.update({arm: speculative_decoder(pair, cfg, arm[1], drafter=arm[0]) for arm in arms})
    return measure_decoders(decoders, prompts, encode_prompts(pair, prompts, cfg.max_new_tokens), cfg, repeats)


def measure_decoders(decoders: dict, prompts: list[str], ids: list, cfg: SamplingConfig, repeats: int) -> dict:
    """{arm: (results of the first repeat, per-prompt median seconds)} for every decoder (arm -> decoder, the
    baseline's among them): one untimed warm-up each, then per prompt `repeats` rounds over every arm in a rotating
    order (interleaved: drift hits every arm of a prompt alike)."""
    arms = list(decoders)
    with torch.inference_mode():
        for decoder in decoders.values():  # untimed warm-up, as run_prompts does
            decoder.generate(prompts[0], ids[0], 0, max_new_tokens=min(WARMUP_TOKENS, cfg.max_new_tokens))
        results: dict[Any, list[Any]] = {arm: [] for arm in arms}
        seconds: dict[Any, list[list[float]]] = {arm: [[] for _ in prompts] for arm in arms}
        slot = 0
        for i, (prompt, prompt_ids) in enumerate(zip(prompts, ids)):
            for repeat in range(repeats):
                shift = slot % len(arms)
                slot += 1
                for arm in arms[shift:] + arms[:shift]:
                    result = decoders[arm].generate(prompt, prompt_ids, i)
                    seconds[arm][i].append(result.wall_seconds)
                    if repeat == 0:
                        results[arm].append(result)
    return {arm: (results[arm], [statistics.median(s) for s in seconds[arm]]) for arm in arms}


def rows(measured: dict) -> list[dict]:
    base_results, base_seconds = measured[BASELINE]
    out = []
    for arm, (results, secs) in measured.items():
        if arm == BASELINE:
            continue
        m = speculative_metrics(results, base_results)
        rounds = [r for p in results for r in p.rounds]
        out.append(
            {
                "drafter": arm[0],
                "k": arm[1],
                "alpha": m["alpha"],
                "tokens_per_round": m["tokens_per_round"],
                "mean_k": sum(r.k for r in rounds) / len(rounds),
                "draft_rounds": sum(r.k > 0 for r in rounds) / len(rounds),  # rounds with at least one draft
                "speedup": sum(base_seconds) / sum(secs),
                "match": outputs_match(results, base_results),
            }
        )
    return out


def fmt(value, spec=".3f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def print_table(title: str, table: list[dict], base_tps: float) -> None:
    print(f"\n{title}  (baseline {base_tps:.1f} tok/s)")
    print(
        f"{'drafter':<16} {'k':>2} {'alpha':>6} {'tok/round':>9} {'mean k_r':>8} {'drafted':>7} {'speedup':>7}  match"
    )
    for r in table:
        print(
            f"{r['drafter']:<16} {r['k']:>2} {fmt(r['alpha']):>6} {fmt(r['tokens_per_round']):>9} "
            f"{fmt(r['mean_k'], '.2f'):>8} {fmt(r['draft_rounds'], '.2f'):>7} {fmt(r['speedup']):>7}  {r['match']}"
        )
    best: dict[Any, Any] = {}
    for r in table:
        if r["drafter"] not in best or r["speedup"] > best[r["drafter"]]["speedup"]:
            best[r["drafter"]] = r
    print("best k: " + ", ".join(f"{d} k={r['k']} ({r['speedup']:.3f}x)" for d, r in best.items()))


def base_tps(measured: dict) -> float:
    results, secs = measured[BASELINE]
    return sum(p.new_tokens for p in results) / sum(secs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo-target")
    ap.add_argument("--draft", default="demo-draft")
    ap.add_argument("--prompts", default="code:validation")
    ap.add_argument("--drafters", default="model,heuristic,confidence:0.5,prompt-lookup:3")
    ap.add_argument("--k", default="1,2,4")
    ap.add_argument(
        "--lookup-sets",
        default="code:validation,mixed:validation",
        help="prompt sets for the prompt-lookup-only section ('' to skip)",
    )
    ap.add_argument("--lookup-drafters", default="prompt-lookup:1,prompt-lookup:2,prompt-lookup:3")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts of each set")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    args = ap.parse_args(argv)
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens)
    ks = [int(k) for k in args.k.split(",")]
    pair = load_pair(args.target, args.draft, "cpu", "auto")  # sets 1 torch thread for small models
    print(
        f"{args.target} / {args.draft}, greedy, {args.max_new_tokens} new tokens, {args.repeats} repeats, "
        f"torch threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    report = {}

    def section(prompt_spec: str, drafters: list[str], title: str) -> None:
        prompts = render(load_prompts(prompt_spec)[: args.limit or None], pair.tokenizer)
        t0 = time.perf_counter()
        # A drafter that needs no draft model runs on a pair without one, as a run with only --target would.
        used = pair if any(needs_draft_model(d) for d in drafters) else dataclasses.replace(pair, draft=None)
        measured = measure(used, prompts, [(d, k) for d in drafters for k in ks], cfg, args.repeats)
        table = rows(measured)
        print_table(
            f"{title}: {prompt_spec}, {len(prompts)} prompts ({time.perf_counter() - t0:.0f} s)",
            table,
            base_tps(measured),
        )
        report[f"{title}:{prompt_spec}"] = table
        sys.stdout.flush()

    section(args.prompts, args.drafters.split(","), "all drafters")
    for prompt_spec in filter(None, args.lookup_sets.split(",")):
        section(prompt_spec, args.lookup_drafters.split(","), "prompt lookup, no draft model loaded")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
