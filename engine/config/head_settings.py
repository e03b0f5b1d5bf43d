"""The settings of an EAGLE-3 head training (`draftlab train-head`, a training job of kind "head"), in plain Python
(no torch): their defaults and bounds, and the aux-layer list's parse. engine/training/head_training.py's HeadConfig,
the queue (storage/jobs/training.py) and the Train page's form (pages/train.py) read them here, so one input gets one
answer everywhere.

    parse_aux_layers("2,6,9") -> [2, 6, 9]; parse_aux_layers("auto") -> None (vLLM's default for the target)
"""

from __future__ import annotations

from engine.errors import DraftLabError
from engine.numbers import ascii_int

MAX_TTT_STEPS = 16  # draft positions a head may be trained for (the training-time test's chain length)
MAX_LAYER_ID = 9999  # an aux-layer id above any decoder's layer count (the target's own count is checked on load)
AUTO = "auto"  # aux layers: vLLM's default (2, L/2, L-3) for the target

# `draftlab train-head`'s defaults (app/commands/train_head.py; tests/test_training_heads.py checks they agree), the
# form's first values. draft_vocab_size 0: the whole target vocabulary, at most 32000 ids.
DEFAULTS = {
    "steps": 600,
    "lr": 1e-3,
    "ttt_steps": 4,
    "draft_vocab_size": 0,
    "aux_layers": AUTO,
    "max_new_tokens": 128,
    "batch_size": 8,
    "samples": 1,
    "seed": 0,
}


def parse_aux_layers(text: str | None, said: str = "--aux-layers") -> list[int] | None:
    """`auto` (or empty: None, vLLM's default for the target) or `i,j,l`, distinct layer ids in vLLM's convention
    (id i = the input of decoder layer i); a DraftLabError names the problem as `said` (the CLI's flag, a form's
    field)."""
    if text is None or str(text).strip().lower() in ("", AUTO):
        return None
    read = [ascii_int(part) for part in str(text).split(",")]
    ids = [i for i in read if i is not None]
    if len(ids) < len(read):
        raise DraftLabError(f"{said} {str(text)[:40]!r} is not a list of layer ids; use auto or e.g. 2,6,9")
    if len(set(ids)) != len(ids) or not all(0 <= i <= MAX_LAYER_ID for i in ids):
        raise DraftLabError(f"{said} {str(text)[:40]!r} must be distinct non-negative layer ids, e.g. 2,6,9")
    return ids


def aux_layers_text(ids: list[int] | None) -> str | None:
    """How a list of aux-layer ids is written (stored, shown, passed to --aux-layers): `2,6,9`; None for auto."""
    return None if ids is None else ",".join(map(str, ids))


def check_ttt_steps(value: object, said: str = "--ttt-steps") -> int:
    """The TTT step count S, 1 to MAX_TTT_STEPS (a DraftLabError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TTT_STEPS:
        raise DraftLabError(f"{said} must be 1 to {MAX_TTT_STEPS} (got {value!r}); use e.g. {DEFAULTS['ttt_steps']}")
    return value


def check_draft_vocab_size(value: object, said: str = "--draft-vocab-size") -> int:
    """The draft vocabulary size: a whole number >= 1, or 0 for the whole target vocabulary (at most 32000 ids)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DraftLabError(
            f"{said} must be a whole number >= 1, or 0 for the whole vocabulary (got {value!r}); use e.g. 32000"
        )
    return value
