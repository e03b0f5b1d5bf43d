"""Prompt sets: the built-in ones (`code`, `english`, `chinese`, `math`, `mixed`, each with `tune` and
`validation` splits, and `chat`: conversations) and user files (.jsonl / .csv / .txt / .parquet / .arrow).

    load_prompts("code")              # = code:tune
    load_prompts("chinese:validation")
    load_prompts("my_prompts.jsonl")  # objects with a "prompt" field, one per line
    load_prompts("my_prompts.csv")    # a "prompt" column
    load_prompts("my_prompts.txt")    # one prompt per line (blank lines skipped)
    load_prompts("code+english")      # several sets as one: code:tune's prompts, then english:tune's
    load_prompts("chats.jsonl")       # conversations: {"messages": [...]} or ShareGPT {"conversations": [...]}
    load_prompts("export.parquet")    # a dataset export (.parquet / .arrow / .feather): a prompt, messages or
                                      # conversations column
    set_name("code")                  # "code:tune": how sentences name a set (an upload by its own file name)

A conversation is returned as an engine.text.chat.Chat (cut after its last user turn); engine.text.chat.render turns it
into text with the target tokenizer's chat template where the models are loaded.

Every problem raises `DraftLabError` with one line naming the file, the line, the problem and the fix. A prompt is
text a tokenizer can take: no NUL character, no unpaired surrogate (not valid Unicode), not only whitespace, at
most limit("prompt_chars") characters; a file holds at most limit("prompts") prompts and limit("prompt_file_mb")
megabytes (engine/config/limits.py: $DRAFTLAB_LIMIT_...).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from pathlib import Path

from engine.config.limits import limit, over
from engine.errors import DraftLabError
from engine.text.chat import Chat, conversation, is_conversation

# One prompt: a text, or a conversation (engine.text.chat.render gives its text).
Prompt = str | Chat

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"
PROMPT_SETS: tuple[str, ...] = ("code", "english", "chinese", "math", "mixed")  # plain text
CHAT_SETS: tuple[str, ...] = ("chat",)  # conversations (OpenAI `messages`): rendered by the target's chat template
BUILTIN_SETS: tuple[str, ...] = PROMPT_SETS + CHAT_SETS
SPLITS: tuple[str, ...] = ("tune", "validation")
DEFAULT_SPLIT = "tune"
FILE_EXTENSIONS: tuple[str, ...] = (".jsonl", ".csv", ".txt", ".parquet", ".arrow", ".feather")
TABLE_EXTENSIONS: tuple[str, ...] = (".parquet", ".arrow", ".feather")
UNION = "+"  # code:tune+english:tune: several sets as one
EVERY_SET = UNION.join(PROMPT_SETS)  # every built-in set's tune split, one after another

PROMPT_SET_DESCRIPTIONS = {
    "code": "Python (with some JavaScript and SQL) code starts: a def line and docstring to continue",
    "english": "English prose openings, questions and instructions",
    "chinese": "Chinese prose and questions",
    "math": "arithmetic and algebra, dense in numbers and formulas",
    "mixed": "prompts that switch between languages and scripts (Chinese, English, code, others)",
    "chat": "conversations (system, user and assistant turns) for a chat model: rendered by its chat template",
}


def list_prompt_sets() -> list[str]:
    """Every built-in spec, `NAME:SPLIT`, in a stable order (for menus)."""
    return [f"{name}:{split}" for name in BUILTIN_SETS for split in SPLITS]


def builtin_path(name: str, split: str = DEFAULT_SPLIT) -> Path:
    return PROMPTS_DIR / name / f"{split}.jsonl"


def _valid_sets_hint() -> str:
    return ", ".join(BUILTIN_SETS) + " (optionally :" + " or :".join(SPLITS) + ")"


def _looks_like_path(spec: str) -> bool:
    return any(ch in spec for ch in "/\\") or Path(spec).suffix != "" or Path(spec).exists()


def union_parts(spec: str) -> list[str]:
    """The sets a union spec `A+B+...` joins (`code:tune+english:tune`, `code+english`); [spec] for one set, or
    for an existing file whose name holds a '+'."""
    spec = spec.strip()
    if UNION not in spec or Path(spec).exists():
        return [spec]
    return [part.strip() for part in spec.split(UNION)]


def load_prompts(spec: str) -> list[Prompt]:
    """The prompts of a built-in set (`NAME` or `NAME:SPLIT`), of a .jsonl / .csv / .txt file, or of several
    joined with '+' (`code:tune+english:tune`: the first set's prompts, then the next's)."""
    if not isinstance(spec, str) or not spec.strip():
        raise DraftLabError(f"empty prompt set name: give one of {_valid_sets_hint()} or a .jsonl/.csv/.txt file")
    parts = union_parts(spec)
    if len(parts) > 1:
        if not all(parts):
            raise DraftLabError(
                f"empty set in {spec.strip()!r}: join sets with single '+', e.g. code:tune+english:tune"
            )
        return [prompt for part in parts for prompt in load_prompts(part)]
    spec = spec.strip()
    name, sep, split = spec.partition(":")
    if name in BUILTIN_SETS:
        split = split if sep else DEFAULT_SPLIT
        if split not in SPLITS:
            raise DraftLabError(
                f"unknown split {split!r} of prompt set {name!r}: use one of "
                + ", ".join(f"{name}:{s}" for s in SPLITS)
            )
        return _load_file(builtin_path(name, split), display=f"{name}:{split}")
    if _looks_like_path(spec) and not (sep and name in BUILTIN_SETS):
        return load_prompt_file(spec)
    raise DraftLabError(
        f"unknown prompt set {spec!r}: use one of {_valid_sets_hint()}, or a path to a .jsonl/.csv/.txt file"
    )


def load_prompt_file(path: str | Path) -> list[Prompt]:
    p = Path(path)
    if p.suffix.lower() not in FILE_EXTENSIONS:
        raise DraftLabError(
            f"{p}: unknown prompt file extension {p.suffix or '(none)'!r}: use .jsonl (objects "
            f'with a "prompt" field or a conversation), .csv (a "prompt" column), .txt (one '
            f"prompt a line) or .parquet/.arrow (a prompt, messages or conversations column)"
        )
    if not p.exists():
        raise DraftLabError(f"{p}: no such prompt file: check the path, or use a built-in set: {_valid_sets_hint()}")
    if p.is_dir():
        raise DraftLabError(f"{p}: is a directory, not a prompt file: give a .jsonl/.csv/.txt file")
    return _load_file(p, display=str(p))


def check_prompt(text: str, where: str) -> str:
    """The prompt itself, or a DraftLabError naming `where` (e.g. "prompts.jsonl: line 3") and the fix."""
    if "\x00" in text:
        raise DraftLabError(f"{where}: the prompt holds a NUL character (\\x00): remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DraftLabError(
            f"{where}: the prompt holds an unpaired surrogate ({text[exc.start]!r} at character "
            f"{exc.start}), which is not valid Unicode: fix the text (an escaped \\ud800 alone "
            f"in JSON does this)"
        ) from None
    if not text.strip():
        raise DraftLabError(f"{where}: the prompt is only whitespace: give it text, or remove it")
    if len(text) > limit("prompt_chars"):
        raise DraftLabError(
            f"{where}: the prompt has {len(text)} characters, more than the limit of "
            f"{limit('prompt_chars')}: shorten it, or raise the limit with DRAFTLAB_LIMIT_PROMPT_CHARS"
        )
    return text


def _checked_chat(chat: Chat, where: str) -> Chat:
    """A conversation whose every turn's text, and all of them together, pass check_prompt."""
    for _, content in chat.messages:
        if content.strip():
            check_prompt(content, where)
    check_prompt(chat.plain(), where)
    return chat


def check_prompts(prompts: list[Prompt], display: str) -> list[Prompt]:
    """Every prompt checked (check_prompt; a conversation: every turn's text, and its turns together) and their
    count bounded by limit("prompts")."""
    if len(prompts) > limit("prompts"):
        raise DraftLabError(f"{display}: " + over("prompts", len(prompts), "the prompt set"))
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, Chat):
            _checked_chat(prompt, f"{display}: prompt {i + 1}")
        else:
            check_prompt(prompt, f"{display}: prompt {i + 1}")
    return prompts


def _check_size(path: Path, display: str) -> None:
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > limit("prompt_file_mb") * 1024 * 1024:
        raise DraftLabError(
            f"{display}: the prompt file has {size / 2**20:.1f} MB, more than the limit of "
            f"{limit('prompt_file_mb')} MB: split it, or raise the limit with "
            f"DRAFTLAB_LIMIT_PROMPT_FILE_MB"
        )


def _read_text(path: Path, display: str) -> str:
    _check_size(path, display)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DraftLabError(
            f"{display}: cannot read the prompt file ({exc.strerror or exc}): check its permissions"
        ) from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DraftLabError(
            f"{display}: line {line}: undecodable bytes ({data[exc.start : exc.start + 4]!r} at byte "
            f"{exc.start}): save the file as UTF-8"
        ) from exc
    if not text.strip():
        raise DraftLabError(f"{display}: the prompt file is empty: add at least one prompt")
    return text


def _load_file(path: Path, display: str) -> list[Prompt]:
    ext = path.suffix.lower()
    prompts: list[Prompt]
    if ext in TABLE_EXTENSIONS:
        prompts = _load_table(path, display)
        if not prompts:
            raise DraftLabError(f"{display}: the prompt file has no prompts: add at least one")
        return check_prompts(prompts, display)
    text = _read_text(path, display)
    if ext == ".jsonl":
        prompts = _parse_jsonl(text, display)
    elif ext == ".csv":
        prompts = list(_parse_csv(text, display))
    else:
        prompts = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if not prompts:
        raise DraftLabError(f"{display}: the prompt file has no prompts: add at least one")
    return check_prompts(prompts, display)


def _parse_jsonl(text: str, display: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DraftLabError(
                f"{display}: line {lineno}: invalid JSON ({exc.msg} at column {exc.colno}): "
                f'write one JSON object per line, e.g. {{"prompt": "..."}}'
            ) from exc
        except RecursionError:
            raise DraftLabError(
                f"{display}: line {lineno}: JSON nested too deeply to read: write one flat object "
                f'per line, e.g. {{"prompt": "..."}}'
            ) from None
        if not isinstance(obj, dict):
            raise DraftLabError(
                f"{display}: line {lineno}: expected a JSON object, got {type(obj).__name__}: "
                f'write one object per line, e.g. {{"prompt": "..."}}'
            )
        if "prompt" not in obj and is_conversation(obj):
            prompts.append(_checked_chat(conversation(obj, f"{display}: line {lineno}"), f"{display}: line {lineno}"))
            continue
        if "prompt" not in obj:
            keys = ", ".join(sorted(map(str, obj))) or "none"
            raise DraftLabError(
                f'{display}: line {lineno}: missing "prompt" field (fields: {keys}): '
                f'give every line a "prompt" string, "messages" or "conversations"'
            )
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise DraftLabError(
                f'{display}: line {lineno}: "prompt" must be a non-empty string, got {prompt!r:.40}: fix that line'
            )
        prompts.append(check_prompt(prompt, f"{display}: line {lineno}"))
    return prompts


def _parse_csv(text: str, display: str) -> list[str]:
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
    except csv.Error as exc:
        raise DraftLabError(
            f"{display}: line 1: malformed CSV header ({exc}): the first row must name the columns"
        ) from exc
    if "prompt" not in [h.strip() for h in header]:
        shown = ", ".join(repr(h)[1:-1] for h in header)[:200]  # escaped: a quoted header may hold a line break
        raise DraftLabError(
            f'{display}: line 1: missing "prompt" column (columns: {shown or "none"}): '
            f'name one column "prompt" in the header row'
        )
    key = next(h for h in header if h.strip() == "prompt")
    prompts = []
    try:
        for row in reader:
            value = row.get(key)
            if value is None:
                raise DraftLabError(
                    f'{display}: line {reader.line_num}: missing "prompt" value: give every row a prompt'
                )
            if value.strip():
                prompts.append(value)
    except csv.Error as exc:
        raise DraftLabError(
            f"{display}: line {reader.line_num}: malformed CSV ({exc}): quote fields that "
            f"contain commas, quotes or newlines"
        ) from exc
    return prompts


def _load_table(path: Path, display: str) -> list[Prompt]:
    """A dataset export (Parquet, Arrow IPC / Feather): a `prompt` column of text, or a `messages` /
    `conversations` column of turns (one conversation a row)."""
    _check_size(path, display)
    try:
        import pyarrow.feather as feather
        import pyarrow.parquet as parquet

        table = parquet.read_table(path) if path.suffix.lower() == ".parquet" else feather.read_table(path)
        frame = table.to_pandas()
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for truncated or foreign files
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise DraftLabError(
            f"{display}: cannot read it as {path.suffix.lower()[1:]} ({first}): export the dataset "
            f"again, or save it as .jsonl"
        ) from None
    if len(frame) > limit("prompts"):
        raise DraftLabError(f"{display}: " + over("prompts", len(frame), "the prompt set"))
    for column in ("prompt", "messages", "conversations"):
        if column in frame.columns:
            break
    else:
        raise DraftLabError(
            f'{display}: no "prompt", "messages" or "conversations" column (columns: '
            f"{', '.join(repr(str(c))[1:-1] for c in frame.columns)[:200] or 'none'}): name one of them so"
        )
    prompts: list[Prompt] = []
    for row, value in enumerate(frame[column], start=1):
        where = f"{display}: row {row}"
        if column == "prompt":
            if not isinstance(value, str):
                raise DraftLabError(f'{where}: "prompt" must be text, got {type(value).__name__}: fix that row')
            if value.strip():
                prompts.append(check_prompt(value, where))
        else:
            prompts.append(_checked_chat(conversation({column: value}, where), where))
    return prompts


def held_out_split(spec: str) -> tuple[str, str]:
    """(held-out prompt set, a note when it is not held out) of a training prompt spec: NAME / NAME:tune ->
    NAME:validation; NAME:validation or a file: the same prompts, and the note says so. A union maps each of its
    sets (code+english:tune -> code:validation+english:validation)."""
    parts = union_parts(spec)
    if len(parts) > 1:
        held = [held_out_split(part) for part in parts]
        note = next((n for _, n in held if n), "")
        return UNION.join(h for h, _ in held), note and " — part of it the same prompts as training: not all held out"
    name, sep, split = spec.strip().partition(":")
    if name in BUILTIN_SETS:
        if (split if sep else "tune") == "tune":
            return f"{name}:validation", ""
        return spec, " — the same prompts as training (--prompts named the validation split): not held out"
    return spec, " — the same file as training (a prompt file has no validation split): not held out"


# --- names -----------------------------------------------------------------------------------------------------

_UPLOAD_HASH = re.compile(r"^[0-9a-f]{12}-")  # upload_file_name's prefix: 12 hex digits of the content's sha256


def upload_dir() -> Path:
    """Where the dashboard keeps uploaded prompt files for the worker to read: $DRAFTLAB_UPLOAD_DIR, else
    ~/.cache/draftlab/uploads."""
    return Path(os.environ.get("DRAFTLAB_UPLOAD_DIR") or Path.home() / ".cache" / "draftlab" / "uploads").resolve()


def upload_file_name(name: str, data: bytes) -> str:
    """The content-addressed name an uploaded file is kept under in upload_dir(): `<12 hex>-<its name, made safe>`
    (the same file gets the same name)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name) or "prompts.txt"
    return f"{hashlib.sha256(data).hexdigest()[:12]}-{safe}"


def set_name(spec) -> str:
    """How a sentence or a table names a prompt spec: a built-in set with its split (`code` -> `code:tune`,
    `code:validation` as is), each set of a union, a file by its file name (an uploaded one by the name it was
    uploaded under: no cache directory, no content hash)."""
    text = str(spec or "").strip()
    parts = union_parts(text)
    if len(parts) > 1:
        return UNION.join(set_name(part) for part in parts)
    name, sep, split = text.partition(":")
    if name in PROMPT_SETS and (not sep or split in SPLITS):
        return f"{name}:{split if sep else DEFAULT_SPLIT}"
    if not _looks_like_path(text):
        return text
    path = Path(text)
    try:
        uploaded = path.parent.resolve() == upload_dir()
    except OSError:
        uploaded = False
    return _UPLOAD_HASH.sub("", path.name) if uploaded else path.name
