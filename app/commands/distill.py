"""`draftlab distill`: a copy of a draft trained toward its target (app/training/distill_driver.py, the driver the
worker's training jobs run too), with progress on stderr and the held-out figures printed."""

from __future__ import annotations

import json
import sys

from app.arguments import ID, described, positive_number, whole
from app.commands.common import CHAT_TEMPLATE_HELP, database_errors_reported, fail
from app.commands.training_run import show_training, training_inputs
from engine import zoo
from engine.config.variables import SETTINGS
from engine.wording import plural

NAME = "distill"


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="train a copy of a draft toward its target (KL on the target's continuations)",
        description="Distil a draft toward its target: forward KL(p_target || p_draft) on the target's greedy "
        "continuations of the prompts (generated once and cached with the target's top-k "
        "distributions), optionally weighted toward the token types and draft positions an experiment "
        "rejected most (--focus-from). Writes an HF model directory with MODEL_CARD.md; held-out KL and "
        "greedy alpha (k=4) before/after on the validation split of --prompts (a file: the same file). "
        "Interrupted (Ctrl-C, SIGTERM), it keeps its last checkpoint in OUT/.checkpoint (the target's "
        "continuations once, then the training state every 30 s): the same command continues from it.",
    )
    p.add_argument("--target", required=True, help=zoo.model_help("target"))
    p.add_argument("--draft", required=True, help="the draft to start from (same tokenizer as the target)")
    p.add_argument(
        "--prompts",
        required=True,
        help="NAME[:tune] (held out: NAME:validation), a .jsonl/.csv/.txt file (held out: the same file), or several "
        "joined with + (code+english: held out code:validation+english:validation)",
    )
    p.add_argument("--chat-template", default="auto", help=CHAT_TEMPLATE_HELP)
    p.add_argument("--steps", type=whole(1), required=True, help="optimiser steps (each: --batch-size sequences)")
    p.add_argument(
        "--out",
        required=True,
        help="directory for the distilled model (created if missing; an existing one must be empty, "
        "or hold only this command's checkpoint, unless --overwrite; never a shipped model)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="write into a non-empty --out (files of the same name are replaced)"
    )
    p.add_argument(
        "--focus-from",
        type=ID,
        default=None,
        metavar="EXPERIMENT_ID",
        help="weight the loss by this stored experiment's rejection profile (its best run): token "
        "types and draft positions with low acceptance count more",
    )
    p.add_argument("--lr", type=positive_number, default=3e-4)
    p.add_argument(
        "--max-new-tokens",
        type=described(SETTINGS["max_new_tokens"]),
        default=128,
        help="length of the target's continuations",
    )
    p.add_argument("--batch-size", type=whole(1), default=8, help="sequences per step (default 8)")
    p.add_argument(
        "--samples",
        type=whole(1),
        default=1,
        help="continuations per training prompt: the target's greedy one, plus SAMPLES-1 drawn from "
        "the target at temperature 1 (more data for small prompt sets; default 1)",
    )
    p.add_argument("--seed", type=described(SETTINGS["seed"]), default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument(
        "--db", default=None, help="database of --focus-from (default $DRAFTLAB_DB or sqlite:///draftlab.db)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"out", "steps", "kl_before", "kl_after", "alpha_before", "alpha_after"}',
    )
    return p


def run(args) -> int:
    return database_errors_reported(_distill, args)


def _distill(args) -> int:
    """Check everything (settings, --out, --focus-from, prompts, the pair), then train and write the model
    directory; print the held-out figures (a table, or --json). The steps, checkpoints and card are
    app/training/distill_driver.py's (the worker's training jobs run the same driver); this shows its records."""
    import time

    from app.training import distill_driver as driver
    from engine.errors import DraftLabError
    from engine.training import distill as ds

    started = time.perf_counter()
    try:
        cfg = driver.distill_config(args.steps, args.lr, args.max_new_tokens, args.batch_size, args.seed, args.samples)
        out = ds.check_distill_out(args.out, args.overwrite, driver.CHECKPOINT_DIR)
    except DraftLabError as exc:
        return fail(str(exc))
    inputs = training_inputs(args, cfg, args.draft, driver.focus_on)
    if isinstance(inputs, int):
        return inputs
    focus, val_spec, val_note, train_prompts, val_prompts, pair = inputs

    ckpt = driver.checkpoint_of(out)
    try:
        run, continued = driver.distiller(
            pair, train_prompts, val_prompts, cfg, focus, ckpt, discard_other=args.overwrite
        )
    except DraftLabError as exc:
        return fail(str(exc))
    shown = show_training(
        "distill",
        run,
        ckpt,
        continued,
        cfg,
        out,
        len(train_prompts),
        len(val_prompts),
        lambda rec: f"train loss {rec['train_loss']:.4f}, held-out KL {rec['kl']:.4f}",
    )
    if isinstance(shown, int):
        return shown
    prepared, done = shown
    print(f"distill: saving to {out} and measuring the saved weights", file=sys.stderr, flush=True)
    record = driver.finish(
        pair,
        out,
        cfg,
        prepared,
        done,
        focus,
        started,
        ckpt,
        name=out.resolve().name,
        target=args.target,
        draft=args.draft,
        prompts=args.prompts,
        validation=val_spec,
        validation_note=val_note,
        train_prompts=train_prompts,
        val_prompts=val_prompts,
        command=driver.distill_command(vars(args)),
    )
    result = {
        "out": str(out),
        "steps": cfg.steps,
        "kl_before": record["kl_before"],
        "kl_after": record["kl_after"],
        "alpha_before": record["alpha_before"],
        "alpha_after": record["alpha_after"],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{out}: {plural(cfg.steps, 'step')} in {done['seconds'] / 60:.1f} min; held-out {val_spec}: KL "
            f"{record['kl_before']:.4f} -> {record['kl_after']:.4f}, alpha {record['alpha_before']:.3f} -> "
            f"{record['alpha_after']:.3f}; lossless {record['lossless_after']}"
        )
    return 0
