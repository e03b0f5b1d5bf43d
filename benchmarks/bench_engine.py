"""DraftLab's speculative loop vs transformers' own assisted generation, greedy, same pair/prompts/k.

Checks the outputs are identical token for token, then times both sides interleaved (A B A B ...) and
reports medians and spread of the per-repeat ratio (one process, so machine noise hits both sides alike).
Also reports the engine's overhead (wall time outside model forwards) and what instrumentation costs
(beta/KL on device, the per-round host transfer and building the records), as % of wall.

    python benchmarks/bench_engine.py                      # demo pair, code:validation, k=4
    python benchmarks/bench_engine.py --target PATH_OR_ID --draft PATH_OR_ID --k 5 --device cuda
    python benchmarks/bench_engine.py --random-target-layers 16 --random-hidden 2048 ...  # random-init sizes
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.decoding import speculative, verification
from engine.decoding.batched_cache import BatchCache
from engine.decoding.runs import encode_prompts, eos_ids, speculative_decoder
from engine.decoding.sampling import SamplingConfig
from engine.models.loading import LoadedModel, ModelPair, load_pair, resolve_device, resolve_dtype
from engine.text.chat import render
from engine.text.prompt_sets import load_prompts


class Stopwatch:
    """Accumulates time spent inside wrapped functions (synchronising CUDA around each call)."""

    def __init__(self, device):
        self.total = 0.0
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def wrap(self, fn):
        def timed(*args, **kwargs):
            self.sync()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.total += time.perf_counter() - t
            return out

        return timed


def random_pair(args, device, dtype) -> ModelPair:
    """Random-init Llama target and draft sharing the demo tokenizer (for GPU-size timing only)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from engine import zoo

    tok = AutoTokenizer.from_pretrained(zoo.resolve("demo-target") or zoo.resolve("demo-draft"))
    vocab = args.random_vocab

    def build(layers, hidden, seed):
        torch.manual_seed(seed)
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=hidden * 8 // 3 // 64 * 64,
            num_hidden_layers=layers,
            num_attention_heads=max(1, hidden // 64),
            num_key_value_heads=max(1, hidden // 256),
            max_position_embeddings=2048,
        )
        return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()

    t = build(args.random_target_layers, args.random_hidden, 0)
    d = build(args.random_draft_layers, args.random_draft_hidden, 1)
    return ModelPair(
        LoadedModel("random-target", "random", t, tok),
        LoadedModel("random-draft", "random", d, tok),
        device,
        dtype,
        len(tok),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="demo-target")
    ap.add_argument("--draft", default="demo-draft")
    ap.add_argument("--prompts", default="code:validation")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--random-target-layers", type=int, default=0, help="use random-init models of this size instead")
    ap.add_argument("--random-hidden", type=int, default=2048)
    ap.add_argument("--random-draft-layers", type=int, default=2)
    ap.add_argument("--random-draft-hidden", type=int, default=512)
    ap.add_argument("--random-vocab", type=int, default=32000)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.random_target_layers:
        device = resolve_device(args.device)
        pair = random_pair(args, device, resolve_dtype(args.dtype, device))
    else:
        pair = load_pair(args.target, args.draft, args.device, args.dtype)
    prompts = render(load_prompts(args.prompts)[: args.num_prompts], pair.tokenizer)
    ids = encode_prompts(pair, prompts, args.max_new_tokens)
    cfg = SamplingConfig(temperature=0, max_new_tokens=args.max_new_tokens)
    decoder = speculative_decoder(pair, cfg, args.k)
    eos = sorted(eos_ids(pair))

    # Instrumentation: time model forwards, and the record-keeping (the round's one transfer to the host, and its
    # records), as the loop looks them up in engine.decoding.speculative.
    forwards, logging = Stopwatch(pair.device), Stopwatch(pair.device)
    BatchCache.forward = forwards.wrap(BatchCache.forward)  # type: ignore[method-assign]
    for name in ("rows_to_host", "round_record"):  # engine.decoding.verification's, imported by the loop's module
        setattr(speculative, name, logging.wrap(getattr(verification, name)))
    assert pair.draft is not None, "a pair to speculate with"
    draft = pair.draft

    def draftlab(i):
        return decoder.generate(prompts[i], ids[i], i).output_ids

    # transformers 5 reads the assistant's schedule from the draft's own generation_config (arguments passed to
    # generate() are ignored for these three), so set them there: constant k, no confidence stop.
    draft.model.generation_config.num_assistant_tokens = args.k
    draft.model.generation_config.num_assistant_tokens_schedule = "constant"
    draft.model.generation_config.assistant_confidence_threshold = 0.0

    def transformers_assisted(i):
        out = pair.target.model.generate(
            ids[i],
            attention_mask=torch.ones_like(ids[i]),
            assistant_model=draft.model,
            do_sample=False,
            num_assistant_tokens=args.k,
            num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0,
            max_new_tokens=args.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=eos[0] if eos else 0,
        )
        return out[0, ids[i].shape[1] :].tolist()

    sync = torch.cuda.synchronize if pair.device.type == "cuda" else (lambda: None)

    def timed(fn, i):
        sync()
        t = time.perf_counter()
        out = fn(i)
        sync()
        return out, time.perf_counter() - t

    with torch.inference_mode():
        fn_names = {"draftlab": draftlab, "transformers": transformers_assisted}
        for fn in fn_names.values():  # untimed warm-up
            fn(0)
        mismatches = sum(draftlab(i) != transformers_assisted(i) for i in range(len(prompts)))
        walls: dict[str, list[float]] = {name: [] for name in fn_names}
        overhead, log_share = [], []
        for rep in range(args.repeats):
            order = list(fn_names) if rep % 2 == 0 else list(reversed(fn_names))  # A B, then B A
            totals = dict.fromkeys(fn_names, 0.0)
            fwd0, log0 = forwards.total, logging.total
            for i in range(len(prompts)):
                for name in order:
                    _, wall = timed(fn_names[name], i)
                    totals[name] += wall
            # Only DraftLab decodes through BatchCache, so the forward stopwatch counts its side alone.
            dl_wall, fwd = totals["draftlab"], forwards.total - fwd0
            overhead.append(100 * (dl_wall - fwd) / dl_wall)
            log_share.append(100 * (logging.total - log0) / dl_wall)
            for name in fn_names:
                walls[name].append(totals[name])
    ratios = [a / b for a, b in zip(walls["draftlab"], walls["transformers"])]
    med = statistics.median
    print(
        f"pair: {pair.target.name} ({pair.target.parameters / 1e6:.1f}M) / {draft.name} "
        f"({draft.parameters / 1e6:.1f}M) on {pair.device.type} {str(pair.dtype).removeprefix('torch.')}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"prompts: {len(prompts)} from {args.prompts}, k={args.k}, max_new_tokens={args.max_new_tokens}, greedy, "
        f"{args.repeats} interleaved repeats"
    )
    print(f"identical output ids: {len(prompts) - mismatches}/{len(prompts)} prompts")
    for name in fn_names:
        w = walls[name]
        print(f"{name:>13} wall per pass: median {med(w):.3f} s  (min {min(w):.3f}, max {max(w):.3f})")
    print(
        f"draftlab / transformers wall ratio: median {med(ratios):.3f}  (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )
    print(
        f"engine overhead (wall outside model forwards): median {med(overhead):.1f}% of wall "
        f"(min {min(overhead):.1f}, max {max(overhead):.1f})"
    )
    print(
        f"instrumentation (beta/KL on device, one transfer per round, records): median {med(log_share):.1f}% of wall "
        f"(min {min(log_share):.1f}, max {max(log_share):.1f})"
    )


if __name__ == "__main__":
    main()
