"""Run an experiment in this process: baseline first, then one speculative run per k, with a progress bar."""
from __future__ import annotations

import sys

import torch
from tqdm import tqdm

from engine.loading import load_pair
from engine.prompt_sets import load_prompts
from engine.runs import baseline_decoder, encode_prompts, run_prompts, speculative_decoder
from engine.sampling import SamplingConfig

from .report import baseline_entry, speculative_entry


def run_experiment(args, ks: list[int], cfg: SamplingConfig) -> dict:
    prompts = load_prompts(args.prompts)
    pair = load_pair(args.target, args.draft, args.device, args.dtype, args.trust_remote_code)
    prompt_ids = encode_prompts(pair, prompts, cfg.max_new_tokens)
    total = len(prompts) * (1 + len(ks)) * cfg.max_new_tokens
    with tqdm(total=total, unit="tok", file=sys.stderr, desc="baseline", dynamic_ncols=True) as bar:
        def run(decoder, label):
            bar.set_description(label)
            done = bar.n
            results = []
            try:
                for result in run_prompts(decoder, prompts, prompt_ids,
                                          on_progress=lambda i, n: bar.update(done + i * cfg.max_new_tokens + n - bar.n)):
                    results.append(result)
            except torch.cuda.OutOfMemoryError as exc:
                raise MemoryError(f"CUDA ran out of memory in the {label} run; lower --max-new-tokens, "
                                  f"use --dtype bfloat16 or a smaller model") from exc
            bar.update(done + len(prompts) * cfg.max_new_tokens - bar.n)
            return results

        baseline = run(baseline_decoder(pair, cfg), "baseline")
        runs = [speculative_entry(k, run(speculative_decoder(pair, cfg, k), f"k={k}"), baseline, cfg.greedy)
                for k in ks]
    return {"experiment_id": None, "baseline": baseline_entry(baseline), "runs": runs}

