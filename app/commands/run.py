"""`draftlab run`: a baseline and one speculative run per swept value, checked here (bad input exits 2 before
anything is stored), then timed in this process through the worker's code path (app/commands/in_process.py) and
printed as a table or one JSON object."""

from __future__ import annotations

import sys

from app.arguments import described
from app.commands.common import CHAT_TEMPLATE_HELP, fail, open_store_or_fail
from app.runtime.db_retry import DB_RETRY_HELP  # torch-free, as a command module's top must be
from engine import zoo  # the shipped models' names (plain Python, no torch)
from engine.config.drafter_specs import DEFAULT_DRAFTER, SPECS
from engine.config.limits import LIMITS
from engine.config.run_config import DEFAULTS as RUN_DEFAULTS  # one value each (plain Python, no torch)
from engine.config.variables import SETTINGS, VARIABLES  # the swept variables and settings (plain Python, no torch)
from storage.db.schema import NAME_CHARS

NAME = "run"


def drafter_help() -> str:
    """--drafter's help, from the drafter declarations (engine/config/drafter_specs.py SPECS, read when the parser
    is built): every spec form, the default and the drafter an EAGLE-3 head drafts with when none is named."""
    head = next((spec.name for spec in SPECS.values() if spec.needs_hidden_states), None)
    default = "the default" + (f"; {head} when the draft is an EAGLE-3 head" if head else "")
    forms = [spec.usage + (f" ({default})" if spec.name == DEFAULT_DRAFTER else "") for spec in SPECS.values()]
    return f"{_listed(forms, 'or')}; a comma list compares them"


def _listed(items: list[str], last: str) -> str:
    """'a, b or c' (`last`: 'or', 'and')."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def prompts_help() -> str:
    """--prompts' help, from the prompt sets' declarations (engine/text/prompt_sets.py: the built-in sets, the
    conversation sets, the file types)."""
    from engine.text.prompt_sets import CHAT_SETS, FILE_EXTENSIONS, PROMPT_SETS, SPLITS, UNION

    chats = f"; {', '.join(CHAT_SETS)}: conversations" if CHAT_SETS else ""
    first, second = PROMPT_SETS[0], PROMPT_SETS[1 % len(PROMPT_SETS)]
    return (
        f"NAME[:SPLIT] ({', '.join(PROMPT_SETS)}{chats}), a {'/'.join(FILE_EXTENSIONS)} file (a prompt, or a "
        f"conversation: OpenAI messages or ShareGPT conversations), or several joined with {UNION} "
        f"({first}:{SPLITS[-1]}{UNION}{second}:{SPLITS[-1]})"
    )


def variable_help(variable) -> str:
    """A swept variable's help: its declaration's (engine/config/variables.py), the drafter's from SPECS."""
    return drafter_help() if variable.name == "drafter" else variable.help


def add_parser(sub):
    p = sub.add_parser(NAME, help="baseline + one speculative run per swept value; prints a table or --json")
    p.add_argument("--target", required=True, help=zoo.model_help("target"))
    for variable in VARIABLES.values():  # --k, --temperature, --top-k, --top-p, --draft, --drafter, ...
        # --drafter's default depends on --draft (engine/config/run_config.py default_drafter): None until the
        # config says
        default = None if variable.name == "drafter" else variable.default
        p.add_argument(variable.flag, default=default, help=variable_help(variable))
    p.add_argument(
        "--prompts",
        required=True,
        help=prompts_help(),
    )
    p.add_argument("--chat-template", default="auto", help=CHAT_TEMPLATE_HELP)
    for setting in SETTINGS.values():  # --seed, --repeats, --max-new-tokens: engine/config/variables.py's settings
        limit = LIMITS[setting.limit] if setting.limit else None
        cap = f"; at most ${limit.env}, default {limit.default}" if limit else ""
        p.add_argument(
            setting.flag,
            type=described(setting),
            default=RUN_DEFAULTS[setting.name],
            help=f"{setting.help} (default {RUN_DEFAULTS[setting.name]}{cap})",
        )
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--trust-remote-code", action="store_true", help="allow model repos to run their own code")
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default $DRAFTLAB_DB or sqlite:///draftlab.db)")
    p.add_argument("--name", default=None, help=f"the experiment's name (at most {NAME_CHARS} characters)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.description = (
        f"Baseline + one speculative run per swept value (a comma list in at most one of "
        f"{', '.join(v.flag for v in VARIABLES.values())}), timed here and stored. Ctrl-C or SIGTERM stops it "
        f"with its runs interrupted (finished prompts stored; `draftlab resume` continues them). "
        f"{DB_RETRY_HELP}."
    )
    return p


def run(args) -> int:
    """Enqueue the experiment, execute it here through the worker's code path, print the stored figures."""
    from transformers.utils import logging as hf_logging

    from app.commands.in_process import run_here
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
        # The run configuration (engine/config/run_config.py): every option parsed by its description (the drafter,
        # when none is named, from what the draft is), and each run's sampling configuration valid for the engine,
        # before anything is loaded or stored.
        config = RunConfig.from_args(args, sweep, chat_template)
        drafters = list(config.values) if config.sweep == "drafter" else [config.value("drafter")]
        if sweep.k_auto and drafters != [DEFAULT_DRAFTER]:
            raise DraftLabError(
                f"--k auto predicts a constant-k curve: use it with --drafter {DEFAULT_DRAFTER} (the default); "
                f"sweep --drafter with a fixed --k instead"
            )
        if any(needs_draft_model(spec) for spec in drafters) and None in drafts:
            raise DraftLabError(_draft_missing())
        for value in config.values:
            config.sampling(value)
        prompt_set = load_prompts(args.prompts)
        _check_batch_rows(sweep, len(prompt_set))  # before any model loads
        model_drafts = [d for d, spec in zip(drafts * len(drafters), drafters * len(drafts)) if needs_draft_model(spec)]
        first = model_drafts[0] if model_drafts else None
        pair = load_pair(args.target, first, args.device, args.dtype, args.trust_remote_code)
        others = {
            d: with_draft(pair, d, args.trust_remote_code) for d in dict.fromkeys([*model_drafts, None]) if d != first
        }
        for k in sweep.ks:
            for p in [pair, *others.values()]:
                check_k(p, k)
        prompts = render(prompt_set, pair.tokenizer, chat_template, what=args.prompts)
        encoded = encode_prompts(pair, prompts, config.value("max_new_tokens"))
        _check_batch_sizes(sweep, pair, others, encoded, args.max_new_tokens)
        _warn_outside_vocab([pair, *others.values()], encoded)
    except DraftLabError as exc:
        return fail(str(exc))
    store = open_store_or_fail(args.db, write=True, create=True)  # a bad --db or a read-only database: exit 2
    if isinstance(store, int):
        return store
    enqueue = {**config.enqueue(), "name": args.name}
    arms = 1 + len(sweep.values) + (len(sweep.values) - 1 if VARIABLES[sweep.variable].per_value_baseline else 0)
    arms *= len(sweep.batch_sizes or [None])
    return run_here(args, store, pair, others, prompts, enqueue, arms)


def _warn_outside_vocab(pairs: list, encoded: list) -> None:
    """One line on stderr per draft with another vocabulary (engine/models/vocab_bridge.py): its coverage, and the
    share of the prompts' tokens outside it."""
    from engine.models.vocab_bridge import describe, prompt_warning

    ids = [e[0].tolist() for e in encoded]
    for p in pairs:
        if p.mapping is not None:
            warning = prompt_warning(p.mapping, ids)
            print(
                f"draft {p.draft.name}: {describe(p.mapping)}" + (f"; warning: {warning}" if warning else ""),
                file=sys.stderr,
            )


def _draft_missing() -> str:
    """The refusal of a drafter that drafts with a model when no --draft names one, its drafters from SPECS."""
    with_model = [spec.name for spec in SPECS.values() if spec.needs_model]
    without = [spec.usage for spec in SPECS.values() if not spec.needs_model]
    alone = f", or use --drafter {_listed(without, 'or')} alone" if without else ""
    return (
        f"--draft is missing: the {_listed(with_model, 'and')} drafters draft with a model; pass --draft MODEL{alone}"
    )


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
