"""`draftlab validate`: an experiment's chosen configuration and its baseline rerun here on held-out prompts, as a
linked experiment (app/commands/in_process.py), with tune against validation in words."""

from __future__ import annotations

import json

from app.arguments import ID
from app.commands.common import database_errors_reported, fail, open_store_or_fail
from app.commands.in_process import run_here

NAME = "validate"


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="rerun an experiment's chosen configuration (the verdict's: the best, "
        "or the cheaper one tied with it) on held-out prompts",
    )
    p.add_argument("experiment_id", type=ID)
    p.add_argument(
        "--prompts",
        default=None,
        help="held-out prompts (default: the validation split of the experiment's built-in set)",
    )
    p.add_argument("--db", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    return database_errors_reported(_validate, args)


def _validate(args) -> int:
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
        prompt_set = load_prompts(plan["prompts"])
        draft = plan["draft"] or None
        from engine.config.drafter_specs import needs_draft_model

        pair = load_pair(
            plan["target"],
            draft if needs_draft_model(plan["drafter"]) else None,
            plan["device"],
            plan["dtype"],
            plan["trust_remote_code"],
        )
        prompts = render(prompt_set, pair.tokenizer, plan["chat_template"], what=plan["prompts"])
        encode_prompts(pair, prompts, plan["sampling"]["max_new_tokens"])
    except (ValidationError, DraftLabError) as exc:
        return fail(str(exc))
    args.repeats, args.name = plan["repeats"], plan["name"]
    return run_here(args, store, pair, {}, prompts, plan, 2, report=_validation_report)


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
