"""`draftlab check-head DIR --target T [--prompts SET]`: which conventions an EAGLE-3 head was trained with,
measured in the lab without a server (engine/models/head_check.py): its first-draft greedy acceptance with its aux-layer
ids as configured, one higher and one lower, and with norm_before_fc flipped; a variant clearly better says what
to change in its config.json before serving it (a SpecForge head's ids are one lower than vLLM's)."""

from __future__ import annotations

import json
import sys

from app.arguments import whole
from app.commands.common import fail
from engine.errors import DraftLabError

NAME = "check-head"
DEFAULT_PROMPTS = "code:validation"
DEFAULT_LIMIT = 16
_tokens = whole(2, 1024, what="a number of new tokens", fix="; e.g. --max-new-tokens 32")
_limit = whole(2, 10_000, what="a number of prompts", fix="; e.g. --limit 16")


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="which aux-layer convention and norm an EAGLE-3 head was trained with (no server)",
        description="Continue the prompts greedily with the target, then measure the head's first-draft greedy "
        "acceptance with its aux-layer ids as configured, each id +1 (a head trained in SGLang's "
        "convention, as SpecForge writes them), each id -1, and with norm_before_fc flipped. A variant "
        "clearly better (by 0.05 or more, its interval over prompts above 0) says what to change in "
        "config.json before vLLM serves the head.",
    )
    p.add_argument("head", metavar="DIR", help="the head's speculators-format directory")
    p.add_argument("--target", required=True, help="the head's target model (its verifier)")
    p.add_argument("--prompts", default=DEFAULT_PROMPTS, help=f"a prompt set or file (default {DEFAULT_PROMPTS})")
    p.add_argument(
        "--limit", type=_limit, default=DEFAULT_LIMIT, help=f"the first N prompts of the set (default {DEFAULT_LIMIT})"
    )
    p.add_argument("--max-new-tokens", type=_tokens, default=32, help="greedy tokens per prompt (default 32)")
    p.add_argument("--chat-template", default="auto", help="how conversation prompts become text (as `run`'s)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    """No database: bad input (a DraftLabError) is one `error:` line, exit 2."""
    try:
        return _check(args)
    except DraftLabError as exc:
        return fail(str(exc))


def _check(args) -> int:
    """Load the target, check the head, print a table and the verdict (`--json`: engine/head_check's dict)."""
    from engine.models import eagle3
    from engine.models.head_check import convention_check
    from engine.models.loading import load_pair
    from engine.text.chat import render, resolve_option
    from engine.text.prompt_sets import load_prompts

    if not eagle3.is_head(args.head):
        raise DraftLabError(
            f"{args.head!r} is not an EAGLE-3 head directory (no config.json with "
            f'speculators_model_type "eagle3"); point DIR at a speculators-format head'
        )
    eagle3.check_weights(args.head)  # a truncated copy is named before the target loads
    prompts = load_prompts(args.prompts)[: args.limit]
    pair = load_pair(args.target, None, device=args.device, dtype="float32")
    texts = render(prompts, pair.target.tokenizer, resolve_option(args.chat_template))
    result = convention_check(
        args.head,
        pair.target.model,
        pair.target.tokenizer,
        [pair.target.name, pair.target.source, pair.target.model.config.name_or_path],
        texts,
        max_new_tokens=args.max_new_tokens,
        device=pair.device,
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['head']}: first-draft greedy acceptance over {result['positions']} positions of "
        f"{result['prompts']} prompts"
    )
    for row in result["variants"]:
        mark = "  <- clearly better" if row["clearly_better"] else ""
        print(
            f"  {row['name']:<42} ids {row['aux_layers']!s:<14} norm_before_fc {str(row['norm_before_fc']):<5} "
            f"{row['acceptance']:.3f}  ({row['gain']:+.3f}, {row['gain_lo']:+.3f} to {row['gain_hi']:+.3f}){mark}"
        )
    print(result["verdict"], file=sys.stdout)
    return 0
