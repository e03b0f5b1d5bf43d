"""SGLang's tab: `python -m sglang.launch_server` with the drafter's `--speculative-*` flags (a token tree's topk
and nodes, the sampled-draft flags where SGLang has them) and each request's sampling fields.

Checked: sgl-project/sglang python/sglang/srt/server_args.py @ 001067ff (`--speculative-algorithm` builtins EAGLE,
EAGLE3, NEXTN, STANDALONE, NGRAM, ...; `--speculative-draft-model-path`; `--speculative-num-steps`;
`--speculative-eagle-topk`; `--speculative-num-draft-tokens`; ngram: `--speculative-ngram-max-bfs-breadth`
(default 10), no match-window flags any more); its speculative handler: with topk == 1, num_draft_tokens is
forced to num_steps + 1 (the count includes the root, the last verified token; cpp_ngram/ngram.cpp passes
`suffix.back()` as the root for NGRAM too), `--speculative-use-rejection-sampling` raises NotImplementedError
for anything but EAGLE/EAGLE3; docs/advanced_features/speculative_decoding.md @ 067ad4d3 (STANDALONE = a
smaller draft LLM; NGRAM = a cache of earlier tokens); adaptive_speculative_decoding.md (`--speculative-adaptive`
is EAGLE with topk 1 only); sampling_params.py (top_k -1 = whole vocabulary); `--sampling-defaults` ("model":
defaults from the model's generation_config.json).
"""

from __future__ import annotations

from storage.serving.engines.common import (
    _command,
    _draft_for,
    _drafting,
    _length_note,
    _model_ref,
    _not_expressible,
    _openai_request,
    _same_distribution_note,
    _schedule_note,
    _with_prepare,
)
from storage.serving.tree_settings import sglang_tree
from storage.serving.verify_settings import no_block_note
from storage.serving.vocab_settings import no_intersection_note


def _sglang(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "sglang")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    groups = [
        ["python", "-m", "sglang.launch_server"],
        ["--model-path", _model_ref(cfg["target"])],
        ["--speculative-algorithm", serving.how],
    ]
    prepare: str | None = None
    notes: list[str] = []
    if drafter.needs_model:
        draft, prepare, notes = _draft_for(cfg, serving)
        groups.append(["--speculative-draft-model-path", draft])
    shaped, tree_notes = sglang_tree(cfg, serving.settings(param, cfg["k"]))  # a token tree's topk and nodes
    groups += [[flag, str(value)] for flag, value in shaped]
    notes = serving.texts(param, cfg["k"]) + tree_notes + notes
    if drafter.needs_model and not cfg["greedy"] and serving.sampled is not None:
        flags, sampled_notes = serving.sampled(cfg["draft_sampling"])
        groups += [[flag] if value is None else [flag, str(value)] for flag, value in flags]
        notes += list(sampled_notes)
    elif drafter.needs_model and not cfg["greedy"]:
        notes.append(
            f"At temperature > 0 {serving.how} drafts the draft's argmax and verifies target-only "
            "(--speculative-use-rejection-sampling is EAGLE/EAGLE3 only): lossless, but its acceptance "
            "rate differs from DraftLab's measured alpha."
        )
    if cfg["dtype"] != "auto":
        groups.append(["--dtype", cfg["dtype"]])
    if cfg["trust_remote_code"]:
        groups.append(["--trust-remote-code"])
    command, snippet = _command(groups)
    notes.append(
        "Send the sampling settings with every request (`request`); by default (--sampling-defaults "
        "model) SGLang fills missing ones from the model's generation_config.json."
    )
    notes += _length_note(cfg, "Send max_tokens with each request")
    notes += _same_distribution_note(cfg)
    notes += _schedule_note(cfg, "SGLang (--speculative-adaptive moves k on the accept length, not the batch size)")
    notes += no_block_note(cfg, "sglang")
    notes += no_intersection_note(cfg, "sglang")
    return _with_prepare(
        {
            "language": "bash",
            "command": command,
            "snippet": snippet,
            "request": _openai_request(cfg, top_k_off=-1),
            "notes": notes,
        },
        prepare,
    )
