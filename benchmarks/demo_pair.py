"""Measure the demo pair (or any pair) with the engine API directly, no database:
alpha, c, speedup and outputs_match_baseline per k, following SPEC's timing protocol.

    python benchmarks/demo_pair.py                                   # demo-target / demo-draft, code:validation
    python benchmarks/demo_pair.py --draft path/to/draft --k 1,2,3,4,6 --prompts code:validation --max-new-tokens 64

`draftlab run ... --json` is the product's way to get the same numbers (and stores them); this script exists
to check candidate checkpoints while training the demo models.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from engine.loading import load_pair
from engine.metrics import outputs_match, speculative_metrics, target_step_seconds, throughput
from engine.prompt_sets import load_prompts
from engine.runs import baseline_decoder, encode_prompts, run_prompts, speculative_decoder
from engine.sampling import SamplingConfig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo-target")
    ap.add_argument("--draft", default="demo-draft")
    ap.add_argument("--prompts", default="code:validation")
    ap.add_argument("--k", default="1,2,3,4,6")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--show", type=int, default=0, help="print the first N baseline outputs")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=args.max_new_tokens)
    prompts = load_prompts(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    pair = load_pair(args.target, args.draft, "cpu", "auto")
    ids = encode_prompts(pair, prompts, cfg.max_new_tokens)
    with torch.inference_mode():
        base = list(run_prompts(baseline_decoder(pair, cfg), prompts, ids))
        bt = throughput(base)
        print(f"baseline: {bt['new_tokens']} tokens {bt['wall_seconds']:.2f}s {bt['tokens_per_second']:.1f} tok/s "
              f"target step {1000 * target_step_seconds(base):.2f} ms", file=sys.stderr)
        for p in base[: args.show]:
            print(f"--- {p.prompt!r}\n{p.text}", file=sys.stderr)
        out = []
        for k in [int(x) for x in args.k.split(",")]:
            res = list(run_prompts(speculative_decoder(pair, cfg, k), prompts, ids))
            m = speculative_metrics(res, base)
            row = {"k": k, "alpha": m["alpha"], "c": m["c"], "speedup": m["speedup"],
                   "predicted_speedup": m["predicted_speedup"], "tokens_per_round": m["tokens_per_round"],
                   "tokens_per_second": m["tokens_per_second"], "outputs_match_baseline": outputs_match(res, base)}
            print(" ".join(f"{a}={b:.3f}" if isinstance(b, float) else f"{a}={b}" for a, b in row.items()),
                  file=sys.stderr)
            out.append(row)
    print(json.dumps({"target": args.target, "draft": args.draft, "prompts": args.prompts,
                      "baseline_tokens_per_second": bt["tokens_per_second"],
                      "target_step_seconds": target_step_seconds(base), "runs": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
