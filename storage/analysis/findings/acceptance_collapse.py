"""A confirmed configuration whose server acceptance collapsed against the lab's (storage/analysis/collapse.py),
one of the `confirm` rule's findings (confirm.py calls it per measurement).

It fires (a warning) for a constant-k configuration whose server acceptance, at its interval's upper bound, is
under half the lab run's lower bound on the same prompts. For an EAGLE-3 head it names the head and what to check
(HEAD_CHECKS); for any other drafter, that the server drafts with something else than the lab measured."""

from __future__ import annotations

from typing import Any

from storage.analysis.collapse import collapse
from storage.analysis.findings.base import _Context, _finding
from storage.records.confirms import measurement_config

# What to check when a served EAGLE-3 head accepts far less than in the lab, each from vLLM 0.32's and SGLang's
# source (engine/models/eagle3.py's docstring has the file:line of each).
HEAD_CHECKS = (
    (
        "aux_layer_ids",
        "the aux-layer ids: vLLM (and DraftLab) read eagle_aux_hidden_state_layer_ids as the INPUT of "
        "decoder layer i (transformers' hidden_states[i]); SGLang and SpecForge write the OUTPUT of "
        "layer i, one lower, and vLLM reads an SGLang-layout eagle_config's ids unshifted too, so a "
        "head trained there reads one layer too early here unless each id is raised by 1 (`draftlab "
        "convert-head --to speculators` does; `draftlab check-head {head} --target {target}` measures "
        "which ids fit)",
    ),
    (
        "norm_before_fc",
        "norm_before_fc: vLLM applies the head's input_norm when config.json sets it and drops that "
        "weight when it does not; SGLang never applies it. The flag must say how the head was trained",
    ),
    (
        "d2t",
        "the draft vocabulary mapping: a draft id d proposes target id d + d2t[d]; a head drafting over the whole "
        "vocabulary has no d2t in vLLM (its lm_head rows must be in target-id order), and a d2t built for "
        "another tokenizer or vocabulary proposes the wrong ids",
    ),
    (
        "chat_template",
        "the chat template: the head learned from text rendered with the target's chat template; the "
        "server tokenizes the lab's rendered prompts with the target's tokenizer (check BOS and the "
        "template match what the head was trained on)",
    ),
)


def _collapse(ctx: _Context, r: Any, where: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Rule (storage/analysis/collapse.py): a confirmed constant-k configuration whose server acceptance collapsed
    against its lab run's (the server's upper bound under half the lab's lower bound, on the same prompts). For an
    EAGLE-3 head the finding names the head directory and what to check (HEAD_CHECKS); for any other drafter, that the
    server drafts with something else than the lab measured."""
    if r.series_id is None or r.series_id != r.series_id or r.run_id is None or r.run_id != r.run_id:
        return []
    config = measurement_config(ctx.store, int(r.measurement_id))
    if config.get("num_speculative_tokens_per_batch_size"):
        return []  # a schedule's k varies with the batch: its rate is not one k's
    result = collapse(ctx.store, int(r.series_id), int(r.run_id))
    if result is None or not result["collapsed"]:
        return []
    figures = (
        f"The server accepts {result['server']:.3f} of its draft tokens (at most {result['server_hi']:.3f} "
        f"over {result['drafts']} drafts), the lab {result['lab']:.3f} ({result['lab_lo']:.3f}–"
        f"{result['lab_hi']:.3f} over {result['prompts']} prompts, run {result['run_id']})"
    )
    facts = {**data, **result, "method": config.get("method"), "head": None, "checks": []}
    if config.get("method") == "eagle3":
        head = str(config.get("model") or "")
        target = ctx.experiment.get("target") or "TARGET"
        facts.update(head=head, checks=[key for key, _ in HEAD_CHECKS])
        return [
            _finding(
                "confirm",
                "warning",
                f"In vLLM, the EAGLE-3 head of {where} collapses",
                f"{figures}: under half the lab's even at the intervals' edges, on the same prompts, so the server "
                f"reads the head {head} differently from the lab.",
                "confirm",
                "Check, in order: "
                + "; ".join(
                    f"({i}) {check.format(head=head, target=target)}" for i, (_, check) in enumerate(HEAD_CHECKS, 1)
                )
                + ".",
                None,
                facts,
            )
        ]
    return [
        _finding(
            "confirm",
            "warning",
            f"In vLLM, {where} collapses",
            f"{figures}: under half the lab's even at the intervals' edges, on the same prompts.",
            "confirm",
            "Check that the server drafts with what the lab measured: the speculative config's model, its dtype and "
            "tokenizer, and the prompts' rendering.",
            None,
            facts,
        )
    ]
