"""The shipped demo models: names that resolve to directories inside the package, no download."""

from __future__ import annotations

import os
from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
DEMO_TARGET = "demo-target"
# every shipped draft (demo-eagle3: an EAGLE-3 head, engine/models/eagle3.py; demo-draft-othervocab: a draft with its
# own tokenizer, drafting over the vocabulary it shares with demo-target, engine/models/vocab_bridge.py): the form's
# choices, --draft's help
DEMO_DRAFTS = ("demo-draft", "demo-draft-distilled", "demo-eagle3", "demo-draft-othervocab")
DEMO_MODELS = (DEMO_TARGET, *DEMO_DRAFTS)
RECIPE_KEYS = ("prompts", "steps", "lr", "batch_size", "samples", "max_new_tokens", "seed")


def model_help(role: str) -> str:
    """What a target or draft field accepts: the shipped names, an HF model id or a local directory."""
    names = DEMO_DRAFTS if role == "draft" else (DEMO_TARGET,)
    return f"{', '.join(names)}, an HF model id or a local directory"


def recipe(name: str = "demo-draft-distilled") -> dict:
    """The `draftlab distill` settings a shipped distilled draft was made with, read from its distill.json
    (prompts, steps, lr, batch_size, samples, max_new_tokens, seed): the Train page's defaults."""
    import json

    card = json.loads((ZOO_DIR / name / "distill.json").read_text())
    return {key: card[key] for key in RECIPE_KEYS}


def resolve(name: str) -> Path | None:
    """The shipped directory for a demo model name, or None if `name` is not one (or is not built yet)."""
    if name not in DEMO_MODELS:
        return None
    path = ZOO_DIR / name
    return path if (path / "config.json").exists() else None


def looks_like_path(name: str) -> bool:
    """A model name meant as a local folder, never an HF id (`org/name`): it starts with /, ./, ../ or ~, holds
    more than one /, or holds the system's own separator where that is not / (Windows' backslash)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def missing_folder(name: str) -> str | None:
    """The one line for a model name that looks like a local path (looks_like_path) with no folder there; None
    for a folder that exists, a demo name or an HF id. What the engine refuses to load and the New-experiment
    form says under the field as it is typed (the hub's "Repo id must be in the form …" is never the answer)."""
    if not name or name in DEMO_MODELS or not looks_like_path(name) or Path(name).expanduser().exists():
        return None
    return (
        f"model {name!r} not found: no such folder; give an existing local folder, an HF model id (org/name) "
        f"or {DEMO_TARGET}/{DEMO_DRAFTS[0]}"
    )
