"""Block verification against the standard rule on the demo pair (issue 38 item 2): for each temperature and k, one
decode of the prompt set with `verify="block"`, whose every round also records what the standard rule would have
accepted on the SAME drafts with the SAME uniforms (Round.accepted_standard). So the two acceptance lengths are paired
round by round, not two runs that drift apart after their first different round.

    python benchmarks/bench_block_verification.py                 # demo-target + demo-draft, code:validation,
                                                                  # T 1.0 and 0.7, k 2..6, 48 tokens, batch 8
    python benchmarks/bench_block_verification.py --temperatures 1 --ks 2,4 --limit 8 --json out.json

Per (T, k): mean accepted drafts per round under block and under the standard rule on the same rounds, their
difference (block's gain) and its relative size, each with a 95 % bootstrap interval over prompts (rounds of one
prompt resampled together: a prompt's rounds are not independent); the share of rounds where the verdicts differ;
and, with --timed, the wall-time speedup of block over a separate verify=standard decode of the same prompts
(throughput ratio, paired by batch, engine/metrics/stats.py's paired bootstrap; 2 alternating repeats, medians),
which is what a user's sweep `--verify standard,block` measures: its drafts differ after the first round that differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.decoding.runs import encode_prompts, speculative_decoder  # noqa: E402
from engine.decoding.sampling import SamplingConfig  # noqa: E402
from engine.metrics.stats import BOOTSTRAP_SAMPLES, paired_bootstrap_ci, paired_speedup  # noqa: E402
from engine.models.loading import load_pair  # noqa: E402
from engine.text.chat import render  # noqa: E402
from engine.text.prompt_sets import load_prompts  # noqa: E402


def per_prompt(results: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rounds with drafts, Σ accepted, Σ accepted_standard, rounds whose verdicts differ) per prompt."""
    rows = []
    for r in results:
        rounds = [rd for rd in r.rounds if rd.k > 0]
        rows.append(
            (
                len(rounds),
                sum(rd.accepted for rd in rounds),
                sum(rd.accepted_standard for rd in rounds),
                sum(rd.accepted != rd.accepted_standard for rd in rounds),
            )
        )
    return tuple(np.array(col, dtype=float) for col in zip(*rows))  # type: ignore[return-value]


def bootstrap(stat, *columns: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """stat(*columns) and its 95 % percentile interval, resampling prompts (BOOTSTRAP_SAMPLES draws)."""
    n = columns[0].size
    idx = np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP_SAMPLES, n))
    draws = np.array([stat(*(c[i] for c in columns)) for i in idx])
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(stat(*columns)), float(lo), float(hi)


def decode(pair, prompts, ids, cfg, k: int, batch: int) -> tuple[list[Any], list[float], list[int]]:
    """Every prompt decoded in consecutive batches: (results, each batch's wall seconds, each batch's new tokens)."""
    decoder = speculative_decoder(pair, cfg, k)
    results, seconds, tokens = [], [], []
    for s in range(0, len(prompts), batch):
        e = min(s + batch, len(prompts))
        start = time.perf_counter()
        out = decoder.generate_batch(prompts[s:e], ids[s:e], list(range(s, e)))
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(r.output_ids) for r in out))
        results += out
    return results, seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="demo-target")
    parser.add_argument("--draft", default="demo-draft")
    parser.add_argument("--prompts", default="code:validation")
    parser.add_argument("--limit", type=int, default=0, help="the first N prompts (0: all)")
    parser.add_argument("--temperatures", default="1.0,0.7")
    parser.add_argument("--ks", default="2,3,4,5,6")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timed", action="store_true", help="also time a verify=standard decode beside block's")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    pair = load_pair(args.target, args.draft, device="cpu")
    prompts = render(load_prompts(args.prompts)[: args.limit or None], pair.tokenizer)
    ids = encode_prompts(pair, prompts, args.max_new_tokens)
    out: list[dict[str, Any]] = []
    print(f"{args.target} + {args.draft} on {args.prompts} ({len(prompts)} prompts), {args.max_new_tokens} tokens")
    print("T     k  block/round          standard/round       gain                 gain %   differ  speedup")
    started = time.perf_counter()
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for k in (int(v) for v in args.ks.split(",")):
            cfg = SamplingConfig(
                temperature=temperature, max_new_tokens=args.max_new_tokens, seed=args.seed, verify="block"
            )
            results, block_s, block_t = decode(pair, prompts, ids, cfg, k, args.batch)
            rounds, acc, std, differ = per_prompt(results)
            block = bootstrap(lambda r, a: a.sum() / r.sum(), rounds, acc)
            standard = bootstrap(lambda r, s: s.sum() / r.sum(), rounds, std)
            gain = bootstrap(lambda r, a, s: (a.sum() - s.sum()) / r.sum(), rounds, acc, std)
            relative = bootstrap(lambda a, s: a.sum() / s.sum() - 1, acc, std)
            row: dict[str, Any] = {
                "temperature": temperature,
                "k": k,
                "prompts": len(prompts),
                "rounds": int(rounds.sum()),
                "block_accepted_per_round": block,
                "standard_accepted_per_round": standard,
                "gain_per_round": gain,
                "gain_relative": relative,
                "rounds_differ_share": float(differ.sum() / rounds.sum()),
            }
            speed = "-"
            if args.timed:
                plain = SamplingConfig(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
                times: dict[str, list[list[float]]] = {"block": [block_s], "standard": []}
                tokens: dict[str, list[int]] = {"block": block_t}
                for rep in range(2):  # alternate: standard, block, standard (the block decode above is the first)
                    _, s_s, s_t = decode(pair, prompts, ids, plain, k, args.batch)
                    times["standard"].append(s_s)
                    tokens["standard"] = s_t
                    if rep == 0:
                        times["block"].append(decode(pair, prompts, ids, cfg, k, args.batch)[1])
                med = {arm: np.median(np.array(v), axis=0) for arm, v in times.items()}
                ratio = paired_speedup(tokens["standard"], med["standard"], tokens["block"], med["block"])
                ci = paired_bootstrap_ci(tokens["standard"], med["standard"], tokens["block"], med["block"])
                row["speedup_block_over_standard"] = (ratio, *(ci or (None, None)))
                speed = f"{ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ratio and ci else "-"
            out.append(row)
            print(
                f"{temperature:<5g} {k}  "
                + "  ".join(f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for v in (block, standard, gain))
                + f"  {100 * relative[0]:+5.1f}%  {row['rounds_differ_share']:.3f}   {speed}",
                flush=True,
            )
    print(f"wall {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
