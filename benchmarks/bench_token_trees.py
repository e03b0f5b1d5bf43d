"""Token trees against chains on the demo pair: for each draft (the distilled draft model and the EAGLE-3 head) and
each temperature, the chains (tree topk 1) at several k and the trees at several (k, tree topk, tree tokens), all
against ONE target-only baseline per temperature, batch 1.

    python benchmarks/bench_token_trees.py                # demo-target: demo-draft-distilled, demo-eagle3 on
                                                          # code:validation, T 0 and 1, 48 tokens, 3 repeats
    python benchmarks/bench_token_trees.py --limit 8 --repeats 2 --json out.json

Arms are interleaved per prompt in a rotating order, `--repeats` times; a prompt's time per arm is the median of its
repeats (benchmarks/bench_drafters.py measure_decoders). Speedup = throughput over the baseline's, with the lab's 95 %
paired bootstrap interval over prompts (engine/metrics/stats.py). Acceptance length = tokens emitted per round that
drafted (1 + accepted), with a 95 % interval from its prompt-clustered standard error. `tree/chain` is the best
tree's throughput over the best chain's (best by speedup), paired per prompt, with its interval. `match` (T 0): every
output equals the target-only output token for token. Sampled rows draw from each prompt's own generator, so the
repeats decode the same tokens.
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
from engine.metrics.metrics_oracle import outputs_match  # noqa: E402
from engine.metrics.stats import clustered_ratio_se, paired_bootstrap_ci, paired_speedup  # noqa: E402
from engine.models.loading import load_pair, with_draft  # noqa: E402
from engine.text.chat import render  # noqa: E402
from engine.text.prompt_sets import load_prompts  # noqa: E402

Shape = tuple[int, int, int]  # (k, tree topk, tree tokens); topk 1 is a chain


def parse_shapes(text: str) -> list[Shape]:
    """`3/1/0,3/2/8` -> [(3, 1, 0), (3, 2, 8)]."""
    out = []
    for item in text.split(","):
        k, topk, tokens = (int(v) for v in item.split("/"))
        out.append((k, topk, tokens))
    return out


def label(shape: Shape) -> str:
    k, topk, tokens = shape
    return f"chain k={k}" if topk == 1 else f"tree k={k} topk={topk} nodes={tokens or 'all'}"


def interval(numerators: list[float], denominators: list[float]) -> tuple[float, float, float] | None:
    """(ratio, lo, hi): a pooled ratio with its 95 % interval (prompt-clustered standard error)."""
    fit = clustered_ratio_se(numerators, denominators)
    if fit is None:
        return None
    ratio, se, _ = fit
    half = 1.96 * se if se is not None else float("nan")
    return ratio, ratio - half, ratio + half


def table(measured: dict, greedy: bool) -> list[dict]:
    base_results, base_seconds = measured[BASELINE]
    base_tokens = [r.new_tokens for r in base_results]
    rows = []
    for arm, (results, seconds) in measured.items():
        if arm == BASELINE:
            continue
        drafting = [[r for r in p.rounds if r.k > 0] for p in results]
        length = interval([sum(len(r.emitted_ids) for r in p) for p in drafting], [len(p) for p in drafting])
        tokens = [r.new_tokens for r in results]
        rows.append(
            {
                "draft": arm[0],
                "shape": arm[1],
                "label": label(arm[1]),
                "acceptance_length": length,
                "tree_nodes": _mean([r.tree_nodes for p in drafting for r in p if r.tree_nodes is not None]),
                "off_chain": _mean([_off_chain(r) for p in drafting for r in p]) if arm[1][1] > 1 else None,
                "speedup": paired_speedup(base_tokens, base_seconds, tokens, seconds),
                "speedup_ci": paired_bootstrap_ci(base_tokens, base_seconds, tokens, seconds),
                "match": outputs_match(results, base_results) if greedy else None,
                "tokens": tokens,
                "seconds": seconds,
            }
        )
    return rows


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _off_chain(round_: Any) -> float:
    return float(any(t.outcome == "accepted" and t.sibling_rank for t in round_.draft_tokens))


def best_pairs(rows: list[dict]) -> list[dict]:
    """Per draft: the best chain and the best tree (by speedup) and the tree's paired throughput over the chain's."""
    out = []
    for draft in dict.fromkeys(r["draft"] for r in rows):
        mine = [r for r in rows if r["draft"] == draft and r["speedup"] is not None]
        chains = [r for r in mine if r["shape"][1] == 1]
        trees = [r for r in mine if r["shape"][1] > 1]
        if not chains or not trees:
            continue
        chain = max(chains, key=lambda r: r["speedup"])
        tree = max(trees, key=lambda r: r["speedup"])
        args = (chain["tokens"], chain["seconds"], tree["tokens"], tree["seconds"])
        out.append(
            {
                "draft": draft,
                "chain": chain["label"],
                "tree": tree["label"],
                "ratio": paired_speedup(*args),
                "ratio_ci": paired_bootstrap_ci(*args),
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo-target")
    ap.add_argument("--drafts", default="demo-draft-distilled@model,demo-eagle3@eagle3", help="NAME@drafter")
    ap.add_argument("--prompts", default="code:validation")
    ap.add_argument(
        "--shapes", default="2/1/0,3/1/0,4/1/0,5/1/0,3/2/0,4/2/8,4/3/10,5/4/16", help="k/topk/tree-tokens, ..."
    )
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    pair = load_pair(args.target, None, "cpu", "auto")  # sets 1 torch thread for small models
    prompts = render(load_prompts(args.prompts)[: args.limit or None], pair.tokenizer)
    print(
        f"{args.target} on {args.prompts} ({len(prompts)} prompts), batch 1, {args.max_new_tokens} new tokens, "
        f"{args.repeats} interleaved repeats, torch threads {torch.get_num_threads()}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}"
    )
    report: dict[str, Any] = {}
    for temperature in (float(t) for t in args.temperatures.split(",")):
        cfg = SamplingConfig(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=1)
        decoders: dict[Any, Any] = {BASELINE: baseline_decoder(pair, cfg)}
        for item in args.drafts.split(","):
            name, drafter = item.split("@", 1)
            used = with_draft(pair, name)
            for shape in shapes:
                k, topk, tokens = shape
                tree_cfg = SamplingConfig(
                    temperature=temperature, max_new_tokens=args.max_new_tokens, seed=1, tree_topk=topk,
                    tree_tokens=tokens,
                )  # fmt: skip
                decoders[(name, shape)] = speculative_decoder(used, tree_cfg, k, drafter=drafter)
        t0 = time.perf_counter()
        ids = encode_prompts(pair, prompts, cfg.max_new_tokens)
        rows = table(measure_decoders(decoders, prompts, ids, cfg, args.repeats), cfg.greedy)
        print(f"\nT {temperature:g}: measured in {time.perf_counter() - t0:.0f} s")
        print(f"{'draft':<22} {'shape':<30} {'acc.len (95%)':>20} {'nodes':>5} {'off':>5} {'speedup (95%)':>20} match")
        for r in rows:
            length, ci = r["acceptance_length"], r["speedup_ci"]
            acc = f"{length[0]:.2f} ({length[1]:.2f}–{length[2]:.2f})" if length else "-"
            speed = f"{r['speedup']:.3f} ({ci[0]:.2f}–{ci[1]:.2f})" if ci else "-"
            print(
                f"{r['draft']:<22} {r['label']:<30} {acc:>20} {fmt(r['tree_nodes'], '.1f'):>5} "
                f"{fmt(r['off_chain'], '.2f'):>5} {speed:>20} {fmt(r['match'])}"
            )
        pairs = best_pairs(rows)
        for b in pairs:
            ci = b["ratio_ci"]
            print(
                f"best: {b['draft']}: {b['tree']} over {b['chain']}: {fmt(b['ratio'])}x ({ci[0]:.2f}–{ci[1]:.2f})"
                if ci
                else f"best: {b['draft']}: -"
            )
        report[f"T{temperature:g}"] = {
            "rows": [{k: v for k, v in r.items() if k not in ("tokens", "seconds")} for r in rows],
            "best": pairs,
        }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
