"""An EAGLE-3 head against the other drafts of one target, all against ONE target-only baseline: the head
(`--drafter eagle3`), a distilled draft model, prompt lookup and suffix decoding, each at several k, greedy, batch 1.

    python benchmarks/bench_eagle3.py                 # demo-target: demo-eagle3, demo-draft-distilled, prompt-lookup:3,
                                                      # suffix on code:validation, k 2,3,4,5, 48 tokens, 3 repeats
    python benchmarks/bench_eagle3.py --json out.json

Arms (the baseline and every (drafter, k)) are interleaved per prompt in a rotating order, `--repeats` times; a
prompt's time per arm is the median of its repeats (benchmarks/bench_drafters.py measure_decoders). Speedup = the
baseline's summed time / the arm's over the same prompts, with the lab's 95 % paired bootstrap interval over
prompts (engine/metrics/stats.py). Greedy, so α, acceptance by position and outputs do not vary between repeats; `match`
says every output equals the target-only output token for token. Acceptance length = 1 + accepted drafts per
round that drafted (vLLM's mean acceptance length).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_drafters import BASELINE, fmt, measure_decoders  # noqa: E402

from engine.decoding.runs import baseline_decoder, encode_prompts, speculative_decoder  # noqa: E402
from engine.decoding.sampling import SamplingConfig  # noqa: E402
from engine.metrics.metrics_oracle import outputs_match, speculative_metrics  # noqa: E402
from engine.metrics.stats import paired_bootstrap_ci, paired_speedup  # noqa: E402
from engine.models.loading import load_pair, with_draft  # noqa: E402
from engine.text.chat import render  # noqa: E402
from engine.text.prompt_sets import load_prompts  # noqa: E402


def table(measured: dict) -> list[dict]:
    base_results, base_seconds = measured[BASELINE]
    base_tokens = [r.new_tokens for r in base_results]
    rows = []
    for arm, (results, seconds) in measured.items():
        if arm == BASELINE:
            continue
        m = speculative_metrics(results, base_results)
        drafting = [r for p in results for r in p.rounds if r.k > 0]
        tokens = [r.new_tokens for r in results]
        rows.append(
            {
                "draft": arm[0],
                "k": arm[1],
                "alpha": m["alpha"],
                "acceptance_length": 1 + m["accepted"] / len(drafting) if drafting else None,
                "per_position_acceptance": m["per_position_acceptance"],
                "tokens_per_round": m["tokens_per_round"],
                "speedup": paired_speedup(base_tokens, base_seconds, tokens, seconds),
                "speedup_ci": paired_bootstrap_ci(base_tokens, base_seconds, tokens, seconds),
                "match": outputs_match(results, base_results),
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo-target")
    ap.add_argument(
        "--drafts",
        default="demo-eagle3@eagle3,demo-draft-distilled@model,prompt-lookup:3,suffix",
        help="NAME@eagle3 / NAME@model (a draft loaded beside the target) or a model-free drafter spec",
    )
    ap.add_argument("--prompts", default="code:validation")
    ap.add_argument("--k", default="2,3,4,5")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    args = ap.parse_args(argv)
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens)
    ks = [int(k) for k in args.k.split(",")]
    pair = load_pair(args.target, None, "cpu", "auto")  # sets 1 torch thread for small models
    prompts = render(load_prompts(args.prompts)[: args.limit or None], pair.tokenizer)
    decoders: dict[Any, Any] = {BASELINE: baseline_decoder(pair, cfg)}
    for item in args.drafts.split(","):
        if "@" in item:
            name, drafter = item.split("@", 1)
            used = with_draft(pair, name)
            decoders.update({(name, k): speculative_decoder(used, cfg, k, drafter=drafter) for k in ks})
        else:
            decoders.update({(item, k): speculative_decoder(pair, cfg, k, drafter=item) for k in ks})
    print(
        f"{args.target} on {args.prompts} ({len(prompts)} prompts), greedy, batch 1, {args.max_new_tokens} new "
        f"tokens, {args.repeats} interleaved repeats, torch threads {torch.get_num_threads()}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    t0 = time.perf_counter()
    measured = measure_decoders(decoders, prompts, encode_prompts(pair, prompts, cfg.max_new_tokens), cfg, args.repeats)
    rows = table(measured)
    print(f"measured in {time.perf_counter() - t0:.0f} s")
    print(
        f"{'draft':<22} {'k':>2} {'alpha':>6} {'acc.len':>7} {'speedup':>7} {'95% interval':>14}  "
        f"{'acceptance by position':<28} match"
    )
    for r in rows:
        ci = r["speedup_ci"]
        per = ", ".join(fmt(a, ".2f") for a in r["per_position_acceptance"])
        print(
            f"{r['draft']:<22} {r['k']:>2} {fmt(r['alpha']):>6} {fmt(r['acceptance_length'], '.2f'):>7} "
            f"{fmt(r['speedup']):>7} {(f'{ci[0]:.2f}–{ci[1]:.2f}' if ci else '-'):>14}  {per:<28} {r['match']}"
        )
    best: dict[Any, Any] = {}
    for r in rows:
        if r["speedup"] is not None and (r["draft"] not in best or r["speedup"] > best[r["draft"]]["speedup"]):
            best[r["draft"]] = r
    print(
        "best k: "
        + "; ".join(
            f"{d} k={r['k']} {r['speedup']:.3f}x ({r['speedup_ci'][0]:.2f}–{r['speedup_ci'][1]:.2f})"
            for d, r in best.items()
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
