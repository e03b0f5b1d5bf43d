"""The one EAGLE-3 head-training driver, shared by `draftlab train-head` (app/commands/train_head.py) and the
worker's training jobs of kind "head" (app/training/training.py), as app/training/distill_driver.py is for
distillation: the settings and their command line, the HeadTrainer with its checkpoint, and the end: save the head in
the speculators format (and SGLang's layout beside it), reload it as a run's draft would be, measure greedy
speculation through the engine's loop on the held-out prompts, and write its model card (MODEL_CARD.md +
train_head.json).
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from app.training.distill_driver import (  # noqa: F401 (one shape)
    CHECKPOINT_DIR,
    CHECKPOINT_SECONDS,
    checkpoint,
    checkpoint_of,
    records,
    run_facts,
)
from engine.config import head_format
from engine.errors import DraftLabError
from engine.models import eagle3
from engine.models.loading import ModelPair, with_draft
from engine.training import distill as ds
from engine.training import head_training as ht
from engine.wording import plural

CARD_JSON = "train_head.json"


def head_command(settings: Mapping) -> str:
    """The exact `draftlab train-head` command of these settings, every one explicit (a --db password masked) but
    the draft vocabulary size when it is the default (the whole vocabulary: the CLI takes no 0)."""
    aux = settings.get("aux_layers")
    cmd = [
        "draftlab",
        "train-head",
        "--target",
        settings["target"],
        "--prompts",
        settings["prompts"],
        "--out",
        str(settings["out"]),
        "--steps",
        str(settings["steps"]),
        "--ttt-steps",
        str(settings["ttt_steps"]),
        "--aux-layers",
        ",".join(map(str, aux)) if aux else "auto",
        *(["--draft-vocab-size", str(settings["draft_vocab_size"])] if settings.get("draft_vocab_size") else []),
        "--lr",
        f"{settings['lr']:g}",
        "--max-new-tokens",
        str(settings["max_new_tokens"]),
        "--batch-size",
        str(settings["batch_size"]),
        "--samples",
        str(settings["samples"]),
        "--seed",
        str(settings["seed"]),
    ]
    if settings.get("device", "auto") != "auto":
        cmd += ["--device", settings["device"]]
    if settings.get("focus_from") is not None:
        cmd += ["--focus-from", str(settings["focus_from"])]
        if settings.get("db"):
            from storage.db.store import safe_url

            cmd += ["--db", safe_url(settings["db"])]
    return " ".join(shlex.quote(str(c)) for c in cmd)


def head_config(
    steps: int,
    lr: float,
    max_new_tokens: int,
    batch_size: int,
    seed: int,
    samples: int,
    ttt_steps: int,
    draft_vocab_size: int,
    aux_layers: list[int] | None,
) -> ht.HeadConfig:
    """The HeadTrainer's settings, checked (DraftLabError)."""
    return ht.HeadConfig(
        steps=int(steps),
        lr=float(lr),
        max_new_tokens=int(max_new_tokens),
        batch_size=int(batch_size),
        seed=int(seed),
        samples=int(samples),
        ttt_steps=int(ttt_steps),
        draft_vocab_size=int(draft_vocab_size or 0),
        aux_layers=aux_layers,
    )


def trainer(
    pair: ModelPair,
    train_prompts: list[str],
    val_prompts: list[str],
    cfg: ht.HeadConfig,
    focus: dict | None,
    ckpt: Path,
    name: str,
    verifier: str,
    **resume,
) -> tuple[ht.HeadTrainer, bool]:
    """The HeadTrainer, and whether it continues from the checkpoint in `ckpt` (the rule of distill_driver's
    distiller: a checkpoint of other settings is refused in one line)."""
    run = ht.HeadTrainer(
        pair,
        train_prompts,
        val_prompts,
        cfg,
        focus["type_weights"] if focus else None,
        focus["position_weights"] if focus else None,
        name=name,
        verifier=verifier,
    )
    return run, run.load_checkpoint(ckpt, **resume)


def finish(
    pair: ModelPair,
    out: Path,
    cfg: ht.HeadConfig,
    prepared: dict,
    done: dict,
    focus: dict | None,
    started: float,
    ckpt: Path,
    **card,
) -> dict:
    """Save, measure and describe the trained head (finish_head), then drop the checkpoint."""
    record = finish_head(pair, out, cfg, prepared, done, focus, started, **card)
    shutil.rmtree(ckpt, ignore_errors=True)
    return record


def finish_head(
    pair: ModelPair,
    out: Path,
    cfg: ht.HeadConfig,
    prepared: dict,
    done: dict,
    focus: dict | None,
    started: float,
    *,
    name: str,
    target: str,
    prompts: str,
    validation: str,
    validation_note: str,
    train_prompts: list[str],
    val_prompts: list[str],
    command: str,
) -> dict:
    """Save the trained head (pair.draft) to `out` in the dtype the target's directory records, reload it through
    `--draft OUT` (engine/loading.with_draft), measure greedy speculation at k on the held-out prompts and write the
    card; return the card's record (SPEC's `--json` keys among it)."""
    assert pair.draft is not None, "head training trains a draft head"
    head = pair.draft.model
    dtype = ds.saved_dtype(pair.target.source)
    dtype = dtype if dtype != torch.float32 else torch.float16  # a head is served beside a 16-bit target
    eagle3.save_head(head, out, dtype=dtype, speculative_tokens=cfg.k)
    try:  # SGLang's layout beside it (aux ids one lower, `midlayer.*`): what the deploy export's SGLang tab serves
        sglang = str(eagle3.save_sglang(head, head_format.sglang_dir(out), dtype=dtype))
    except DraftLabError as exc:  # a head SGLang would compute differently (e.g. norm_before_fc): say so on the card
        sglang = f"not written: {exc}"
    target_only = ModelPair(pair.target, None, pair.device, pair.dtype, pair.vocab_size)
    saved = with_draft(target_only, str(out))
    after = ds.greedy_alpha(saved, val_prompts, cfg.max_new_tokens, cfg.k, done["validation"], "eagle3")
    before = done["before"]
    last = done["curve"][-1]
    record = {
        "name": name,
        "target": target,
        "out": str(out),
        "prompts": prompts,
        "validation": validation,
        "validation_note": validation_note,
        "train_prompts": len(train_prompts),
        "validation_prompts": len(val_prompts),
        **ds.config_record(cfg),
        **{
            k: prepared[k]
            for k in ("train_sequences", "train_tokens", "validation_tokens", "draft_vocab_size", "aux_layers")
        },
        "parameters": sum(p.numel() for n, p in head.named_parameters() if "embed" not in n),
        "dtype": str(dtype).removeprefix("torch."),
        **run_facts(pair, cfg.samples, done, started),
        "focus": focus,
        "alpha_before": before["alpha"],
        "alpha_after": after["alpha"],
        "tokens_per_round_before": before["tokens_per_round"],
        "tokens_per_round_after": after["tokens_per_round"],
        "acceptance_length_before": before["acceptance_length"],
        "acceptance_length_after": after["acceptance_length"],
        "per_position_acceptance_before": before["per_position_acceptance"],
        "per_position_acceptance_after": after["per_position_acceptance"],
        "simulated_acceptance_length": last.get("acceptance_length"),
        "simulated_per_position": last.get("per_position"),
        "lossless_after": after.get("lossless"),
        "sglang_copy": sglang,
        "command": command,
    }
    (out / "MODEL_CARD.md").write_text(render_card(record), encoding="utf-8")
    (out / CARD_JSON).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return record


def _fmt(value, spec=".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and value != value) else format(value, spec)


def _positions(values) -> str:
    return ", ".join(_fmt(v, ".2f") for v in values or []) or "-"


def render_card(c: dict) -> str:
    """MODEL_CARD.md of a trained head from its record: data, recipe, conventions, curve, before/after."""
    curve = "\n".join(
        f"| {p['step']} | {_fmt(p['train_loss'], '.4f')} | {_fmt(p['kl'], '.4f')} | "
        f"{_positions(p.get('per_position'))} | {_fmt(p.get('acceptance_length'), '.2f')} |"
        for p in c["curve"]
    )
    aux = ", ".join(map(str, c["aux_layers"]))
    focus = c.get("focus")
    focus_text = (
        f"Per-token loss weights from experiment {focus['experiment_id']}'s run {focus['run_id']} "
        f"({focus['how']}): type of the predicted token x draft position (TTT step + 1), mean 1."
        if focus
        else "None: every continuation token weighs 1."
    )
    sglang_aux = ", ".join(str(i - 1) for i in c["aux_layers"])
    norm_before_fc = str(c.get("norm_before_fc", False)).lower()
    objective = (
        f"forward KL(p_target ‖ p_head) on the draft vocabulary, training-time test over {c['ttt_steps']} steps, "
        "step j weighted 0.8^j"
    )
    optimizer = (
        f"AdamW lr {c['lr']:g} ({c['warmup_steps']} warm-up steps, cosine to {c['lr'] * c['min_lr_ratio']:.2g}), "
        f"betas (0.9, 0.95), grad clip {c['grad_clip']}, seed {c['seed']}"
    )
    wall_time = (
        f"{ds.duration(c['train_seconds'])} training, {ds.duration(c['total_seconds'])} in all, "
        f"on {c['hardware']}, finished {c['finished']}"
    )
    positions_before = _positions(c["per_position_acceptance_before"])
    positions_after = _positions(c["per_position_acceptance_after"])
    length_before = _fmt(c["acceptance_length_before"], ".2f")
    length_after = _fmt(c["acceptance_length_after"], ".2f")
    return f"""# {c["name"]}

An EAGLE-3 head for `{c["target"]}` trained by `draftlab train-head` (engine/training/head_training.py): \
one Llama decoder
layer ({c["parameters"]:,} parameters besides the target's shared embedding) reading the target's hidden states at
aux layers {aux} and predicting over a {c["draft_vocab_size"]:,}-token draft vocabulary.

## Conventions

- Format: speculators (`config.json` with `speculators_model_type: "eagle3"`), served by vLLM as
  `{{"method": "eagle3", "model": "<this directory>", "num_speculative_tokens": k}}`; the embedding is not saved
  (the server shares the target's).
- Aux-layer ids `[{aux}]` in vLLM's convention: id i = the input of decoder layer i = transformers'
  `hidden_states[i]`. SGLang/SpecForge count one lower (id j = the output of layer j): `[{sglang_aux}]`.
  SGLang's layout of this head (those ids, `midlayer.*` weights): {c.get("sglang_copy")}.
- `norm_before_fc`: {norm_before_fc} (an RMSNorm over the aux states before `fc`: \
vLLM 0.32 applies it, SGLang never does).
- Draft vocabulary: the {c["draft_vocab_size"]:,} target ids most frequent in the training continuations
  (`d2t[d]` = target id − d, `t2d` = membership mask).

## Data

- prompts: `{c["prompts"]}` ({plural(c["train_prompts"], "prompt")}), rendered through the target's chat template
  when they are conversations; responses regenerated by the target: {c["continuations"]}
  ({c["train_sequences"]} sequences of up to {c["max_new_tokens"]} new tokens, {c["train_tokens"]:,} tokens)
- loss mask: continuation tokens only (never the prompt); positions whose target argmax lies outside the draft
  vocabulary are left out of the loss (they cannot be drafted) but count as misses in the figures
- held-out: `{c["validation"]}` ({plural(c["validation_prompts"], "prompt")}, {c["validation_tokens"]:,} target
  tokens){c.get("validation_note", "")}

## Recipe

| | |
|---|---|
| objective | {objective} |
| target features | online: one target forward per step (no stored hidden states) |
| steps | {c["steps"]} x {c["batch_size"]} sequences |
| optimizer | {optimizer} |
| wall time | {wall_time} |
| weights | {c["dtype"]} safetensors |

Curve (held-out, teacher-forced on the target's greedy continuations; acceptance per draft position is
conditional on the positions before it; acceptance length = 1 + expected accepted drafts at k = {c["ttt_steps"]}):

| step | train loss | held-out loss | acceptance by position | acceptance length |
|---|---|---|---|---|
{curve}

The curve starts a draft chain at every position; the engine's rounds start after the previous round's last
token, often right after a rejection, where drafting is harder, so the loop's figures below run lower.

## Focus

{focus_text}

## Before / after (held-out `{c["validation"]}`, greedy speculation through the engine's loop, k={c["k"]})

| | fresh head (first {ht.BEFORE_PROMPTS} prompts) | trained head |
|---|---|---|
| alpha | {_fmt(c["alpha_before"])} | {_fmt(c["alpha_after"])} |
| acceptance by position | {positions_before} | {positions_after} |
| acceptance length (1 + accepted per drafting round) | {length_before} | {length_after} |
| tokens per round | {_fmt(c["tokens_per_round_before"], ".2f")} | {_fmt(c["tokens_per_round_after"], ".2f")} |
| output == target-only | - | {c["lossless_after"]} |

(after: the saved {c["dtype"]} weights, reloaded as `--draft {c["out"]}`.)

## Reproduce

```
{c["command"]}
```
"""
