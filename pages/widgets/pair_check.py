"""The New-experiment page's pair check: tokenizers and configs only, never model weights (an EAGLE-3 head: its
config names the target it drafts for).

A tokenizer loads in well under a second (a 150k-entry vocabulary included) and `check_pair` is a dict
comparison, but the first call imports transformers (and with it torch: several seconds), so results are
cached per model name and per pair, and `warm_up()` does that import in the background when the dashboard
starts, so the first check on the New-experiment page takes milliseconds, not seconds.

A local directory's results are keyed on its files (names, sizes, mtimes): adding a config.json re-checks. An HF id
not in the local cache is looked up with a NETWORK_TIMEOUT-second probe first (at once with $HF_HUB_OFFLINE), so
an unreachable hub or an unknown id fails in seconds with the same message, never after transformers' long
retries; such failures are not cached (the next check tries again).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

NETWORK_TIMEOUT = 4.0  # seconds for the Hugging Face Hub probe of an uncached model id

_warming: threading.Thread | None = None


def warm_up() -> None:
    """Import transformers and the engine's loader in a daemon thread, once per process."""
    global _warming
    if _warming is None:

        def _import() -> None:
            import transformers  # noqa: F401

            import engine.models.loading  # noqa: F401

        _warming = threading.Thread(target=_import, name="draftlab-pair-check-warm-up", daemon=True)
        _warming.start()


def wait_warm() -> None:
    """Block until the warm-up finished, starting it if no page has yet: transformers' lazy imports are not safe
    from two threads at once, so every import of them goes through that one thread."""
    warm_up()
    assert _warming is not None, "warm_up started it"
    _warming.join()


@dataclass(frozen=True)
class PairCheck:
    ok: bool
    message: str  # what the user reads: the shared vocabulary, or the problem and the fix
    vocab_size: int | None = None
    # SPEC "Drafts with another vocabulary": "shared" (one tokenizer) or "intersection" (the draft's differs and
    # drafts over the tokens both share), and the share of the target's vocabulary the draft can propose.
    vocab: str | None = None
    vocab_coverage: float | None = None


def model_source(name: str) -> str:
    """Where a model name loads from: the shipped directory of a demo name, else the name (HF id or path)."""
    from engine import zoo
    from engine.errors import DraftLabError

    demo = zoo.resolve(name)
    if demo is not None:
        return str(demo)
    if name in zoo.DEMO_MODELS:
        raise DraftLabError(
            f"demo model {name!r} is not built in this install; train it with "
            f"`python -m engine.zoo.train --model {name}`"
        )
    if zoo.missing_folder(name):  # a path with no folder: never handed to the hub as a repo id
        raise DraftLabError(zoo.missing_folder(name))
    return name


def fingerprint(name: str) -> tuple:
    """What a cached check of `name` depends on: for a local directory (or a file path) its files' names, sizes
    and mtimes, so a config.json added, removed or rewritten re-checks; () for anything else (an HF id, a demo)."""
    path = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or os.sep in name and path.exists()
    if not looks_local and not path.exists():
        return ()
    try:
        if path.is_dir():
            entries = sorted(path.iterdir())
            return ("dir", *((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file()))
        stat = path.stat()
        return ("file", stat.st_size, stat.st_mtime_ns)
    except OSError:
        return ("missing",)


class _Unreachable(Exception):
    """The hub could not be asked in time (offline, or no network): a failure worth retrying, so never cached."""


def _offline() -> bool:
    return str(os.environ.get("HF_HUB_OFFLINE", "")).strip().lower() in ("1", "true", "yes", "on")


def _hub_reachable(repo_id: str) -> None:
    """For an HF id not in the local cache: ask the hub about it within NETWORK_TIMEOUT seconds, so an unreachable
    network fails fast (transformers would retry for much longer); an unknown id raises its own error here."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id: let transformers word the error
        return
    if isinstance(cached, str):
        return  # in the local cache: loads without the network
    if _offline():
        raise _Unreachable(f"{repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    import requests

    try:
        HfApi().model_info(repo_id, timeout=NETWORK_TIMEOUT)
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise _Unreachable(
            f"the Hugging Face Hub did not answer within {NETWORK_TIMEOUT:g} s ({type(exc).__name__})"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - 401/404 and the like: the id or the token is wrong
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise OSError(first) from exc


# What loading a tokenizer or a config can fail with because of the input (a path or id that is no model, a file it
# cannot parse, a tokenizer needing a package that is not installed) ...
INPUT_ERRORS = (OSError, ValueError, ImportError)
# ... and the libraries that read the files: whatever they raise (a KeyError for a malformed tokenizer.json, a
# validation error for a malformed config.json) is about the files given.
LOADERS = ("transformers", "tokenizers", "huggingface_hub", "safetensors")


def _about_the_input(exc: BaseException) -> bool:
    """Whether a loader failure is the user's input to fix (shown inline) rather than a bug (raised as it is): one
    of INPUT_ERRORS, or raised inside one of the LOADERS. A KeyError, TypeError, AttributeError ... raised by this
    project's own code is never reworded as "check the model id"."""
    if isinstance(exc, INPUT_ERRORS):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", "")) if tb is not None else ""
    return module.split(".")[0] in LOADERS


def _is_hub_id(name: str) -> bool:
    return not fingerprint(name) and name.count("/") == 1 and not name.startswith((".", "/", "~"))


@lru_cache(maxsize=32)
def _tokenizer_and_width(name: str, files: tuple = ()):
    """(tokenizer, output width) for a model name; the width is the config's vocab_size (no weights loaded).
    `files`: the name's fingerprint(), part of the cache key only."""
    wait_warm()
    from transformers import AutoConfig, AutoTokenizer

    source = model_source(name)
    if source == name and _is_hub_id(name):
        _hub_reachable(name)
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = AutoConfig.from_pretrained(source)
    width = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    return tokenizer, int(width) if width else len(tokenizer.get_vocab())


def prompt_vocab_warning(target: str, draft: str, prompts: list) -> str | None:
    """A draft with another vocabulary (SPEC "Drafts with another vocabulary"): the share of the prompts' tokens (the
    target's tokenization) outside the tokens both share, as `draftlab run` warns; None for one tokenizer, or when a
    tokenizer cannot be read (the pair check says why)."""
    try:
        mapping = _mapping(target, draft, fingerprint(target), fingerprint(draft))
    except Exception as exc:  # noqa: BLE001 - the input's failures are the pair check's to show (_about_the_input)
        if not _about_the_input(exc):
            raise
        return None
    if mapping is None:
        return None
    from engine.models.loading import prompt_warning

    tokenizer, _ = _tokenizer_and_width(target, fingerprint(target))
    texts = render_prompts(target, list(prompts))
    return prompt_warning(mapping, [tokenizer(t).input_ids for t in texts])


@lru_cache(maxsize=8)
def _mapping(target: str, draft: str, target_files: tuple, draft_files: tuple):
    """The pair's token-level intersection (None: one tokenizer); keyed on both names' files, as the check is."""
    from engine.models.loading import pair_vocabulary

    (t_tok, t_width), (d_tok, d_width) = (
        _tokenizer_and_width(target, target_files),
        _tokenizer_and_width(draft, draft_files),
    )
    return pair_vocabulary(t_tok, d_tok, t_width, d_width)[1]


def render_prompts(target: str, prompts: list, chat_template: str = "auto") -> list[str]:
    """An upload's prompts as the target will see them: conversations through `chat_template` (engine/text/chat.py:
    auto = its tokenizer's, none, or a template's text), plain prompts as they are. The tokenizer is the pair
    check's (cached), never weights."""
    from engine.text.chat import Chat, render

    if not any(isinstance(p, Chat) for p in prompts):
        return list(prompts)
    tokenizer, _ = _tokenizer_and_width(target, fingerprint(target))
    return render(prompts, tokenizer, chat_template, what="the uploaded prompts")


RESULTS_KEPT = 64  # pair checks remembered (least recently used dropped first)
_results: OrderedDict[tuple, PairCheck] = OrderedDict()
_results_lock = threading.Lock()


def _result_key(target: str, draft: str) -> tuple:
    target, draft = str(target).strip(), str(draft).strip()
    return target, draft, fingerprint(target) if target else (), fingerprint(draft) if draft else ()


def cached_check(target: str, draft: str) -> PairCheck | None:
    """The pair's check if one is remembered for the models as they are now (a local directory's files unchanged),
    else None: then check_pair_names has real work to do (loading tokenizers, maybe asking the hub), and the page
    says so while it runs instead of leaving the last result up."""
    key = _result_key(target, draft)
    with _results_lock:
        found = _results.get(key)
        if found is not None:
            _results.move_to_end(key)
        return found


def check_pair_names(target: str, draft: str) -> PairCheck:
    """Do `target` and `draft` share a tokenizer (same id for every token)? Cached per pair and per the content of
    a local directory (see fingerprint); a failure to reach the hub is not cached."""
    key = _result_key(target, draft)
    found = cached_check(target, draft)
    if found is not None:
        return found
    try:
        result = _check_pair(*key)
    except _Unreachable as exc:
        role, name = exc.args[1:3] if len(exc.args) >= 3 else ("model", "")
        return PairCheck(
            False,
            f"cannot load the {role} tokenizer {name!r} ({exc.args[0]}); check the HF model id "
            f"or local path, and your network/HF_TOKEN",
        )
    with _results_lock:
        _results[key] = result
        _results.move_to_end(key)
        while len(_results) > RESULTS_KEPT:
            _results.popitem(last=False)
    return result


def _check_pair(target: str, draft: str, target_files: tuple, draft_files: tuple) -> PairCheck:
    wait_warm()
    from engine.errors import DraftLabError
    from engine.models.loading import describe, pair_vocabulary

    if not target or not draft:
        return PairCheck(
            False, "give both a target and a draft model (demo-target, demo-draft, an HF id or a local path)"
        )
    from engine.config.head_format import is_head

    if is_head(draft):
        return _check_head(target, draft, target_files)
    loaded = {}
    for role, name, files in (("target", target, target_files), ("draft", draft, draft_files)):
        try:
            loaded[role] = _tokenizer_and_width(name, files)
        except DraftLabError as exc:
            return PairCheck(False, str(exc))
        except _Unreachable as exc:
            raise _Unreachable(str(exc), role, name) from exc  # not cached: the next check asks again
        except Exception as exc:  # noqa: BLE001 - the input's failures shown inline, a bug raised (_about_the_input)
            if not _about_the_input(exc):
                raise
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return PairCheck(
                False,
                f"cannot load the {role} tokenizer {name!r} ({first}); check the HF model id "
                f"or local path, and your network/HF_TOKEN",
            )
    (t_tok, t_width), (d_tok, d_width) = loaded["target"], loaded["draft"]
    try:
        vocab, mapping = pair_vocabulary(t_tok, d_tok, t_width, d_width)
    except DraftLabError as exc:
        return PairCheck(False, str(exc))
    if mapping is None:
        return PairCheck(True, f"tokenizers match: {vocab:,} shared token ids (vocab shared)", vocab, "shared", 1.0)
    return PairCheck(True, describe(mapping), vocab, "intersection", mapping.coverage)


def _check_head(target: str, draft: str, target_files: tuple) -> PairCheck:
    """An EAGLE-3 head as the draft (either layout, engine/config/head_format.py): checked against the target's config
    as the engine checks it when it loads the head (its verifier, aux layers, widths), no weights read."""
    from transformers import AutoConfig

    from engine.config.head_format import check_for_target, head_spec
    from engine.errors import DraftLabError

    try:
        _, width = _tokenizer_and_width(target, target_files)
        text = AutoConfig.from_pretrained(model_source(target)).get_text_config(decoder=True)
        spec = head_spec(draft)
        aux = check_for_target(
            spec, draft, [target, model_source(target)], text.num_hidden_layers, text.hidden_size, width
        )
    except DraftLabError as exc:
        return PairCheck(False, str(exc))
    except Exception as exc:  # noqa: BLE001 - the input's failures shown inline, a bug raised (_about_the_input)
        if not _about_the_input(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return PairCheck(False, f"cannot read the target {target!r} ({first}); check the HF model id or local path")
    return PairCheck(
        True,
        f"EAGLE-3 head ({spec.layout} layout) for this target, reading its hidden states "
        f"{list(aux)}: it drafts as eagle3",
        width,
    )
