"""`draftlab train-head`: an EAGLE-3 head trained on the target's hidden states (app/training/head_driver.py, the
driver the worker's head jobs run too), with progress on stderr and the held-out figures printed."""

from __future__ import annotations

import json
import sys

from app.arguments import ID, described, positive_number, whole
from app.commands.common import CHAT_TEMPLATE_HELP, database_errors_reported, fail
from app.commands.training_run import show_training, training_inputs
from engine import zoo
from engine.config.variables import SETTINGS
from engine.wording import plural

NAME = "train-head"


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="train an EAGLE-3 head for a target (its hidden states; served by vLLM and SGLang)",
        description="Train a one-decoder-layer EAGLE-3 head on the target's own hidden states: the target's "
        "responses to the prompts (regenerated; conversations through its chat template), the aux "
        "layers' states and logits from one target forward per step, a training-time test over "
        "--ttt-steps draft positions, forward KL on a draft vocabulary of the most frequent tokens. "
        'Writes the speculators format vLLM loads as {"method": "eagle3", "model": OUT} with '
        "MODEL_CARD.md; held-out acceptance by position before/after through the engine's loop. "
        "Interrupted, it keeps OUT/.checkpoint: the same command continues from it.",
    )
    p.add_argument("--target", required=True, help=zoo.model_help("target"))
    p.add_argument(
        "--prompts",
        required=True,
        help="NAME[:tune] (held out: NAME:validation), a .jsonl/.csv/.txt file, or several joined with +",
    )
    p.add_argument(
        "--out",
        required=True,
        help="directory for the head (created if missing; an existing one must be empty, or hold "
        "only this command's checkpoint, unless --overwrite; never a shipped model)",
    )
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    p.add_argument(
        "--aux-layers",
        default="auto",
        help="target layers the head reads, vLLM's convention (id i = the input of decoder layer i): "
        "auto (2, L/2, L-3) or e.g. 2,6,9",
    )
    p.add_argument(
        "--draft-vocab-size",
        type=whole(1),
        default=0,
        help="draft vocabulary: the N most frequent target tokens in the responses (default: the "
        "whole vocabulary up to 32000)",
    )
    p.add_argument(
        "--ttt-steps",
        type=whole(1),
        default=4,
        help="training-time test steps S: the draft positions trained (default 4)",
    )
    p.add_argument("--steps", type=whole(1), default=600, help="optimiser steps (default 600)")
    p.add_argument(
        "--focus-from",
        type=ID,
        default=None,
        metavar="EXPERIMENT_ID",
        help="weight the loss by this experiment's rejection profile (token types, draft positions)",
    )
    p.add_argument("--chat-template", default="auto", help=CHAT_TEMPLATE_HELP)
    p.add_argument("--lr", type=positive_number, default=1e-3)
    p.add_argument(
        "--max-new-tokens",
        type=described(SETTINGS["max_new_tokens"]),
        default=128,
        help="length of the target's responses",
    )
    p.add_argument("--batch-size", type=whole(1), default=8, help="sequences per step (default 8)")
    p.add_argument(
        "--samples",
        type=whole(1),
        default=1,
        help="responses per prompt: the greedy one plus SAMPLES-1 drawn at temperature 1",
    )
    p.add_argument("--seed", type=described(SETTINGS["seed"]), default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--db", default=None, help="database of --focus-from")
    p.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"out", "steps", "aux_layers", "draft_vocab_size", "alpha_before", '
        '"alpha_after", "acceptance_length_after", "per_position_acceptance_after"}',
    )
    return p


def run(args) -> int:
    return database_errors_reported(_train_head, args)


def _train_head(args) -> int:
    """`draftlab train-head` (SPEC "EAGLE-3 heads"): check the settings and --out, load the target alone, train
    the head (app/training/head_driver.py, the driver the worker's head jobs run too), save it and print the held-out
    figures (a line, or SPEC's --json keys)."""
    import time

    from app.training import head_driver as driver
    from engine.errors import DraftLabError
    from engine.training import distill as ds
    from engine.training import head_training as ht

    started = time.perf_counter()
    try:
        cfg = driver.head_config(
            args.steps,
            args.lr,
            args.max_new_tokens,
            args.batch_size,
            args.seed,
            args.samples,
            args.ttt_steps,
            args.draft_vocab_size,
            ht.parse_aux_layers(args.aux_layers),
        )
        out = ds.check_distill_out(args.out, args.overwrite, driver.CHECKPOINT_DIR)
    except DraftLabError as exc:
        return fail(str(exc))
    inputs = training_inputs(args, cfg, None, lambda cfg, focus: None)
    if isinstance(inputs, int):
        return inputs
    focus, val_spec, val_note, train_prompts, val_prompts, pair = inputs
    ckpt = driver.checkpoint_of(out)
    try:
        run, continued = driver.trainer(
            pair,
            train_prompts,
            val_prompts,
            cfg,
            focus,
            ckpt,
            out.resolve().name,
            args.target,
            discard_other=args.overwrite,
        )
    except DraftLabError as exc:
        return fail(str(exc))
    shown = show_training(
        "train-head",
        run,
        ckpt,
        continued,
        cfg,
        out,
        len(train_prompts),
        len(val_prompts),
        lambda rec: (
            f"train loss {rec['train_loss']:.4f}, held-out acceptance by position "
            f"{', '.join('-' if a is None else f'{a:.2f}' for a in rec['per_position'])}, "
            f"acceptance length {rec['acceptance_length']:.2f}"
        ),
    )
    if isinstance(shown, int):
        return shown
    prepared, done = shown
    print(f"train-head: saving to {out} and measuring the saved head", file=sys.stderr, flush=True)
    settings = {**vars(args), "out": out, "aux_layers": run.aux_layers}
    record = driver.finish(
        run.pair,
        out,
        cfg,
        prepared,
        done,
        focus,
        started,
        ckpt,
        name=out.resolve().name,
        target=args.target,
        prompts=args.prompts,
        validation=val_spec,
        validation_note=val_note,
        train_prompts=train_prompts,
        val_prompts=val_prompts,
        command=driver.head_command(settings),
    )
    result = {
        "out": str(out),
        "steps": cfg.steps,
        "aux_layers": record["aux_layers"],
        "draft_vocab_size": record["draft_vocab_size"],
        "alpha_before": record["alpha_before"],
        "alpha_after": record["alpha_after"],
        "acceptance_length_after": record["acceptance_length_after"],
        "per_position_acceptance_after": record["per_position_acceptance_after"],
    }
    if args.json:
        print(json.dumps(result))
    else:
        per = ", ".join("-" if a is None else f"{a:.2f}" for a in record["per_position_acceptance_after"])
        print(
            f"{out}: {plural(cfg.steps, 'step')} in {done['seconds'] / 60:.1f} min; held-out {val_spec}, k={cfg.k}: "
            f"alpha {record['alpha_before']:.3f} -> {record['alpha_after']:.3f}, acceptance length "
            f"{record['acceptance_length_after']:.2f}, by position {per}; lossless {record['lossless_after']}"
        )
    return 0
