"""The New-experiment page's pair check: tokenizers and configs only, never model weights.

A tokenizer loads in well under a second (a 150k-entry vocabulary included) and `check_pair` is a dict
comparison, but the first call imports transformers (and with it torch: several seconds), so results are
cached per model name and per pair, and `warm_up()` does that import in the background when the dashboard
starts, so the first check on the New-experiment page takes milliseconds, not seconds.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache

_warming: threading.Thread | None = None


def warm_up() -> None:
    """Import transformers and the engine's loader in a daemon thread, once per process."""
    global _warming
    if _warming is None:
        def _import() -> None:
            import transformers  # noqa: F401

            import engine.loading  # noqa: F401

        _warming = threading.Thread(target=_import, name="draftlab-pair-check-warm-up", daemon=True)
        _warming.start()


def wait_warm() -> None:
    """Block until a started warm-up finished: transformers' lazy imports are not safe from two threads at once."""
    if _warming is not None:
        _warming.join()


@dataclass(frozen=True)
class PairCheck:
    ok: bool
    message: str  # what the user reads: the shared vocabulary, or the problem and the fix
    vocab_size: int | None = None


def model_source(name: str) -> str:
    """Where a model name loads from: the shipped directory of a demo name, else the name (HF id or path)."""
    from engine import zoo

    demo = zoo.resolve(name)
    if demo is not None:
        return str(demo)
    if name in zoo.DEMO_MODELS:
        from engine.errors import DraftLabError

        raise DraftLabError(f"demo model {name!r} is not built in this install; train it with "
                            f"`python -m engine.zoo.train --model {name}`")
    return name


@lru_cache(maxsize=32)
def _tokenizer_and_width(name: str):
    """(tokenizer, output width) for a model name; the width is the config's vocab_size (no weights loaded)."""
    wait_warm()
    from transformers import AutoConfig, AutoTokenizer

    source = model_source(name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)
    width = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    return tokenizer, int(width) if width else len(tokenizer.get_vocab())


@lru_cache(maxsize=64)
def check_pair_names(target: str, draft: str) -> PairCheck:
    """Do `target` and `draft` share a tokenizer (same id for every token)? Cached per pair."""
    wait_warm()
    from engine.errors import DraftLabError
    from engine.loading import check_pair

    target, draft = target.strip(), draft.strip()
    if not target or not draft:
        return PairCheck(False, "give both a target and a draft model (demo-target, demo-draft, an HF id or a local path)")
    loaded = {}
    for role, name in (("target", target), ("draft", draft)):
        try:
            loaded[role] = _tokenizer_and_width(name)
        except DraftLabError as exc:
            return PairCheck(False, str(exc))
        except Exception as exc:  # noqa: BLE001 - any loader failure is the user's input to fix, shown inline
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return PairCheck(False, f"cannot load the {role} tokenizer {name!r} ({first}); check the HF model id "
                                    f"or local path, and your network/HF_TOKEN")
    (t_tok, t_width), (d_tok, d_width) = loaded["target"], loaded["draft"]
    try:
        vocab = check_pair(t_tok, d_tok, t_width, d_width)
    except DraftLabError as exc:
        return PairCheck(False, str(exc))
    return PairCheck(True, f"tokenizers match: {vocab:,} shared token ids", vocab)
