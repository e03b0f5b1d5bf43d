"""The shipped demo models: names that resolve to directories inside the package, no download."""
from __future__ import annotations

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
DEMO_MODELS = ("demo-target", "demo-draft", "demo-draft-distilled")


def resolve(name: str) -> Path | None:
    """The shipped directory for a demo model name, or None if `name` is not one (or is not built yet)."""
    if name not in DEMO_MODELS:
        return None
    path = ZOO_DIR / name
    return path if (path / "config.json").exists() else None
