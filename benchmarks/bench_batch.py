"""Is DraftLab's baseline handicapped? (issue 20 item 6) Batched target-only decoding vs transformers' generate(),
and the batch-1 speculative loop vs transformers' assisted generation, side by side in one process.

1. Target-only throughput at batch 1, 4 and 16: DraftLab's TargetOnlyDecoder (engine/decoding/baseline.py) vs
   model.generate() on the same pair, the same prompts in the same batches, the same left padding (the batch's
   prompts left-padded to its longest), greedy, the same max_new_tokens and EOS. Throughput = new tokens up to and
   including EOS over wall time (generate() keeps computing finished rows to the batch's end; DraftLab drops them:
   that difference is part of what is measured). Goal: ratio >= 0.9.
2. Batch-1 speculative decoding, greedy, constant k: DraftLab's loop (engine/decoding/speculative.py, its one-row case)
   vs assisted generation with its schedule set on the draft's generation_config (num_assistant_tokens = k,
   num_assistant_tokens_schedule = 'constant'; transformers 5 reads them there). Goal: wall ratio <= 0.80. Also printed:
   the CPU-time ratio (process time, which other jobs on a shared machine disturb less), and where the time goes, from
   as many passes again with every model forward clocked: forwards per pass for each model, the share of the wall
   outside them, and the loop's forward time over assisted generation's wall (the ratio the loop would reach with no
   overhead of its own).
3. What the batched speculative decoder's rollback costs at batch 4 and 16: the mean share of the target cache's
   columns that are holes (rejected drafts, padding), how many realignments (compactions) a pass needed, the time
   spent dropping finished rows and realigning (select + compact), and its throughput vs the batched baseline at
   the same batch size.

Each comparison is interleaved (A B, then B A, batch by batch) and repeated; medians and the spread (min-max) of
the per-repeat ratio are printed. Outputs are compared token for token (DraftLab's rows equal each prompt decoded
alone; generate()'s padded batch may differ where padding changes float rounding: the count is printed).

    python benchmarks/bench_batch.py                      # demo pair, code:validation, 16 prompts
    python benchmarks/bench_batch.py --repeats 5 --max-new-tokens 64 --device cuda
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any

import torch

from engine.decoding.batched_cache import BatchCache, left_pad
from engine.decoding.runs import baseline_decoder, encode_prompts, eos_ids, speculative_decoder
from engine.decoding.sampling import SamplingConfig
from engine.models.loading import load_pair
from engine.text.chat import render
from engine.text.prompt_sets import load_prompts


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}  (min {min(values):.3f}, max {max(values):.3f})"


def interleaved(arms: dict, units: list, repeats: int, sync, cpu: dict | None = None) -> dict:
    """{arm: [total wall per repeat]}: each unit runs under every arm, A B then B A on alternate repeats. With a
    dict `cpu`, it receives {arm: [process CPU seconds per repeat]} too (a figure other jobs on the machine
    disturb less than wall time; meaningful on CPU only)."""
    walls: dict[str, list[float]] = {name: [] for name in arms}
    for rep in range(repeats):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))
        totals, cpus = dict.fromkeys(arms, 0.0), dict.fromkeys(arms, 0.0)
        for unit in units:
            for name in order:
                sync()
                t, c = time.perf_counter(), time.process_time()
                arms[name](unit)
                sync()
                totals[name] += time.perf_counter() - t
                cpus[name] += time.process_time() - c
        for name in arms:
            walls[name].append(totals[name])
            if cpu is not None:
                cpu.setdefault(name, []).append(cpus[name])
    return walls


def forward_split(arms: dict, units: list, models: dict, repeats: int, sync) -> tuple[dict, dict]:
    """Where each arm's time goes, over `repeats` more interleaved passes with every model forward clocked
    (functools.wraps keeps each forward's signature, which generate() inspects): ({arm: [wall per pass]},
    {arm: [(forwards per model, seconds inside them) per pass]})."""
    current: list[Any] = [None]
    inside: dict[Any, dict[str, tuple[int, float]]] = {}

    def clocked(name, forward):
        @functools.wraps(forward)
        def run(*args, **kwargs):
            sync()
            t = time.perf_counter()
            out = forward(*args, **kwargs)
            sync()
            count, seconds = inside[current[0]].get(name, (0, 0.0))
            inside[current[0]][name] = (count + 1, seconds + time.perf_counter() - t)
            return out

        return run

    def tagged(arm):
        def run(unit):
            current[0] = arm
            return arms[arm](unit)

        return run

    for name, model in models.items():
        model.forward = clocked(name, model.forward)
    try:
        passes: dict[str, list[Any]] = {arm: [] for arm in arms}
        walls: dict[str, list[float]] = {arm: [] for arm in arms}
        for _ in range(repeats):
            inside.clear()
            inside.update({arm: {} for arm in arms})
            for arm, wall in interleaved({arm: tagged(arm) for arm in arms}, units, 1, sync).items():
                walls[arm] += wall
                passes[arm].append(inside[arm])
        return walls, passes
    finally:
        for model in models.values():
            del model.forward  # the class's forward again


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="demo-target")
    ap.add_argument("--draft", default="demo-draft")
    ap.add_argument("--prompts", default="code:validation")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: baseline, speculative, rollback")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    pair = load_pair(args.target, args.draft, args.device, args.dtype)
    prompts = render(load_prompts(args.prompts)[: args.num_prompts], pair.tokenizer)
    ids = encode_prompts(pair, prompts, args.max_new_tokens)
    assert pair.draft is not None, "a pair to speculate with"
    draft = pair.draft
    cfg = SamplingConfig(temperature=0, max_new_tokens=args.max_new_tokens)
    eos = sorted(eos_ids(pair))
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    target = pair.target.model
    sync = torch.cuda.synchronize if pair.device.type == "cuda" else (lambda: None)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    print(
        f"pair: {pair.target.name} ({pair.target.parameters / 1e6:.1f}M) / {draft.name} "
        f"({draft.parameters / 1e6:.1f}M) on {pair.device.type} {str(pair.dtype).removeprefix('torch.')}, "
        f"torch threads {torch.get_num_threads()}; {len(prompts)} prompts from {args.prompts}, "
        f"max_new_tokens {args.max_new_tokens}, greedy, {args.repeats} interleaved repeats"
    )

    def cut(row: list[int]) -> list[int]:
        """Tokens up to and including the first EOS (what a row produced)."""
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        return row[:end]

    def batches(size):
        return [list(range(s, min(s + size, len(prompts)))) for s in range(0, len(prompts), size)]

    with torch.inference_mode():
        # --- 1. target-only throughput ------------------------------------------------------------------------
        if "baseline" not in skip:
            base = baseline_decoder(pair, cfg)

            def draftlab(rows):
                return [
                    r.output_ids for r in base.generate_batch([prompts[i] for i in rows], [ids[i] for i in rows], rows)
                ]

            def hf(rows):
                batch_ids, valid = left_pad([ids[i][0] for i in rows], pair.device, pad)
                out = target.generate(
                    batch_ids,
                    attention_mask=valid.long(),
                    do_sample=False,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
                return [cut(row) for row in out[:, batch_ids.shape[1] :].tolist()]

            print(
                "\n1. target-only throughput, DraftLab batched vs transformers generate() (same batches, left padding)"
            )
            print(
                f"{'batch':>5} {'tokens':>6} {'DraftLab tok/s':>15} {'generate tok/s':>15}  "
                f"{'ratio DraftLab/generate (tok/s)':<40} same ids"
            )
            for size in sizes:
                units = batches(size)
                draftlab(units[0]), hf(units[0])  # untimed warm-up at this shape
                ours, theirs = [r for u in units for r in draftlab(u)], [r for u in units for r in hf(u)]
                same = sum(a == b for a, b in zip(ours, theirs))
                tokens, hf_tokens = sum(map(len, ours)), sum(map(len, theirs))
                walls = interleaved({"draftlab": draftlab, "hf": hf}, units, args.repeats, sync)
                ratios = [(tokens / a) / (hf_tokens / b) for a, b in zip(walls["draftlab"], walls["hf"])]
                print(
                    f"{size:>5} {tokens:>6} {tokens / statistics.median(walls['draftlab']):>15.1f} "
                    f"{hf_tokens / statistics.median(walls['hf']):>15.1f}  {spread(ratios):<40} {same}/{len(prompts)}"
                )

        # --- 2. batch-1 speculative vs assisted generation ----------------------------------------------------------
        if "speculative" not in skip:
            loop = speculative_decoder(pair, cfg, args.k)
            gc = draft.model.generation_config
            gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = args.k, "constant"
            gc.assistant_confidence_threshold = 0.0

            def spec_loop(i):
                return loop.generate(prompts[i], ids[i], i).output_ids

            def assisted(i):
                out = target.generate(
                    ids[i],
                    attention_mask=torch.ones_like(ids[i]),
                    assistant_model=draft.model,
                    do_sample=False,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
                return out[0, ids[i].shape[1] :].tolist()

            units = list(range(len(prompts)))
            for fn in (spec_loop, assisted):
                fn(0)
            same = sum(spec_loop(i) == assisted(i) for i in units)
            arms = {"loop": spec_loop, "assisted": assisted}
            cpu: dict[str, list[float]] = {}
            walls = interleaved(arms, units, args.repeats, sync, cpu)
            print(
                f"\n2. batch-1 speculative decoding, k={args.k} constant, vs assisted generation "
                f"(identical ids: {same}/{len(prompts)})"
            )
            for name in walls:
                print(f"{name:>9} wall per pass: {spread(walls[name])} s")
            for name in ("loop",):
                ratios = [a / b for a, b in zip(walls[name], walls["assisted"])]
                print(f"{name:>9} / assisted wall ratio: {spread(ratios)}")
            if pair.device.type == "cpu":
                for name in ("loop",):
                    ratios = [a / b for a, b in zip(cpu[name], cpu["assisted"])]
                    print(f"{name:>9} / assisted CPU-time ratio: {spread(ratios)}")
            # Where the time goes: more interleaved passes with every model forward clocked (not in the ratios above).
            split_walls, split = forward_split(
                arms, units, {"target": target, "draft": draft.model}, args.repeats, sync
            )
            print("   where a pass's wall goes (as many passes again, every model forward clocked):")
            for name, passes in split.items():
                forwards = " + ".join(f"{n} {m}" for m, (n, _) in passes[0].items())
                inside = [sum(s for _, s in p.values()) for p in passes]
                outside = [100 * (w - i) / w for w, i in zip(split_walls[name], inside)]
                print(f"{name:>9}: {forwards} forwards a pass; outside them: {spread(outside)} % of the wall")
            floor = [sum(s for _, s in p.values()) / w for p, w in zip(split["loop"], split_walls["assisted"])]
            print(f"   loop's forwards alone / assisted wall (the loop with no overhead at all): {spread(floor)}")

        # --- 3. what rollback and compaction cost in the batched speculative decoder ------------------------------
        if "rollback" not in skip:
            compact_s = [0.0]
            originals = {name: getattr(BatchCache, name) for name in ("compact", "select")}

            def timed(method):
                def run(self, *args):
                    sync()
                    t = time.perf_counter()
                    method(self, *args)
                    sync()
                    if self is spec.target or self is spec.drafter.lm:  # the speculative arm's caches only
                        compact_s[0] += time.perf_counter() - t

                return run

            for name, method in originals.items():
                setattr(BatchCache, name, timed(method))
            spec = speculative_decoder(pair, cfg, args.k)
            base = baseline_decoder(pair, cfg)
            print(f"\n3. batched speculative (k={args.k}) vs batched target-only, and what holes cost")
            print(
                f"{'batch':>5} {'speedup (wall ratio base/spec)':<40} {'hole share':>10} {'compactions':>11} "
                f"{'select+compact % of spec wall':>29} same ids"
            )
            for size in [s for s in sizes if s > 1] or sizes:
                units = batches(size)
                hole: list[float] = []
                comps = 0

                def spec_run(rows, hole=hole):
                    nonlocal comps
                    before = spec.target.compactions
                    out = [
                        r.output_ids
                        for r in spec.generate_batch([prompts[i] for i in rows], [ids[i] for i in rows], rows)
                    ]
                    hole.append(spec.hole_share)
                    comps += spec.target.compactions - before
                    return out

                def base_run(rows):
                    return [
                        r.output_ids
                        for r in base.generate_batch([prompts[i] for i in rows], [ids[i] for i in rows], rows)
                    ]

                spec_run(units[0]), base_run(units[0])
                same = sum(a == b for u in units for a, b in zip(spec_run(u), base_run(u)))
                hole.clear()
                comps = 0
                compact_s[0] = 0.0
                walls = interleaved({"spec": spec_run, "base": base_run}, units, args.repeats, sync)
                speedups = [b / s for s, b in zip(walls["spec"], walls["base"])]
                share = 100 * compact_s[0] / sum(walls["spec"])
                print(
                    f"{size:>5} {spread(speedups):<40} {statistics.mean(hole):>10.2f} {comps // args.repeats:>11} "
                    f"{share:>28.2f}% {same}/{len(prompts)}"
                )
            for name, method in originals.items():
                setattr(BatchCache, name, method)


if __name__ == "__main__":
    main()
