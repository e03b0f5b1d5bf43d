"""`draftlab` command line: run, worker, list, export, ui (the CLI contract: README, docs/metrics.md).

Bad input ends in exactly one `error: …` line on stderr and exit status 2; a failed run exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.arguments import ID as _ID
from app.arguments import described as _described
from app.arguments import positive_number as _positive_number
from app.arguments import whole as _whole
from app.db_errors import LOCKED_FIX, db_error_reason, locked, scrub
from app.runtime.db_retry import DB_RETRY_HELP  # torch-free, as this module's top must be
from app.ui import PORTS as UI_PORTS  # (stdlib only at import)
from engine import zoo  # the shipped models' names (plain Python, no torch)
from engine.config.limits import LIMITS
from engine.config.variables import SETTINGS, VARIABLES  # the swept variables and settings (plain Python, no torch)
from engine.wording import noun, plural
from storage.db.schema import NAME_CHARS
from storage.db.settings import STALE_HELP

EXIT_BAD_INPUT, EXIT_RUN_FAILED = 2, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise SystemExit(_fail(f"{message} (see `{self.prog} --help`)"))


def _fail(message: str, status: int = EXIT_BAD_INPUT) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


CHAT_TEMPLATE_HELP = (
    "how conversation prompts become text: auto (the target tokenizer's chat template, with the "
    "generation prompt), none (the turns' texts joined by blank lines), or a Jinja template FILE; "
    "plain prompts are never templated (default auto)"
)


from engine.config.run_config import DEFAULTS as RUN_DEFAULTS  # noqa: E402 - one value each (plain Python, no torch)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="draftlab", description="Tune speculative-decoding draft models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="baseline + one speculative run per swept value; prints a table or --json")
    run.add_argument("--target", required=True, help=zoo.model_help("target"))
    for variable in VARIABLES.values():  # --k, --temperature, --top-k, --top-p, --draft, --drafter
        # --drafter's default depends on --draft (engine/config/run_config.py default_drafter): None until the config says
        default = None if variable.name == "drafter" else variable.default
        run.add_argument(variable.flag, default=default, help=variable.help)
    run.add_argument(
        "--prompts",
        required=True,
        help="NAME[:SPLIT] (code, english, chinese, math, mixed; chat: conversations), a .jsonl/.csv/.txt/.parquet/.arrow file (a prompt, or a conversation: OpenAI messages or ShareGPT conversations), or several joined with + (code:validation+english:validation)",
    )
    run.add_argument("--chat-template", default="auto", help=CHAT_TEMPLATE_HELP)
    for setting in SETTINGS.values():  # --seed, --repeats, --max-new-tokens: engine/config/variables.py's settings
        cap = (
            f"; at most ${LIMITS[setting.limit].env}, default {LIMITS[setting.limit].default}" if setting.limit else ""
        )
        run.add_argument(
            setting.flag,
            type=_described(setting),
            default=RUN_DEFAULTS[setting.name],
            help=f"{setting.help} (default {RUN_DEFAULTS[setting.name]}{cap})",
        )
    run.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    run.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    run.add_argument("--trust-remote-code", action="store_true", help="allow model repos to run their own code")
    run.add_argument("--db", default=None, help="SQLAlchemy URL (default $DRAFTLAB_DB or sqlite:///draftlab.db)")
    run.add_argument("--name", default=None, help=f"the experiment's name (at most {NAME_CHARS} characters)")
    run.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    run.description = (
        f"Baseline + one speculative run per swept value (a comma list in at most one of "
        f"{', '.join(v.flag for v in VARIABLES.values())}), timed here and stored. Ctrl-C or SIGTERM stops it "
        f"with its runs interrupted (finished prompts stored; `draftlab resume` continues them). "
        f"{DB_RETRY_HELP}."
    )

    ui = sub.add_parser("ui", help="the dashboard, plus a local worker if none is alive")
    ui.add_argument("--db", default=None)
    ui.add_argument("--port", type=_whole(*UI_PORTS, what="a TCP port"), default=8501)
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; beyond loopback (0.0.0.0) it needs $DRAFTLAB_PASSWORD or OIDC "
        "in .streamlit/secrets.toml [auth]",
    )
    ui.add_argument(
        "--insecure",
        action="store_true",
        help="serve beyond loopback without a login (only behind a VPN or an authenticating proxy)",
    )

    worker = sub.add_parser(
        "worker", help="run queued runs", description=f"Run queued runs. {STALE_HELP}. {DB_RETRY_HELP}."
    )
    worker.add_argument("--db", default=None)
    worker.add_argument("--until-idle", action="store_true", help="exit when no queued run is left")
    worker.add_argument(
        "--devices",
        default=None,
        help="one worker process per device: `all` (every CUDA GPU; one CPU worker without one) or "
        "a comma list of cuda:N / cpu:N (cpu:N: CPU slots with leases of their own), or groups "
        "cuda:0+cuda:1 (one worker owning both, for targets larger than one GPU). Each child "
        "sees only its GPU (CUDA_VISIBLE_DEVICES) and holds that device's lease; a child that "
        "dies is restarted with backoff and its runs requeued; SIGTERM / Ctrl-C stops them all, "
        "their runs interrupted. Without it: one worker, each experiment on its own device",
    )

    lst = sub.add_parser(
        "list",
        help="experiments and runs",
        description=f"Experiments and runs. {STALE_HELP}; list marks such runs interrupted.",
    )
    lst.add_argument("--db", default=None)
    lst.add_argument("--json", action="store_true", help="print one JSON object")

    resume = sub.add_parser(
        "resume",
        help="requeue an experiment's interrupted, failed or cancelled runs",
        description=f"Requeue an experiment's interrupted, failed or cancelled runs. {STALE_HELP}; "
        f"resume requeues those too, in the same step.",
    )
    resume.add_argument("experiment_id", type=_ID)
    resume.add_argument("--db", default=None)

    distill = sub.add_parser(
        "distill",
        help="train a copy of a draft toward its target (KL on the target's continuations)",
        description="Distil a draft toward its target: forward KL(p_target || p_draft) on the target's greedy "
        "continuations of the prompts (generated once and cached with the target's top-k "
        "distributions), optionally weighted toward the token types and draft positions an experiment "
        "rejected most (--focus-from). Writes an HF model directory with MODEL_CARD.md; held-out KL and "
        "greedy alpha (k=4) before/after on the validation split of --prompts (a file: the same file). "
        "Interrupted (Ctrl-C, SIGTERM), it keeps its last checkpoint in OUT/.checkpoint (the target's "
        "continuations once, then the training state every 30 s): the same command continues from it.",
    )
    distill.add_argument("--target", required=True, help=zoo.model_help("target"))
    distill.add_argument("--draft", required=True, help="the draft to start from (same tokenizer as the target)")
    distill.add_argument(
        "--prompts",
        required=True,
        help="NAME[:tune] (held out: NAME:validation), a .jsonl/.csv/.txt file (held out: the same file), or several joined with + (code+english: held out code:validation+english:validation)",
    )
    distill.add_argument("--chat-template", default="auto", help=CHAT_TEMPLATE_HELP)
    distill.add_argument(
        "--steps", type=_whole(1), required=True, help="optimiser steps (each: --batch-size sequences)"
    )
    distill.add_argument(
        "--out",
        required=True,
        help="directory for the distilled model (created if missing; an existing one must be empty, "
        "or hold only this command's checkpoint, unless --overwrite; never a shipped model)",
    )
    distill.add_argument(
        "--overwrite", action="store_true", help="write into a non-empty --out (files of the same name are replaced)"
    )
    distill.add_argument(
        "--focus-from",
        type=_ID,
        default=None,
        metavar="EXPERIMENT_ID",
        help="weight the loss by this stored experiment's rejection profile (its best run): token "
        "types and draft positions with low acceptance count more",
    )
    distill.add_argument("--lr", type=_positive_number, default=3e-4)
    distill.add_argument(
        "--max-new-tokens",
        type=_described(SETTINGS["max_new_tokens"]),
        default=128,
        help="length of the target's continuations",
    )
    distill.add_argument("--batch-size", type=_whole(1), default=8, help="sequences per step (default 8)")
    distill.add_argument(
        "--samples",
        type=_whole(1),
        default=1,
        help="continuations per training prompt: the target's greedy one, plus SAMPLES-1 drawn from "
        "the target at temperature 1 (more data for small prompt sets; default 1)",
    )
    distill.add_argument("--seed", type=_described(SETTINGS["seed"]), default=0)
    distill.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    distill.add_argument(
        "--db", default=None, help="database of --focus-from (default $DRAFTLAB_DB or sqlite:///draftlab.db)"
    )
    distill.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"out", "steps", "kl_before", "kl_after", "alpha_before", "alpha_after"}',
    )

    head = sub.add_parser(
        "train-head",
        help="train an EAGLE-3 head for a target (its hidden states; served by vLLM and SGLang)",
        description="Train a one-decoder-layer EAGLE-3 head on the target's own hidden states: the target's "
        "responses to the prompts (regenerated; conversations through its chat template), the aux "
        "layers' states and logits from one target forward per step, a training-time test over "
        "--ttt-steps draft positions, forward KL on a draft vocabulary of the most frequent tokens. "
        'Writes the speculators format vLLM loads as {"method": "eagle3", "model": OUT} with '
        "MODEL_CARD.md; held-out acceptance by position before/after through the engine's loop. "
        "Interrupted, it keeps OUT/.checkpoint: the same command continues from it.",
    )
    head.add_argument("--target", required=True, help=zoo.model_help("target"))
    head.add_argument(
        "--prompts",
        required=True,
        help="NAME[:tune] (held out: NAME:validation), a .jsonl/.csv/.txt file, or several joined with +",
    )
    head.add_argument(
        "--out",
        required=True,
        help="directory for the head (created if missing; an existing one must be empty, or hold "
        "only this command's checkpoint, unless --overwrite; never a shipped model)",
    )
    head.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    head.add_argument(
        "--aux-layers",
        default="auto",
        help="target layers the head reads, vLLM's convention (id i = the input of decoder layer i): "
        "auto (2, L/2, L-3) or e.g. 2,6,9",
    )
    head.add_argument(
        "--draft-vocab-size",
        type=_whole(1),
        default=0,
        help="draft vocabulary: the N most frequent target tokens in the responses (default: the "
        "whole vocabulary up to 32000)",
    )
    head.add_argument(
        "--ttt-steps",
        type=_whole(1),
        default=4,
        help="training-time test steps S: the draft positions trained (default 4)",
    )
    head.add_argument("--steps", type=_whole(1), default=600, help="optimiser steps (default 600)")
    head.add_argument(
        "--focus-from",
        type=_ID,
        default=None,
        metavar="EXPERIMENT_ID",
        help="weight the loss by this experiment's rejection profile (token types, draft positions)",
    )
    head.add_argument("--chat-template", default="auto", help=CHAT_TEMPLATE_HELP)
    head.add_argument("--lr", type=_positive_number, default=1e-3)
    head.add_argument(
        "--max-new-tokens",
        type=_described(SETTINGS["max_new_tokens"]),
        default=128,
        help="length of the target's responses",
    )
    head.add_argument("--batch-size", type=_whole(1), default=8, help="sequences per step (default 8)")
    head.add_argument(
        "--samples",
        type=_whole(1),
        default=1,
        help="responses per prompt: the greedy one plus SAMPLES-1 drawn at temperature 1",
    )
    head.add_argument("--seed", type=_described(SETTINGS["seed"]), default=0)
    head.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    head.add_argument("--db", default=None, help="database of --focus-from")
    head.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"out", "steps", "aux_layers", "draft_vocab_size", "alpha_before", '
        '"alpha_after", "acceptance_length_after", "per_position_acceptance_after"}',
    )

    validate = sub.add_parser(
        "validate",
        help="rerun an experiment's chosen configuration (the verdict's: the best, "
        "or the cheaper one tied with it) on held-out prompts",
    )
    validate.add_argument("experiment_id", type=_ID)
    validate.add_argument(
        "--prompts",
        default=None,
        help="held-out prompts (default: the validation split of the experiment's built-in set)",
    )
    validate.add_argument("--db", default=None)
    validate.add_argument("--json", action="store_true", help="print one JSON object")

    export = sub.add_parser("export", help="an experiment's runs with metrics, and its per-token rows")
    export.add_argument("experiment_id", type=_ID)
    export.add_argument(
        "--format",
        choices=["csv", "json", "deploy"],
        default="csv",
        help="deploy: one JSON document with the equivalent vLLM, SGLang, llama.cpp and transformers "
        "settings of a run (the verdict's choice unless --run names one: the best, or the cheaper "
        "configuration statistically tied with it), with the verdict's ties and caveats",
    )
    export.add_argument(
        "--run",
        type=_ID,
        default=None,
        dest="run_id",
        help="deploy: the speculative run to carry to production (default: the verdict's choice)",
    )
    export.add_argument(
        "--batch-size",
        type=_whole(1),
        default=None,
        dest="batch_size",
        help="deploy, a grid: the batch size whose k schedule entry the one-k engines take (default "
        "the smallest; vLLM carries the whole schedule)",
    )
    export.add_argument(
        "--with-max-new-tokens",
        action="store_true",
        help="deploy: also carry the experiment's max new tokens as the serving length (by default "
        "it is left out: it was the test's measurement budget)",
    )
    export.add_argument(
        "--out",
        default=None,
        help="csv: directory for the files (default .; created if missing); json, deploy: file "
        "(default stdout; its folder must exist); an existing file is kept unless --overwrite",
    )
    export.add_argument("--overwrite", action="store_true", help="replace files --out already holds")
    export.add_argument("--db", default=None)
    from app.serving.import_metrics import add_parser as add_import_metrics

    add_import_metrics(sub)
    from app.serving.confirm import add_parser as add_confirm

    add_confirm(sub)
    from app.convert_head import add_parser as add_convert_head

    add_convert_head(sub)
    from app.check_head import add_parser as add_check_head

    add_check_head(sub)
    return parser


def cmd_run(args) -> int:
    """Enqueue the experiment, execute it here through the worker's code path, print the stored figures."""
    from transformers.utils import logging as hf_logging

    from app.sweep import parse_sweep
    from engine.config.drafter_specs import needs_draft_model
    from engine.config.limits import check_all
    from engine.config.run_config import RunConfig
    from engine.decoding.runs import check_k, encode_prompts
    from engine.errors import DraftLabError
    from engine.models.loading import load_pair, with_draft
    from engine.text.chat import render, resolve_option
    from engine.text.prompt_sets import load_prompts

    hf_logging.disable_progress_bar()  # the one bar on stderr is the runs' own: transformers' "Loading weights" cut in

    try:
        # Bad settings, prompts or models are bad input (exit 2): checked before anything is stored.
        check_all()  # a $DRAFTLAB_LIMIT_... typo, even for a limit no option here named
        options = {name: getattr(args, name) for name in VARIABLES}
        sweep = parse_sweep({**options, "draft": args.draft if args.draft is not None else "-"})
        if args.name is not None and len(args.name) > NAME_CHARS:
            raise DraftLabError(
                f"--name is {len(args.name)} characters, longer than the {NAME_CHARS} an experiment's "
                f"name holds; give a shorter one (notes hold the rest, on the dashboard)"
            )
        drafts = [None if d == "-" else d for d in sweep.drafts]
        chat_template = resolve_option(args.chat_template)  # a FILE's text: stored, so any worker renders alike
        # The run configuration (engine/config/run_config.py): every option parsed by its description (the drafter, when
        # none is named, from what the draft is), and each run's sampling configuration valid for the engine,
        # before anything is loaded or stored.
        config = RunConfig.from_args(args, sweep, chat_template)
        drafters = list(config.values) if config.sweep == "drafter" else [config.value("drafter")]
        if sweep.k_auto and drafters != ["model"]:
            raise DraftLabError(
                "--k auto predicts a constant-k curve: use it with --drafter model (the default); "
                "sweep --drafter with a fixed --k instead"
            )
        if any(needs_draft_model(spec) for spec in drafters) and None in drafts:
            raise DraftLabError(
                "--draft is missing: the model, heuristic and confidence drafters draft with a model; "
                "pass --draft MODEL, or use --drafter prompt-lookup:N alone"
            )
        for value in config.values:
            config.sampling(value)
        prompts = load_prompts(args.prompts)
        _check_batch_rows(sweep, len(prompts))  # before any model loads
        model_drafts = [d for d, spec in zip(drafts * len(drafters), drafters * len(drafts)) if needs_draft_model(spec)]
        first = model_drafts[0] if model_drafts else None
        pair = load_pair(args.target, first, args.device, args.dtype, args.trust_remote_code)
        others = {
            d: with_draft(pair, d, args.trust_remote_code) for d in dict.fromkeys([*model_drafts, None]) if d != first
        }
        for k in sweep.ks:
            for p in [pair, *others.values()]:
                check_k(p, k)
        prompts = render(prompts, pair.tokenizer, chat_template, what=args.prompts)
        encoded = encode_prompts(pair, prompts, config.value("max_new_tokens"))
        _check_batch_sizes(sweep, pair, others, encoded, args.max_new_tokens)
    except DraftLabError as exc:
        return _fail(str(exc))
    store = open_store_or_fail(args.db, write=True, create=True)  # a bad --db or a read-only database: exit 2
    if isinstance(store, int):
        return store
    enqueue = {**config.enqueue(), "name": args.name}
    arms = 1 + len(sweep.values) + (len(sweep.values) - 1 if VARIABLES[sweep.variable].per_value_baseline else 0)
    arms *= len(sweep.batch_sizes or [None])
    return _run_here(args, store, pair, others, prompts, enqueue, arms)


def _check_batch_rows(sweep, prompts: int) -> int:
    """The largest batch size of the sweep; a DraftLabError when it has more rows than there are prompts."""
    from engine.errors import DraftLabError

    largest = max(sweep.sizes)
    if largest > prompts:
        raise DraftLabError(
            f"--batch-size {largest} needs at least {largest} prompts but the prompt set has "
            f"{prompts}; use --batch-size {prompts} or less, or more prompts"
        )
    return largest


def _check_batch_sizes(sweep, pair, others: dict, encoded: list, max_new_tokens: int) -> None:
    """Refuse, before anything is stored, a batch size with more rows than prompts (never silently a smaller
    batch) or whose KV caches cannot fit in what the device has free (engine/decoding/memory.py)."""
    from engine.decoding.memory import check_batch_fits

    largest = _check_batch_rows(sweep, len(encoded))
    if largest == 1:
        return  # the batch-1 loops: nothing batched to size
    drafts = [p.draft.model for p in (pair, *others.values()) if p.draft is not None]
    models = [pair.target.model] + drafts[:1]  # the target and its draft (the largest one when several)
    if len(drafts) > 1:
        models = [pair.target.model, max(drafts, key=lambda m: sum(t.numel() for t in m.parameters()))]
    check_batch_fits(
        models, pair.device, largest, max(int(ids.shape[-1]) for ids in encoded), max_new_tokens, max(sweep.ks)
    )


def cmd_validate(args) -> int:
    """Rerun an experiment's best configuration and its baseline on held-out prompts, here, as a linked
    experiment; print tune against validation with the verdict in words."""
    from engine.decoding.runs import encode_prompts
    from engine.errors import DraftLabError
    from engine.models.loading import load_pair
    from engine.text.chat import render
    from engine.text.prompt_sets import load_prompts
    from storage.analysis.validation import ValidationError, validation_plan

    store = open_store_or_fail(args.db, write=True)
    if isinstance(store, int):
        return store
    try:
        plan = validation_plan(store, args.experiment_id, args.prompts)
        prompts = load_prompts(plan["prompts"])
        draft = plan["draft"] or None
        from engine.config.drafter_specs import needs_draft_model

        pair = load_pair(
            plan["target"],
            draft if needs_draft_model(plan["drafter"]) else None,
            plan["device"],
            plan["dtype"],
            plan["trust_remote_code"],
        )
        prompts = render(prompts, pair.tokenizer, plan["chat_template"], what=plan["prompts"])
        encode_prompts(pair, prompts, plan["sampling"]["max_new_tokens"])
    except (ValidationError, DraftLabError) as exc:
        return _fail(str(exc))
    args.repeats, args.name = plan["repeats"], plan["name"]
    return _run_here(args, store, pair, {}, prompts, plan, 2, report=_validation_report)


def _validation_report(store, experiment_id: int, as_json: bool) -> str:
    from storage.analysis.validation import validation_result
    from storage.serving.export import plain

    result = validation_result(store, experiment_id)
    keys = [
        "run_id",
        "k",
        "status",
        "speedup",
        "speedup_ci_lo",
        "speedup_ci_hi",
        "alpha",
        "tokens_per_round",
        "accepted",
        "rejected",
        "c",
        "verify_cost",
        "timing_warning",
        "prompts_done",
    ]
    doc = plain(
        {
            **result,
            "tune": {key: result["tune"][key] for key in keys},
            "validation": {key: result["validation"][key] for key in keys},
        }
    )
    if as_json:
        return json.dumps(doc)
    return (
        f"experiment {experiment_id} validates experiment {doc['validates']} "
        f"(k={doc['configuration']['k']}, {doc['configuration']['drafter']}, {doc['configuration']['draft']})\n"
        f"{doc['reason']}"
    )


def _show_training(
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
                bar.update(1)
            elif kind == "before":
                print(f"{label}: before: held-out alpha {rec['alpha']:.3f}", file=sys.stderr, flush=True)
                bar = tqdm(total=cfg.steps, desc=label, unit="step", file=sys.stderr, dynamic_ncols=True, mininterval=1)
            elif kind == "step":
                bar.update(1)
                bar.set_postfix(loss=f"{rec['loss']:.4f}", lr=f"{rec['lr']:.2e}", refresh=False)
                if time.monotonic() - last_checkpoint >= driver.CHECKPOINT_SECONDS and run.step < cfg.steps:
                    saved = driver.checkpoint(run, ckpt)  # between two steps: a resume repeats none and skips none
                    last_checkpoint = time.monotonic()
            elif kind == "eval":
                bar.write(f"{label}: step {rec['step']}: {eval_line(rec)}", file=sys.stderr)
            elif kind == "prepared":
                prepared = rec
            elif kind == "prepared_saved":
                saved = 0
            elif kind == "trained":
                done = rec
    except DraftLabError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
            bar = None
        if saved is None:
            return _fail(
                f"interrupted before the model was saved; nothing was written to {out} (rerun the command)", 130
            )
        return _fail(
            f"interrupted at step {run.step}; no model saved yet. {ckpt} holds step {saved}: run the same "
            f"command again to continue from it",
            130,
        )
    finally:
        if bar is not None:
            bar.close()
    return prepared, done


def _training_inputs(args, cfg, draft: str | None, focus_on):
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
            return _fail(str(exc))
        finally:
            store.dispose()
        focus_on(cfg, focus)
    try:
        val_spec, val_note = held_out_split(args.prompts)
        train_prompts, val_prompts = load_prompts(args.prompts), load_prompts(val_spec)
        pair = load_pair(args.target, draft, args.device, "float32")
        chat_template = resolve_option(args.chat_template)
        train_prompts = render(train_prompts, pair.tokenizer, chat_template, what=args.prompts)
        val_prompts = render(val_prompts, pair.tokenizer, chat_template, what=val_spec)
        encode_prompts(pair, train_prompts, cfg.max_new_tokens)
        encode_prompts(pair, val_prompts, cfg.max_new_tokens)
    except DraftLabError as exc:
        return _fail(str(exc))
    return focus, val_spec, val_note, train_prompts, val_prompts, pair


def cmd_train_head(args) -> int:
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
        return _fail(str(exc))
    inputs = _training_inputs(args, cfg, None, lambda cfg, focus: None)
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
        return _fail(str(exc))
    shown = _show_training(
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


def cmd_distill(args) -> int:
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
        return _fail(str(exc))
    inputs = _training_inputs(args, cfg, args.draft, driver.focus_on)
    if isinstance(inputs, int):
        return inputs
    focus, val_spec, val_note, train_prompts, val_prompts, pair = inputs

    ckpt = driver.checkpoint_of(out)
    try:
        run, continued = driver.distiller(
            pair, train_prompts, val_prompts, cfg, focus, ckpt, discard_other=args.overwrite
        )
    except DraftLabError as exc:
        return _fail(str(exc))
    shown = _show_training(
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


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the runs are closed as interrupted and the command says how to resume."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def _run_here(args, store, pair, others, prompts, enqueue: dict, arms: int, report=None) -> int:
    """cmd_run once the input is checked: enqueue, time the runs here, print the stored figures. A database
    that fails for good, Ctrl-C and SIGTERM each end in one `error:` line that says what is stored and how to
    continue (password hidden), never a traceback."""
    import shlex
    import signal
    import threading

    from sqlalchemy.exc import SQLAlchemyError

    from app.db_errors import DatabaseUnavailable, transient_db_error
    from app.report import format_table
    from app.worker.worker import Worker
    from storage.db.errors import QueueError
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment, get_experiment
    from storage.serving.export import run_document

    url, safe = store.url, store.safe_url

    def continue_with(experiment_id):
        quoted = shlex.quote(safe)
        return f"`draftlab resume {experiment_id} --db {quoted}` and then `draftlab worker --db {quoted}`"

    progress = _ProgressBar(len(prompts), enqueue["sampling"]["max_new_tokens"], arms, args.repeats)
    try:
        worker = Worker(
            store, progress_hook=progress.update, log=lambda message: progress.write(scrub(str(message), url))
        )
    except QueueError as exc:  # a bad $DRAFTLAB_STALE_SECONDS / $DRAFTLAB_DB_RETRY_SECONDS
        progress.close()
        return _fail(str(exc))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    experiment_id, failure = None, None
    try:
        worker.start()  # registered before its reserved runs exist, so no other worker takes them for orphans
        from pages.widgets.access import cli_launcher

        experiment_id = enqueue_experiment(
            store, **enqueue, prompt_texts=prompts, reserved_for=worker.id, launched_by=cli_launcher()
        )
        worker.adopt(pair, get_experiment(store, experiment_id), others)
        worker.work(until_idle=True, experiment_id=experiment_id)
    except KeyboardInterrupt as exc:
        status, what = (
            (128 + signal.SIGTERM, "terminated (SIGTERM)") if isinstance(exc, _Terminated) else (130, "interrupted")
        )
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        progress.close()
        if experiment_id is not None:
            try:  # one attempt; if the database refuses, the runs of this (then gone) process are swept as dead
                run_state.interrupt_queued(store, experiment_id, "`draftlab run` was stopped before this run started")
            except SQLAlchemyError:
                pass
        _stop_quietly(worker)
        if experiment_id is None:
            return _fail(f"{what} before anything was stored", status)
        return _fail(f"{what}; finished prompts are stored. Continue with {continue_with(experiment_id)}", status)
    except QueueError as exc:  # the queue's last check refused a value (nothing was stored)
        _stop_quietly(worker)
        progress.close()
        return _fail(str(exc))
    except DatabaseUnavailable as exc:
        failure = str(exc)
    except SQLAlchemyError as exc:
        if not transient_db_error(exc):
            raise
        failure = f"the database {safe} failed ({db_error_reason(exc, url)})"
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    _stop_quietly(worker)
    progress.close()
    if failure is not None and (experiment_id is None or worker.unfinished):
        if experiment_id is None:
            return _fail(f"{failure}; nothing was run. {DB_FIX}", EXIT_RUN_FAILED)
        runs = ", ".join(str(r) for r in sorted(worker.unfinished))
        return _fail(
            f"{failure}; every prompt committed before is kept, and {noun(len(worker.unfinished), 'run')} "
            f"{runs} show as interrupted once "
            f"it accepts writes. Continue with {continue_with(experiment_id)}",
            EXIT_RUN_FAILED,
        )
    try:
        doc = run_document(store, experiment_id)
    except SQLAlchemyError as exc:
        return _fail(
            f"the database {safe} failed while reading experiment {experiment_id}'s results "
            f"({db_error_reason(exc, url)}); they are stored: `draftlab list --db {shlex.quote(safe)}`",
            EXIT_RUN_FAILED,
        )
    print(report(store, experiment_id, args.json) if report else json.dumps(doc) if args.json else format_table(doc))
    failed: dict[tuple, list[int]] = {}  # runs that share one status and error: one line
    for r in [doc["baseline"], *doc["runs"]]:
        if r and r.get("status") != "done":
            failed.setdefault((r["status"], r.get("error") or ""), []).append(r["run_id"])
    for (status, error), ids in failed.items():
        which = f"run {ids[0]}" if len(ids) == 1 else "runs " + ", ".join(map(str, ids))
        print(f"error: {which} {status}: {error} (stored in {safe})", file=sys.stderr)
    return EXIT_RUN_FAILED if failed else 0


def _stop_quietly(worker) -> None:
    """worker.stop(), whose only failure left is a database that refuses: the worker's log said so already."""
    try:
        worker.stop()
    except Exception:  # noqa: BLE001
        pass


class _ProgressBar:
    """Token progress of the whole experiment on stderr (tqdm), fed by the worker's progress hook: every
    (run, prompt, repeat) decode counts up to max_new_tokens; runs queued later (`--k auto`) extend the total."""

    PREFIX = "draftlab run: "  # the command's own lines: `draftlab run` times the runs itself, no worker is involved

    def __init__(self, prompts: int, max_new_tokens: int, runs: int, repeats: int = 1):
        from tqdm import tqdm

        self.per_prompt, self.per_run = max_new_tokens, prompts * max_new_tokens * repeats
        self.bar = tqdm(total=self.per_run * runs, unit="tok", file=sys.stderr, dynamic_ncols=True)
        self.expected_runs, self.runs_seen = runs, set()
        self.decodes: dict[tuple, int] = {}

    def update(self, run: dict, prompt_index: int, tokens: int, repeat: int = 0) -> None:
        if run["id"] not in self.runs_seen:
            self.runs_seen.add(run["id"])
            if len(self.runs_seen) > self.expected_runs:
                self.bar.total += self.per_run
        self.bar.set_description(
            f"prompt {prompt_index + 1} " + ("baseline" if run["kind"] == "baseline" else f"k={run['k']}"),
            refresh=False,
        )
        self.decodes[(run["id"], prompt_index, repeat)] = min(tokens, self.per_prompt)
        done = sum(self.decodes.values())
        self.bar.update(max(0, done - self.bar.n))

    def write(self, message: str) -> None:
        """A line of this command's own (`draftlab run: run 2 (speculative, k=1) done`; no worker process is
        involved). Above the bar while it moves; once it is full, without redrawing it: close() draws the final
        progress line once (tqdm.write redrew the full bar after every message, so it printed four times)."""
        line = f"{self.PREFIX}{message}"
        if self.bar.n < self.bar.total:
            self.bar.write(line, file=sys.stderr)
        else:
            self.bar.clear()
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.set_description("all runs", refresh=False)
        self.bar.update(self.bar.total - self.bar.n) if self.bar.n < self.bar.total else None
        self.bar.close()


def cmd_worker(args) -> int:
    from app.worker.worker_process import run_worker

    store = open_store_or_fail(args.db, write=True, create=True)  # the worker registers itself: it writes
    if isinstance(store, int):
        return store
    url = store.url
    store.dispose()
    if args.devices is not None:
        from app.worker.supervisor import DevicesError, parse_devices, run_supervisor

        try:
            devices = parse_devices(args.devices)
        except DevicesError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        if devices != ["cpu"]:
            return run_supervisor(
                url,
                devices,
                until_idle=args.until_idle,
                log=lambda m: print(f"supervisor: {scrub(str(m), url)}", file=sys.stderr, flush=True),
            )
    return run_worker(url, until_idle=args.until_idle, log=_worker_log(url))


def _stale_window_or_fail():
    """$DRAFTLAB_STALE_SECONDS as seconds, or EXIT_BAD_INPUT after one `error:` line."""
    from storage.db.errors import QueueError
    from storage.db.settings import stale_window

    try:
        return stale_window()
    except QueueError as exc:
        return _fail(str(exc))


def cmd_list(args) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from engine.config.variables import variable
    from storage.analysis import catalog
    from storage.jobs import liveness
    from storage.records import queries as q
    from storage.serving.export import plain

    stale = _stale_window_or_fail()
    if isinstance(stale, int):
        return stale
    store = open_store_or_fail(args.db)
    if isinstance(store, int):
        return store
    try:  # runs whose worker is gone show as interrupted, not `running` forever (a read-only database: as stored)
        liveness.mark_stale(store, stale)
    except SQLAlchemyError:
        pass
    experiments = catalog.experiments(store)
    if args.json:
        doc = [
            {**plain(e), "runs": plain(q.runs(store, int(e["experiment_id"])).to_dict(orient="records"))}
            for e in experiments.to_dict(orient="records")
        ]
        print(json.dumps({"experiments": doc}))
        return 0
    if experiments.empty:
        print(f"no experiments in {store.safe_url}")
        return 0
    fmt = lambda v, spec: format(v, spec) if v is not None and v == v else "-"  # noqa: E731
    for e in experiments.itertuples():
        swept = variable(e.sweep_variable)
        print(
            f"experiment {e.experiment_id}  {e.name}  [{e.status} {100 * e.progress:.0f}%]  "
            f"{e.target} / {e.draft}  prompts {e.prompts}  {e.sweep_variable}={e.sweep_values}"
            + (f" at batch sizes {e.batch_sizes}" if e.batch_sizes else "")
        )
        for r in q.runs(store, int(e.experiment_id)).itertuples():
            what = "baseline" if r.kind == "baseline" else f"{swept.name}={swept.show(swept.run_value(r))}"
            what += f" @{int(r.batch_size)}" if e.batch_sizes else ""
            print(
                f"  run {r.run_id:<5} {what:<14} {r.status:<11} {100 * r.progress:3.0f}%  "
                f"{fmt(r.tokens_per_second, '8.1f')} tok/s  speedup {fmt(r.speedup, '.2f')}  "
                f"alpha {fmt(r.alpha, '.3f')}" + (f"  error: {r.error}" if _present(r.error) else "")
            )
    return 0


def cmd_resume(args) -> int:
    from storage.jobs import liveness, run_state
    from storage.records import queries as q

    stale = _stale_window_or_fail()
    if isinstance(stale, int):
        return stale
    store = open_store_or_fail(args.db, write=True)
    if isinstance(store, int):
        return store
    if q.experiment(store, args.experiment_id) is None:
        return _fail(f"no experiment {args.experiment_id} in {store.safe_url}; `draftlab list` shows the ids")
    liveness.mark_stale(store, stale)  # a dead owner's runs (process gone here, or no heartbeat) are requeued too
    n = run_state.resume_experiment(store, args.experiment_id)
    print(
        f"requeued {plural(n, 'run')} of experiment {args.experiment_id}; a worker continues each from its first "
        f"unfinished prompt (`draftlab worker --db {store.safe_url}`)"
    )
    running = int((q.runs(store, args.experiment_id)["status"] == "running").sum())
    if running:
        print(
            f"{plural(running, 'run')} of experiment {args.experiment_id} {noun(running, 'is', 'are')} still running on a live worker (heartbeat "
            f"within {stale:g}s): left to it"
        )
    return 0


def cmd_export(args) -> int:
    from storage.serving.deploy import DeployError, deploy_document
    from storage.serving.export import export_csv, export_json

    if args.run_id is not None and args.format != "deploy":
        return _fail(f"--run applies to --format deploy only (got --format {args.format})")
    if args.batch_size is not None and args.format != "deploy":
        return _fail(f"--batch-size applies to --format deploy only (got --format {args.format})")
    if args.with_max_new_tokens and args.format != "deploy":
        return _fail(f"--with-max-new-tokens applies to --format deploy only (got --format {args.format})")
    problem = _export_out_problem(args)
    if problem:
        return _fail(problem)
    store = open_store_or_fail(args.db)
    if isinstance(store, int):
        return store
    try:
        if args.format in ("json", "deploy"):
            doc = (
                json.dumps(export_json(store, args.experiment_id))
                if args.format == "json"
                else json.dumps(
                    deploy_document(store, args.experiment_id, args.run_id, args.with_max_new_tokens, args.batch_size),
                    indent=2,
                )
            )
            if args.out in (None, "-"):
                print(doc)
            else:
                with open(args.out, "w", encoding="utf-8") as f:
                    f.write(doc)
                print(args.out)
        else:
            for path in export_csv(store, args.experiment_id, args.out or "."):
                print(path)
    except OSError as exc:  # the folder went away or turned unwritable since the check
        return _fail(
            f"cannot write --out {args.out or '.'} ({exc.strerror or exc}); pass a file or folder you can write to"
        )
    except KeyError:
        return _fail(f"no experiment {args.experiment_id} in {store.safe_url}; `draftlab list` shows the ids")
    except DeployError as exc:
        return _fail(str(exc))
    return 0


def _store_command(args, command) -> int:
    """Run `command(args, store)` on the writable database; its refusals (DraftLabError, ProductionError) end in one
    `error:` line."""
    from engine.errors import DraftLabError
    from storage.records.production import ProductionError

    store = open_store_or_fail(args.db, write=True)
    if isinstance(store, int):
        return store
    try:
        return command(args, store)
    except (DraftLabError, ProductionError) as exc:
        return _fail(str(exc))
    finally:
        store.dispose()


def cmd_import_metrics(args) -> int:
    from app.serving.import_metrics import command

    return _store_command(args, command)


def cmd_confirm(args) -> int:
    from app.serving.confirm import command

    return _store_command(args, command)


def cmd_convert_head(args) -> int:
    from app.convert_head import command
    from engine.errors import DraftLabError

    try:
        return command(args)
    except DraftLabError as exc:
        return _fail(str(exc))


def cmd_check_head(args) -> int:
    from app.check_head import command
    from engine.errors import DraftLabError

    try:
        return command(args)
    except DraftLabError as exc:
        return _fail(str(exc))


def _export_out_problem(args) -> str | None:
    """What is wrong with `export --out`, checked before the database is read: json and deploy write one file
    (not a directory, in a folder that exists), csv writes its files into a directory (created if missing, not a
    file); a file already there is kept unless --overwrite."""
    import os
    from pathlib import Path

    from storage.serving.export import csv_names

    if args.format in ("json", "deploy"):
        if args.out in (None, "-"):
            return None
        out = Path(args.out).expanduser()
        if out.is_dir():
            return (
                f"--out {args.out} is a directory; --format {args.format} writes one file: name it, e.g. "
                f"--out {os.path.join(args.out, f'experiment-{args.experiment_id}.json')}"
            )
        folder = out.parent if str(out.parent) else Path(".")
        if not folder.is_dir():
            return f"--out {args.out}: the folder {folder} does not exist; create it first or name a file in a folder that exists"
        files = [out] if out.exists() else []
    else:
        out = Path(args.out or ".").expanduser()
        if out.exists() and not out.is_dir():
            return (
                f"--out {args.out} is a file; --format csv writes {len(csv_names(args.experiment_id))} files "
                f"into a directory: pass a directory (created if missing)"
            )
        files = [out / name for name in csv_names(args.experiment_id) if (out / name).exists()]
    if files and not args.overwrite:
        shown = ", ".join(str(f) for f in files)
        return f"--out: {shown} already exists; pass --overwrite to replace it, or another --out"
    return None


EXIT_CLOSED_PIPE = 128 + 13  # what a shell reports for a command stopped by SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """Every subcommand; a closed stdout (`draftlab list | head`) ends quietly with EXIT_CLOSED_PIPE."""
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # inside the try: a pipe closed early fails here, not at interpreter exit
        return status
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_CLOSED_PIPE


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's final flush of the dead pipe is silent too."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file descriptor (captured, replaced): nothing to flush later
        pass


def _dispatch(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a parse error (already reported)
        return int(exc.code or 0)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "convert-head":  # no database
        return cmd_convert_head(args)
    commands = {
        "worker": cmd_worker,
        "list": cmd_list,
        "resume": cmd_resume,
        "export": cmd_export,
        "validate": cmd_validate,
        "distill": cmd_distill,
        "train-head": cmd_train_head,
        "import-metrics": cmd_import_metrics,
        "confirm": cmd_confirm,
    }
    if args.command == "check-head":
        return cmd_check_head(args)
    if args.command in commands:
        return _database_errors_reported(commands[args.command], args)
    if args.command == "ui":
        from app.ui import main as ui_main

        return ui_main(db=args.db, port=args.port, host=args.host, insecure=args.insecure)
    return _fail(f"unknown command {args.command!r}")


# --- helpers shared by the subcommands -----------------------------------------------------------------------

DB_FIX = "check --db / $DRAFTLAB_DB"


def open_store_or_fail(db: str | None, write: bool = False, create: bool = False):
    """The Store for `db` (--db, else $DRAFTLAB_DB, else the default), or EXIT_BAD_INPUT after one `error:` line
    on stderr naming the database (password hidden) and the fix. `write=True` also makes sure the database
    accepts writes (a read-only SQLite file opens fine and fails only at the first write). `create`: a command
    that may start a new database (run, worker); the others only read an existing one and never create it (a
    typo'd --db is "no database at ...").

    Use: `store = open_store_or_fail(args.db); if isinstance(store, int): return store`.
    """
    from storage import open_store
    from storage.db.store import NoDatabase, resolve_url

    url = resolve_url(db)
    try:
        store = open_store(url, existing=not create)
    except NoDatabase as exc:
        return _fail(f"{exc}; {DB_FIX}: only `draftlab run`, `worker` and `ui` create a database")
    except Exception as exc:  # noqa: BLE001 - bad URL, missing driver, unreachable server, unwritable file, newer schema
        return _database_failed(url, exc, "cannot open the database {db}")
    if write:
        try:
            store.check_writable()
        except Exception as exc:  # noqa: BLE001
            store.dispose()
            return _database_failed(
                url,
                exc,
                "the database {db} does not accept writes",
                f"{DB_FIX} (a writable database) or make this one writable",
            )
    return store


def _database_failed(url: str, exc: BaseException, failed: str, fix: str = DB_FIX) -> int:
    """One `error:` line for a database error: `failed` (its {db} the database, password hidden), the reason and
    `fix`; a lock another connection holds is said as such, with its fix (wait and retry), whatever failed."""
    from storage.db.store import safe_url

    reason = db_error_reason(exc, url)
    if locked(exc):
        return _fail(f"the database {safe_url(url)} is locked ({reason}): {LOCKED_FIX}")
    return _fail(f"{failed.format(db=safe_url(url))} ({reason}); {fix}")


def _database_errors_reported(command, args) -> int:
    """Run a subcommand; a database failure after opening (the server went away, the file turned read-only)
    ends in one `error:` line and exit status 2, not a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    from storage.db.store import resolve_url

    try:
        return command(args)
    except SQLAlchemyError as exc:
        return _database_failed(resolve_url(args.db), exc, "the database {db} failed")


def _present(value) -> bool:
    """A value a frame cell really holds: not None, not NaN (pandas fills a sibling's missing text with NaN), not ''."""
    return value is not None and value == value and str(value).strip() != ""


def _worker_log(url: str):
    """The worker's stderr log line, with the database password hidden in every message."""
    return lambda message: print(f"worker: {scrub(str(message), url)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
