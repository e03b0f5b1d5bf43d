"""What reading an EAGLE-3 head's aux states costs the target's prefill: pre-hooks on the three layers read
(engine/decoding/aux_states.py, what the loop does) against output_hidden_states=True (every layer's states kept).

    python benchmarks/bench_aux_states.py                        # CPU: random Llama, 16 layers x 768, 2,048 tokens
    python benchmarks/bench_aux_states.py --device cuda --dtype bfloat16 --layers 32 --hidden 4096 --tokens 8192

Each (mode, repeat) runs in a fresh process, interleaved (hooks, all, hooks, all, ...): a random-init Llama, a
short warm-up forward, then one prefill of --tokens. Reported per mode (median and range over repeats):
- states held: the bytes of hidden states the forward hands back (exact: hooks 3 tensors, all L + 1);
- peak growth: on CUDA the allocator's peak during the prefill minus the memory in use before it; on CPU the
  process's peak RSS growth over the warm-up's peak (ru_maxrss, coarser: the allocator's own slack counts);
- prefill seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def child(args) -> dict:
    import resource
    import time

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    from engine.decoding.aux_states import AuxStates

    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 256),
        max_position_embeddings=args.tokens + 16,
    )
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    aux = [2, args.layers // 2, args.layers - 3]
    ids = torch.randint(0, args.vocab, (1, args.tokens), device=device)

    def forward(x):
        if args.mode == "hooks":
            with AuxStates(model, aux) as capture:
                out = model(input_ids=x, logits_to_keep=1, **capture.kwargs)
            assert capture.hooked
            return [capture.states(out)]
        out = model(input_ids=x, logits_to_keep=1, output_hidden_states=True)
        return list(out.hidden_states)  # what the caller holds until it has picked its three

    forward(ids[:, :16])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    before_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    held = forward(ids)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before_rss
    seconds = time.perf_counter() - start
    return {
        "mode": args.mode,
        "held_bytes": sum(t.numel() * t.element_size() for t in held),
        "peak_bytes": peak,
        "seconds": seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--mode", choices=["hooks", "all"], help=argparse.SUPPRESS)  # one child's measurement
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(child(args)))
        return 0
    passed = [a for a in sys.argv[1:] if not a.startswith("--json")]
    rows: dict[str, list[Any]] = {"hooks": [], "all": []}
    for repeat in range(args.repeats):
        for mode in ("hooks", "all") if repeat % 2 == 0 else ("all", "hooks"):
            out = subprocess.run(
                [sys.executable, __file__, *passed, "--mode", mode],
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": str(args.threads)},
                check=True,
            )
            rows[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"random Llama, {args.layers} layers x {args.hidden}, {args.tokens}-token prefill, {args.device} "
        f"{args.dtype}, aux layers 2, {args.layers // 2}, {args.layers - 3}; {args.repeats} interleaved repeats "
        f"(median, min-max)"
    )
    mib = 1024 * 1024
    for mode, label in (("hooks", "pre-hooks on 3 layers"), ("all", "output_hidden_states")):
        r = rows[mode]
        held = statistics.median(x["held_bytes"] for x in r) / mib
        peaks = [x["peak_bytes"] / mib for x in r]
        secs = [x["seconds"] for x in r]
        print(
            f"{label:>22}: states held {held:7.1f} MiB   peak growth {statistics.median(peaks):7.1f} MiB "
            f"({min(peaks):.1f}-{max(peaks):.1f})   prefill {statistics.median(secs):.2f} s "
            f"({min(secs):.2f}-{max(secs):.2f})"
        )
    ratio = [a["seconds"] / b["seconds"] for a, b in zip(rows["hooks"], rows["all"])]
    print(
        f"prefill time hooks / all, per repeat: median {statistics.median(ratio):.3f} "
        f"({min(ratio):.3f}-{max(ratio):.3f})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
