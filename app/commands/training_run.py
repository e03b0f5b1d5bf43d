"""What `draftlab distill` and `draftlab train-head` share: their inputs checked and loaded (the --focus-from weights,
the prompts and their held-out split through the chat template, the pair in float32), and the trainer's records
(app/training/distill_driver.py records) shown with progress bars on stderr, checkpointing between two steps."""

from __future__ import annotations

import sys

from app.commands.common import fail, open_store_or_fail


def show_training(
    label: str, run, ckpt, continued: bool, cfg, out, train_count: int, val_count: int, eval_line
) -> tuple[dict, dict] | int:
    """Drive a trainer's records (app/distill_driver.records) with progress bars on stderr, checkpointing every
    CHECKPOINT_SECONDS between two steps; return (prepared, trained) records, or an exit code after an error or
    an interrupt (saying how to continue). `eval_line(record)` words a held-out point."""
    import time

    from tqdm import tqdm

    from app.training import distill_driver as driver
    from engine.errors import DraftLabError

    bar, done, prepared, saved = None, None, None, None
    if continued:  # the same command, interrupted before: continue where its checkpoint is
        print(
            f"{label}: continuing from the checkpoint in {ckpt} at step {run.step} of {cfg.steps}",
            file=sys.stderr,
            flush=True,
        )
        prepared, saved = run.prepared, run.step
        bar = tqdm(
            total=cfg.steps,
            initial=run.step,
            desc=label,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=1,
        )
    last_checkpoint = time.monotonic()
    try:
        for rec in driver.records(run, ckpt, continued):
            kind = rec["kind"]
            if kind == "phase":
                if bar is not None:
                    bar.close()
                    bar = None
                if rec["phase"].startswith("target continuations"):
                    total = cfg.samples * train_count if "train" in rec["phase"] else val_count
                    bar = tqdm(total=total, desc=rec["phase"], unit="prompt", file=sys.stderr, dynamic_ncols=True)
                else:
                    print(f"{label}: {rec['phase']}", file=sys.stderr, flush=True)
            elif kind == "generated":
                assert bar is not None  # the "target continuations" phase opened it
                bar.update(1)
            elif kind == "before":
                print(f"{label}: before: held-out alpha {rec['alpha']:.3f}", file=sys.stderr, flush=True)
                bar = tqdm(total=cfg.steps, desc=label, unit="step", file=sys.stderr, dynamic_ncols=True, mininterval=1)
            elif kind == "step":
                assert bar is not None  # "before" (or the continued run) opened it
                bar.update(1)
                bar.set_postfix(loss=f"{rec['loss']:.4f}", lr=f"{rec['lr']:.2e}", refresh=False)
                if time.monotonic() - last_checkpoint >= driver.CHECKPOINT_SECONDS and run.step < cfg.steps:
                    saved = driver.checkpoint(run, ckpt)  # between two steps: a resume repeats none and skips none
                    last_checkpoint = time.monotonic()
            elif kind == "eval":
                assert bar is not None  # an eval comes between two steps
                bar.write(f"{label}: step {rec['step']}: {eval_line(rec)}", file=sys.stderr)
            elif kind == "prepared":
                prepared = rec
            elif kind == "prepared_saved":
                saved = 0
            elif kind == "trained":
                done = rec
    except DraftLabError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
            bar = None
        if saved is None:
            return fail(
                f"interrupted before the model was saved; nothing was written to {out} (rerun the command)", 130
            )
        return fail(
            f"interrupted at step {run.step}; no model saved yet. {ckpt} holds step {saved}: run the same "
            f"command again to continue from it",
            130,
        )
    finally:
        if bar is not None:
            bar.close()
    assert prepared is not None and done is not None  # a fresh run's records hold "prepared", every run's "trained"
    return prepared, done


def training_inputs(args, cfg, draft: str | None, focus_on):
    """What `distill` and `train-head` both read before training: the --focus-from weights (applied to cfg with
    `focus_on`), the prompts and their held-out split, rendered through the chat template, and the pair loaded in
    float32 (draft None: the target alone). Returns (focus, val_spec, val_note, train_prompts, val_prompts, pair),
    or an exit code after a one-line error."""
    from engine.decoding.runs import encode_prompts
    from engine.errors import DraftLabError
    from engine.models.loading import load_pair
    from engine.text.chat import render, resolve_option
    from engine.text.prompt_sets import held_out_split, load_prompts
    from storage.analysis.focus import focus_weights

    focus = None
    if args.focus_from is not None:
        store = open_store_or_fail(args.db)
        if isinstance(store, int):
            return store
        try:
            focus = focus_weights(store, args.focus_from)
        except DraftLabError as exc:
            return fail(str(exc))
        finally:
            store.dispose()
        focus_on(cfg, focus)
    try:
        val_spec, val_note = held_out_split(args.prompts)
        train_set, val_set = load_prompts(args.prompts), load_prompts(val_spec)
        pair = load_pair(args.target, draft, args.device, "float32")
        chat_template = resolve_option(args.chat_template)
        train_prompts = render(train_set, pair.tokenizer, chat_template, what=args.prompts)
        val_prompts = render(val_set, pair.tokenizer, chat_template, what=val_spec)
        encode_prompts(pair, train_prompts, cfg.max_new_tokens)
        encode_prompts(pair, val_prompts, cfg.max_new_tokens)
    except DraftLabError as exc:
        return fail(str(exc))
    return focus, val_spec, val_note, train_prompts, val_prompts, pair
