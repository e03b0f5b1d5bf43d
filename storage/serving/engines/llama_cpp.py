"""llama.cpp's tab: `llama-server` on the GGUF files of the target and the draft (`-m`, `-md`, with the
conversion to write them), the drafter's flags, and the sampling flags set explicitly, since llama.cpp's defaults
would change the distribution DraftLab measured.

Checked: ggml-org/llama.cpp common/arg.cpp (the index holds several revisions; these flags read the same in each:
`-md, --model-draft FNAME`; `--draft-max, --draft, --draft-n N`;
`--draft-min, --draft-n-min N`; `--draft-p-min P` "minimum speculative decoding probability (greedy)", all for
llama-server; `--temp`, `--top-k` (0 = disabled), `--top-p` (1.0 = disabled), `--min-p` (0.0 = disabled)),
common/common.h defaults n_max 16, n_min 0, p_min 0.75 (common/speculative.cpp stops a draft when the top
candidate's probability < p_min, dropping that token), sampling defaults top_k 40, top_p 0.95, min_p 0.05;
docs/speculative.md @ 067318e6 (`--spec-type ngram-simple`: the m tokens after the last match of the current
n-gram; `--spec-ngram-size-n N`, `--spec-ngram-size-m M`).
"""

from __future__ import annotations

from pathlib import Path

from storage.serving.engines.common import (
    _command,
    _drafting,
    _model_ref,
    _not_expressible,
    _same_distribution_note,
    _schedule_note,
)
from storage.serving.tree_settings import no_tree_note
from storage.serving.verify_settings import no_block_note
from storage.serving.vocab_settings import no_intersection_note


def _num(value: float) -> str:
    """A float as a flag value: shortest exact text (0.7, 1.0, 0.95)."""
    return repr(float(value))


def _gguf(name: str) -> str:
    return f"{Path(str(name).rstrip('/')).name}.gguf"


def _llama_cpp(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "llama_cpp")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    groups = [["llama-server"], ["-m", _gguf(cfg["target"])]]
    convert = [cfg["target"]]
    if drafter.needs_model:
        convert.append(cfg["draft"])
        groups.append(["-md", _gguf(cfg["draft"])])
    groups += [
        [flag, _num(value) if isinstance(value, float) else str(value)]
        for flag, value in serving.settings(param, cfg["k"])
    ]
    notes = serving.texts(param, cfg["k"])
    if drafter.needs_model:
        notes.append(
            "llama.cpp drafts the draft's most likely tokens and accepts those the target's own sample "
            "matches: lossless, but at temperature > 0 the acceptance rate differs from DraftLab's alpha."
            if not cfg["greedy"]
            else "Greedy: llama.cpp accepts drafts that equal the target's argmax, as DraftLab does."
        )
    if cfg["greedy"]:
        groups.append(["--temp", "0.0"])
    else:
        groups += [
            ["--temp", _num(cfg["temperature"])],
            ["--top-k", str(max(cfg["top_k"], 0))],
            ["--top-p", _num(cfg["top_p"])],
            ["--min-p", "0.0"],
            ["--repeat-penalty", "1.0"],
            ["--seed", str(cfg["seed"])],
        ]
        notes.append(
            "Sampling flags are set explicitly: llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05) "
            "would change the distribution DraftLab measured."
        )
    command, snippet = _command(groups)
    notes.append(
        "llama.cpp loads GGUF files: convert each model with llama.cpp's convert_hf_to_gguf.py ("
        + "; ".join(f"{_model_ref(m)} -> {_gguf(m)}" for m in convert)
        + "). Quantizing the draft or the target changes alpha and c: re-measure before relying on the "
        "speedup."
    )
    notes += _same_distribution_note(cfg)
    notes += _schedule_note(cfg, "llama.cpp")
    notes += no_tree_note(cfg, "llama_cpp")
    notes += no_block_note(cfg, "llama_cpp")
    notes += no_intersection_note(cfg, "llama_cpp")
    return {"language": "bash", "command": command, "snippet": snippet, "notes": notes}
