"""The shipped demo models: names that resolve to directories inside the package, no download."""
from __future__ import annotations

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
DEMO_TARGET = "demo-target"
DEMO_DRAFTS = ("demo-draft", "demo-draft-distilled", "demo-eagle3")  # every shipped draft (demo-eagle3: an EAGLE-3
# head, engine/eagle3.py): the form's choices, --draft's help
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
