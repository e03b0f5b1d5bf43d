"""Train one of the shipped demo models on the stdlib corpus (CPU is enough; nanoGPT style).

    python -m engine.zoo.train --model demo-draft  --minutes 12
    python -m engine.zoo.train --model demo-target --minutes 65
    python -m engine.zoo.train --model demo-target --steps 3000      # exact, as written in MODEL_CARD.md

Fixed seeds; a tqdm progress bar; a checkpoint every --ckpt-every steps under checkpoints/<model>/ that a
restart resumes from (same command). With --minutes and no --steps, the step count is fixed once from the
measured speed of the first steps and stored in the checkpoint (the card records it, so --steps reproduces
the run). At the end: fp16 safetensors + config.json + generation_config.json + tokenizer + MODEL_CARD.md in
engine/zoo/<model>/ (or --out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.zoo import ZOO_DIR
from engine.zoo.corpus import documents, held_out

CKPT_ROOT = Path("checkpoints")


@dataclass
class ModelShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int = 4096
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True


@dataclass
class TrainConfig:
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 1234
    steps: int = 0  # 0: fixed from --minutes when the decay phase starts
    decay_start: int = 0  # step where the LR starts its linear decay (0: 80 % of steps)
    ckpt_every: int = 100
    eval_batches: int = 20
    kd_teacher: str = ""  # optional: a model dir to distil from (KD loss mixed with CE)
    kd_weight: float = 0.0


SHAPES = {
    # target: many layers (CPU forward cost is mostly per-layer overhead, so depth sets c)
    "demo-target": ModelShape(hidden_size=256, num_hidden_layers=12, num_attention_heads=4, intermediate_size=512),
    # draft: 2 thin layers
    "demo-draft": ModelShape(hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=512),
    # a draft with another vocabulary: demo-draft's shape over its own 2048-token tokenizer (engine/zoo/tokenizer.py)
    "demo-draft-othervocab": ModelShape(
        hidden_size=192, num_hidden_layers=2, num_attention_heads=3, intermediate_size=512, vocab_size=2048
    ),
    # demo-draft-distilled is not trained here: `draftlab distill` makes it from demo-draft (see its MODEL_CARD.md)
}
DEFAULT_LR = {"demo-target": 1.5e-3, "demo-draft": 3e-3, "demo-draft-othervocab": 3e-3}
SHARED_TOKENIZER = "byte-level BPE, 4096 tokens, shared by all demo models (`python -m engine.zoo.tokenizer`)"
OTHER_TOKENIZER = (
    "byte-level BPE, 2048 tokens of its own, trained on every other corpus document (engine/zoo/tokenizer.py "
    "`other_documents`): another vocabulary than demo-target's, drafting over their intersection"
)


def build_model(shape: ModelShape, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )
    return LlamaForCausalLM(cfg)


def load_data(tokenizer, cache: Path):
    """Token streams (train, val) of the whole corpus, cached under checkpoints/."""
    if cache.exists():
        d = torch.load(cache)
        return d["train"], d["val"], d["meta"]
    docs = documents()
    eot = tokenizer.eos_token_id
    train_ids: list[int] = []
    val_ids: list[int] = []
    enc = tokenizer.backend_tokenizer.encode_batch([t for _, t in docs])
    for (name, _), e in zip(docs, enc):
        (val_ids if held_out(name) else train_ids).extend([eot] + e.ids)
    meta = {"documents": len(docs), "train_tokens": len(train_ids), "val_tokens": len(val_ids)}
    train = torch.tensor(train_ids, dtype=torch.int16)  # vocab 4096 fits
    val = torch.tensor(val_ids, dtype=torch.int16)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"train": train, "val": val, "meta": meta}, cache)
    return train, val, meta


def get_batch(data: torch.Tensor, cfg: TrainConfig, gen: torch.Generator):
    ix = torch.randint(0, len(data) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
    x = torch.stack([data[i : i + cfg.seq_len] for i in ix.tolist()]).long()
    y = torch.stack([data[i + 1 : i + 1 + cfg.seq_len] for i in ix.tolist()]).long()
    return x, y


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Warm-up, stable, decay (WSD): linear warm-up, constant LR, then a linear decay to min_lr over the last
    stretch [decay_start, steps). With a wall budget the decay starts at 80 % of the budget, so the schedule
    ends on time whatever the machine's speed; the card records both numbers, so --steps/--decay-start
    reproduce it exactly."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    start = (cfg.decay_start or int(0.8 * cfg.steps)) if cfg.steps else 0
    if not cfg.steps or step < start:
        return cfg.lr
    progress = min(1.0, (step - start) / max(1, cfg.steps - start))
    return cfg.lr * (1 - (1 - cfg.min_lr_ratio) * progress)


@torch.no_grad()
def evaluate(model, val: torch.Tensor, cfg: TrainConfig) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    losses = []
    for _ in range(cfg.eval_batches):
        x, y = get_batch(val, cfg, gen)
        logits = model(input_ids=x).logits
        losses.append(F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def save_checkpoint(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def export(model, tokenizer, out: Path, card: dict) -> None:
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    m = model.to(torch.float16).eval()
    m.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=128,
    )
    m.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / "MODEL_CARD.md").write_text(render_card(card), encoding="utf-8")
    (out / "training.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def render_card(c: dict) -> str:
    s = c["shape"]
    architecture = (
        f"LlamaForCausalLM, {s['num_hidden_layers']} layers, hidden {s['hidden_size']}, "
        f"{s['num_attention_heads']} heads, MLP {s['intermediate_size']}, vocab {s['vocab_size']}, "
        f"context {s['max_position_embeddings']}, tied embeddings: {s['tie_word_embeddings']}"
    )
    training = (
        f"{c['steps']} steps x {c['batch_size']} x {c['seq_len']} tokens = {c['training_tokens']:,} tokens "
        f"(corpus: {c['corpus_train_tokens']:,} train tokens, {c['corpus_val_tokens']:,} held-out)"
    )
    optimizer = (
        f"AdamW lr {c['lr']} ({c['warmup_steps']} warm-up steps, constant, linear decay to "
        f"{c['lr'] * c['min_lr_ratio']:.2g} from step {c['decay_start']}), wd {c['weight_decay']}, seed {c['seed']}"
        f"{c.get('kd_note', '')}"
    )
    interim = (f"**Interim:** {c['interim']}\n\n") if c.get("interim") else ""
    return f"""# {c["model"]}

A tiny Llama-architecture causal LM shipped with DraftLab so that the demo pair runs on a laptop CPU with no
download. It is trained from scratch on the Python standard library's source, `pydoc_data` topics and a small
synthetic block of Chinese and arithmetic text (see `engine/zoo/corpus.py`). It writes Python-looking text;
it is not a useful general model.

| | |
|---|---|
| architecture | {architecture} |
| parameters | {c["parameters"]:,} |
| tokenizer | {c.get("tokenizer", SHARED_TOKENIZER)} |
| weights | float16 safetensors |
| training | {training} |
| optimizer | {optimizer} |
| final loss | train {c["final_train_loss"]:.3f}, held-out {c["final_val_loss"]:.3f} (nats/token) |
| wall time | {c["wall_minutes"]:.1f} min on {c["hardware"]} |
| Python | {c["python"]} (the corpus is this version's stdlib) |

{interim}Reproduce (from the repository root; resumes from `checkpoints/{c["model"]}/` if interrupted):

```
{c["command"]}
```
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, choices=sorted(SHAPES))
    ap.add_argument("--minutes", type=float, default=0.0, help="wall budget (sets --steps from measured speed)")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--decay-start", type=int, default=0, help="step where the LR decay starts (default 80%%)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    ap.add_argument("--seq-len", type=int, default=TrainConfig.seq_len)
    ap.add_argument("--seed", type=int, default=TrainConfig.seed)
    ap.add_argument("--ckpt-every", type=int, default=TrainConfig.ckpt_every)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 default: on a shared 2-core machine 2 threads oversubscribe badly)",
    )
    ap.add_argument("--teacher", default="", help="model dir to distil from (KD loss); off by default")
    ap.add_argument("--kd-weight", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=None, help="export dir (default engine/zoo/<model>/)")
    ap.add_argument("--ckpt-dir", type=Path, default=None)
    ap.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    ap.add_argument(
        "--export-only",
        action="store_true",
        help="export the current checkpoint as it is (an interim model; training is not run)",
    )
    args = ap.parse_args(argv)
    if not args.steps and not args.minutes and not args.export_only:
        ap.error("give --steps or --minutes")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from engine.zoo.tokenizer import OTHER_VOCAB, OTHER_VOCAB_SIZE, load_or_train, other_documents

    if args.model == "demo-draft-othervocab":
        tokenizer = load_or_train(CKPT_ROOT / OTHER_VOCAB, OTHER_VOCAB_SIZE, other_documents())
        train, val, meta = load_data(tokenizer, CKPT_ROOT / f"data-{OTHER_VOCAB}.pt")
    else:
        tokenizer = load_or_train(CKPT_ROOT / "tokenizer")
        train, val, meta = load_data(tokenizer, CKPT_ROOT / "data.pt")
    print(
        f"corpus: {meta['documents']} documents, {meta['train_tokens']:,} train / {meta['val_tokens']:,} "
        f"held-out tokens",
        flush=True,
    )

    shape = SHAPES[args.model]
    cfg = TrainConfig(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        lr=args.lr if args.lr is not None else DEFAULT_LR[args.model],
        seed=args.seed,
        steps=args.steps,
        decay_start=args.decay_start,
        ckpt_every=args.ckpt_every,
        kd_teacher=args.teacher,
        kd_weight=args.kd_weight,
    )
    model = build_model(shape, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.model}: {n_params:,} parameters, {dataclasses.asdict(shape)}", flush=True)

    teacher = None
    if cfg.kd_teacher and cfg.kd_weight > 0:
        from transformers import AutoModelForCausalLM

        teacher = AutoModelForCausalLM.from_pretrained(cfg.kd_teacher, dtype=torch.float32).eval()

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
    )

    ckpt_path = (args.ckpt_dir or CKPT_ROOT / args.model) / "ckpt.pt"
    step, elapsed, last_loss = 0, 0.0, float("nan")
    if ckpt_path.exists() and not args.fresh:
        st = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, elapsed = st["step"], st["elapsed"]
        if not args.steps:
            cfg.steps = st["cfg"]["steps"]
            cfg.decay_start = st["cfg"].get("decay_start", 0)
        last_loss = st.get("loss", float("nan"))
        print(f"resumed from {ckpt_path} at step {step} ({elapsed / 60:.1f} min done, {cfg.steps} planned)", flush=True)

    from tqdm import tqdm

    model.train()
    t_start = time.perf_counter()
    base_elapsed = elapsed
    bar = tqdm(total=cfg.steps or None, initial=step, desc=args.model, dynamic_ncols=True, mininterval=5)
    ema = None
    interim = None
    if args.export_only:
        if not step:
            ap.error(f"--export-only: no checkpoint at {ckpt_path}")
        interim = (
            f"interim export of the checkpoint at step {step} (planned: {cfg.steps or 'not fixed yet'}); "
            f"not the final weights"
        )
        cfg.eval_batches = 4
    while not args.export_only:
        if cfg.steps and step >= cfg.steps:
            break
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        x, y = get_batch(train, cfg, gen)
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        total = loss
        if teacher is not None:
            with torch.no_grad():
                t_logits = teacher(input_ids=x).logits
            kd = (
                F.kl_div(F.log_softmax(logits, -1), F.log_softmax(t_logits, -1), log_target=True, reduction="batchmean")
                / cfg.seq_len
            )
            total = (1 - cfg.kd_weight) * loss + cfg.kd_weight * kd
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        elapsed = base_elapsed + time.perf_counter() - t_start
        last_loss = loss.item()
        ema = last_loss if ema is None else 0.95 * ema + 0.05 * last_loss
        bar.update(1)
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}", min=f"{elapsed / 60:.1f}", refresh=False)
        if not cfg.steps and elapsed >= 0.8 * args.minutes * 60:
            # the decay phase gets the last 20 % of the budget, at the average speed so far
            cfg.decay_start = step
            cfg.steps = step + max(1, round(step * 0.25))
            bar.total = cfg.steps
            print(f"\n{elapsed / step:.2f} s/step: LR decay from step {step} to {cfg.steps}", flush=True)
        if step % 50 == 0:
            print(f"\nstep {step}/{cfg.steps} loss {ema:.4f} lr {lr:.2e} {elapsed / 60:.1f} min", flush=True)
        if step % cfg.ckpt_every == 0 or (cfg.steps and step >= cfg.steps):
            save_checkpoint(
                ckpt_path,
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "step": step,
                    "elapsed": elapsed,
                    "cfg": dataclasses.asdict(cfg),
                    "loss": ema,
                },
            )
        if args.minutes and elapsed > args.minutes * 60 * 1.25:
            print(f"\nwall budget exceeded at step {step}; stopping early", flush=True)
            cfg.steps = step
            save_checkpoint(
                ckpt_path,
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "step": step,
                    "elapsed": elapsed,
                    "cfg": dataclasses.asdict(cfg),
                    "loss": ema,
                },
            )
            break
    bar.close()

    val_loss = evaluate(model, val, cfg)
    print(
        f"final: train loss {ema if ema is not None else last_loss:.4f}, held-out {val_loss:.4f}, "
        f"{elapsed / 60:.1f} min",
        flush=True,
    )
    done_steps = step if interim else cfg.steps
    cmd = ["python", "-m", "engine.zoo.train", "--model", args.model, "--steps", str(done_steps)]
    if cfg.decay_start:
        cmd += ["--decay-start", str(cfg.decay_start)]
    if args.lr is not None:
        cmd += ["--lr", str(args.lr)]
    if args.batch_size != TrainConfig.batch_size:
        cmd += ["--batch-size", str(args.batch_size)]
    if args.seq_len != TrainConfig.seq_len:
        cmd += ["--seq-len", str(args.seq_len)]
    if args.seed != TrainConfig.seed:
        cmd += ["--seed", str(args.seed)]
    if teacher is not None:
        cmd += ["--teacher", args.teacher, "--kd-weight", str(args.kd_weight)]
    import platform

    card = {
        "model": args.model,
        "shape": dataclasses.asdict(shape),
        "parameters": n_params,
        "steps": done_steps,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "training_tokens": done_steps * cfg.batch_size * cfg.seq_len,
        "corpus_train_tokens": meta["train_tokens"],
        "corpus_val_tokens": meta["val_tokens"],
        "lr": cfg.lr,
        "min_lr_ratio": cfg.min_lr_ratio,
        "warmup_steps": cfg.warmup_steps,
        "decay_start": cfg.decay_start or int(0.8 * cfg.steps),
        "weight_decay": cfg.weight_decay,
        "seed": cfg.seed,
        "final_train_loss": float(ema if ema is not None else last_loss),
        "final_val_loss": val_loss,
        "wall_minutes": elapsed / 60,
        "hardware": f"{torch.get_num_threads()} CPU threads ({platform.machine()})",
        "python": platform.python_version(),
        "command": " ".join(shlex.quote(c) for c in cmd),
    }
    if args.model == "demo-draft-othervocab":
        card["tokenizer"] = OTHER_TOKENIZER
    if interim:
        card["interim"] = interim
    if teacher is not None:
        card["kd_note"] = f"; KD from {args.teacher} weight {args.kd_weight}"
    out = args.out or ZOO_DIR / args.model
    export(model, tokenizer, out, card)
    print(f"exported {args.model} -> {out}", flush=True)


if __name__ == "__main__":
    main()
