"""The one check that a model directory's weight files can be read: a file safetensors (or torch.load) cannot open
(garbage, a truncated copy or download) is named in one line with the fix, for a causal LM (engine/models/loading.py
load_model) and an EAGLE-3 head alike (engine/models/eagle3.py: `run --draft HEAD`, `check-head`, `convert-head`).

    state = read_weights(folder, "EAGLE-3 head 'heads/h'", fix)   # every *.safetensors (else *.bin), merged
    check_readable(folder, "EAGLE-3 head 'heads/h'", fix)         # its headers only: before loading anything else
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.errors import DraftLabError


def first_unreadable(folder) -> tuple[Path, Exception] | None:
    """The first *.safetensors file of directory `folder` whose header does not read, with the reader's error
    (safetensors checks that the header covers the whole file, so a truncated copy fails here without reading its
    tensors), else None."""
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as exc:  # noqa: BLE001 - SafetensorError, OSError: this is the file that does not read
            return path, exc
    return None


def check_readable(folder, what: str, fix: str) -> None:
    """Raise `corrupt`'s DraftLabError when one of `folder`'s safetensors files does not read (first_unreadable)."""
    bad = first_unreadable(folder)
    if bad is not None:
        raise corrupt(what, bad[0], bad[1], fix)


def corrupt(what: str, file: Path | None, exc: BaseException, fix: str) -> DraftLabError:
    """The one line for a weights file that does not read: `what` (e.g. "model 'x'") names the model, `file` the
    file when known, `exc` the reader's first line, `fix` what to do."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    where = f"its weights file {file}" if file is not None else "a weights file"
    return DraftLabError(f"cannot load {what}: {where} is corrupt or truncated ({first}); {fix}")


def read_weights(folder, what: str, fix: str) -> dict[str, torch.Tensor]:
    """Every tensor of directory `folder`'s *.safetensors files (else its *.bin files), on the CPU; a file that does
    not read is a DraftLabError naming it (`corrupt`). An empty dict when it holds neither."""
    from safetensors.torch import load_file

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    load = (
        (lambda f: load_file(str(f)))
        if files
        else (lambda f: torch.load(str(f), map_location="cpu", weights_only=True))
    )
    state: dict[str, torch.Tensor] = {}
    for file in files or sorted(folder.glob("*.bin")):
        try:
            state.update(load(file))
        except Exception as exc:  # noqa: BLE001 - SafetensorError, EOFError, UnpicklingError, RuntimeError (zip)
            raise corrupt(what, file, exc, fix) from exc
    return state
