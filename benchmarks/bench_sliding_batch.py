"""Which cache design makes sliding-window models exact at batch > 1? (issue 27 item 1) Two candidates and the pre-fix
cache as the reference, timed on the same Mistral-style pair (every layer sliding), the same prompts and batches,
greedy, constant k:

  masks    the batched cache as it ships: holes stay, and each forward gets a 4-D mask counted in each row's real
           tokens (engine/decoding/attention_masks.py), built per forward ([B, W, C] booleans);
  compact  no per-forward mask (transformers' column masks), and a cache without holes instead: the target and
           draft caches are realigned (BatchCache.compact, a gather per layer) after every round that left holes,
           so a row's window in columns is its window in tokens. (Cost only: rows that leave the batch mid-round
           and the draft's ragged first forward still leave holes, so this arm is not fully exact; it is the cheap
           bound of the hole-free design, which would also re-feed tokens to keep those forwards hole-free.)
  columns  the pre-fix cache (column masks, holes, compaction past 2x the longest row): the speed to keep; not
           exact.

Per arm: wall and process CPU time of the batches (one torch thread by default: on a shared machine CPU time is
the steadier figure), interleaved (A B C, then C B A) and repeated; medians and min-max of the per-repeat ratio to
`columns`; and how many rows equal their prompt decoded alone (target-only, batch 1).

    python benchmarks/bench_sliding_batch.py                       # batch 4 and 8, 16 prompts, 64 new tokens
    python benchmarks/bench_sliding_batch.py --batch-sizes 4,8,16 --repeats 5 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import cast

import torch
import transformers

from engine.decoding import drafting, runs, speculative
from engine.decoding.sampling import SamplingConfig
from tests import tiny_models as tm


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def sliding_pair(hidden: int, layers: int, window: int, device: str):
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        sliding_window=window,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    target = tm._sharpen(transformers.MistralForCausalLM(config), 4.0)
    draft = tm.noisy_copy(target, seed=1, noise=0.4)  # accepts some drafts, rejects others: holes every round
    pair = tm.pair(target.to(device), draft.to(device), tm.tokenizer(256, eos=False))
    pair.device = torch.device(device)
    return pair


def arm_decoder(arm: str, pair, cfg: SamplingConfig, k: int):
    decoder = runs.speculative_decoder(pair, cfg, k)
    if arm in ("compact", "columns"):
        decoder.target._position_masks = None
        cast(drafting.ModelDrafter, decoder.drafter).lm._position_masks = None
    if arm == "compact":
        decoder.compact_ratio = 1.0  # realign whenever the width exceeds the longest row (COMPACT_SLACK set to 0)
    return decoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="4,8")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = sliding_pair(args.hidden, args.layers, args.window, args.device)
    cfg = SamplingConfig(temperature=0, max_new_tokens=args.max_new_tokens)
    prompts = [
        " ".join(f"t{2 + (7 * i + 13 * p) % 250}" for i in range(16 + (37 * p) % 96)) for p in range(args.prompts)
    ]
    ids = runs.encode_prompts(pair, prompts, args.max_new_tokens)
    alone_decoder = runs.baseline_decoder(pair, cfg)
    alone = [alone_decoder.generate(p, i, n).output_ids for n, (p, i) in enumerate(zip(prompts, ids))]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    arms = ("masks", "compact", "columns")
    print(
        f"Mistral-style pair: hidden {args.hidden}, {args.layers} layers, window {args.window}; "
        f"{len(prompts)} prompts "
        f"of {min(i.shape[1] for i in ids)}-{max(i.shape[1] for i in ids)} tokens, {args.max_new_tokens} new, "
        f"k {args.k}, {args.device}, {args.repeats} repeats"
    )
    # the compact arm realigns at any hole; the others keep ratio 2 (+0 slack) here
    drafting.COMPACT_SLACK = 0
    setattr(speculative, "COMPACT_SLACK", 0)  # noqa: B010  # the loop's own import of it
    for size in [int(s) for s in args.batch_sizes.split(",")]:
        walls: dict[str, list[float]] = {arm: [] for arm in arms}
        cpus: dict[str, list[float]] = {arm: [] for arm in arms}
        exact, hole_share, compactions = {}, {}, {}
        for rep in range(args.repeats):
            for arm in arms if rep % 2 == 0 else tuple(reversed(arms)):
                decoder = arm_decoder(arm, pair, cfg, args.k)
                decoder.generate_batch(prompts[:size], ids[:size], list(range(size)), max_new_tokens=8)  # warm-up
                decoder.target.compactions = 0
                rows, holes, rounds = [], 0.0, 0
                sync()
                start, cpu = time.perf_counter(), time.process_time()
                for s in range(0, len(prompts), size):
                    e = min(s + size, len(prompts))
                    rows += decoder.generate_batch(prompts[s:e], ids[s:e], list(range(s, e)))
                    holes, rounds = holes + decoder.hole_share * decoder.rounds, rounds + decoder.rounds
                sync()
                walls[arm].append(time.perf_counter() - start)
                cpus[arm].append(time.process_time() - cpu)
                exact[arm] = sum(r.output_ids == a for r, a in zip(rows, alone))
                hole_share[arm] = holes / max(1, rounds)
                compactions[arm] = decoder.target.compactions
        print(f"\nbatch {size}:")
        for arm in arms:
            wall_ratios = [w / c for w, c in zip(walls[arm], walls["columns"])]
            cpu_ratios = [w / c for w, c in zip(cpus[arm], cpus["columns"])]
            print(
                f"  {arm:8s} CPU {statistics.median(cpus[arm]):6.2f} s, ratio to columns {spread(cpu_ratios)};  wall "
                f"{statistics.median(walls[arm]):6.2f} s, ratio {spread(wall_ratios)};  rows exact {exact[arm]}/"
                f"{len(prompts)}, hole share {hole_share[arm]:.2f}, target compactions {compactions[arm]}"
            )


if __name__ == "__main__":
    main()
