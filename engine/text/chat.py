"""Conversations as teams have them, turned into the text the models see.

A prompt file line (or a Parquet/Arrow row) may hold a conversation instead of a `prompt` string:

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}, ...]}   OpenAI style
    {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}      ShareGPT

One conversation is one prompt: its turns up to and including its LAST user turn (later assistant turns are the
reply the models are asked to write, so they are dropped); earlier turns, system messages included, stay as the
context the chat template lays out. The text the models see is

    --chat-template auto   the target tokenizer's own template, apply_chat_template(add_generation_prompt=True)
                           (a tokenizer without one is refused: pass a FILE or `none`)
    --chat-template FILE   that Jinja template instead of the tokenizer's
    --chat-template none   no template: the turns' texts joined by blank lines (one user turn: its text alone)

Plain `prompt` strings are never templated. Rendering happens where the target tokenizer is loaded (the worker,
`draftlab run`, `draftlab distill`), and the rendered text is what is stored and shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import DraftLabError

AUTO, NONE = "auto", "none"
ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "tool": "tool",
}
MAX_TEMPLATE_BYTES = 1_000_000


@dataclass(frozen=True)
class Chat:
    """A conversation cut after its last user turn: ((role, content), ...)."""

    messages: tuple[tuple[str, str], ...]

    def as_dicts(self) -> list[dict]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def plain(self) -> str:
        return "\n\n".join(content for _, content in self.messages)


def is_conversation(obj) -> bool:
    return isinstance(obj, dict) and ("messages" in obj or "conversations" in obj)


def _content(value, where: str) -> str:
    """A message's text: a string, or OpenAI's list of parts of which only text parts are allowed."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(p, dict) for p in value):
        texts = []
        for part in value:
            if part.get("type", "text") != "text" or not isinstance(part.get("text"), str):
                raise DraftLabError(
                    f"{where}: a message part of type {str(part.get('type'))[:20]!r} is not text: "
                    f"DraftLab's models read text only; drop that part"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise DraftLabError(f"{where}: a message's content must be text, got {type(value).__name__}: fix that message")


def conversation(obj: dict, where: str) -> Chat:
    """The Chat of one record with `messages` (role/content) or `conversations` (from/value)."""
    sharegpt = "messages" not in obj
    turns = obj["conversations"] if sharegpt else obj["messages"]
    if hasattr(turns, "tolist"):  # a Parquet/Arrow cell arrives as a numpy array
        turns = turns.tolist()
    if not isinstance(turns, (list, tuple)) or not turns:
        raise DraftLabError(
            f'{where}: "{"conversations" if sharegpt else "messages"}" must be a non-empty list of '
            f"turns: fix that record"
        )
    role_key, text_key = ("from", "value") if sharegpt else ("role", "content")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise DraftLabError(
                f'{where}: every turn needs "{role_key}" and "{text_key}" (got {str(turn)[:60]}): fix that record'
            )
        role = ROLES.get(str(turn[role_key]).strip().lower())
        if role is None:
            raise DraftLabError(
                f"{where}: unknown role {str(turn[role_key])[:30]!r}: use system, user (human) or assistant (gpt)"
            )
        messages.append((role, _content(turn[text_key], where)))
    last_user = max((i for i, (role, _) in enumerate(messages) if role == "user"), default=None)
    if last_user is None:
        raise DraftLabError(f"{where}: the conversation has no user turn, so there is nothing to answer: add one")
    return Chat(tuple(messages[: last_user + 1]))


def resolve_option(option: str) -> str:
    """A --chat-template value as stored and rendered with: auto, none, or the Jinja text of the FILE it names
    (the text, so a worker on another machine renders the same). Refused: a missing, unreadable or huge file."""
    if option in (AUTO, NONE):
        return option
    path = Path(option)
    if not path.is_file():
        raise DraftLabError(
            f"--chat-template {option[:200]}: no such file; give auto (the target tokenizer's "
            f"template), none, or a Jinja template file"
        )
    if path.stat().st_size > MAX_TEMPLATE_BYTES:
        raise DraftLabError(f"--chat-template {option}: larger than 1 MB, not a chat template")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DraftLabError(f"--chat-template {option}: cannot read it as UTF-8 text ({exc})") from None
    if not text.strip() or text.strip() in (AUTO, NONE):
        raise DraftLabError(f"--chat-template {option}: the file holds no template")
    return text


def render(prompts: list, tokenizer, option: str = AUTO, what: str = "the prompts") -> list[str]:
    """The text of every prompt as the models will see it: strings as they are, conversations through the
    template `option` names: auto, none, or a template's Jinja text (resolve_option turns a FILE into that)."""
    chats = [p for p in prompts if isinstance(p, Chat)]
    if not chats:
        return list(prompts)
    template = None if option in (AUTO, NONE) else option
    if option == AUTO and not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or "the target"
        raise DraftLabError(
            f"{what} are conversations but {name}'s tokenizer has no chat template: pass "
            f"--chat-template FILE (a Jinja template) or --chat-template none (plain turns)"
        )
    out = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, Chat):
            out.append(prompt)
        elif option == NONE:
            out.append(prompt.plain())
        else:
            try:
                out.append(
                    tokenizer.apply_chat_template(
                        prompt.as_dicts(), tokenize=False, add_generation_prompt=True, chat_template=template
                    )
                )
            except Exception as exc:  # noqa: BLE001 - jinja2 errors (TemplateError, raise_exception) and others
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
                raise DraftLabError(
                    f"{what}: prompt {i + 1}: the chat template failed ({first}): fix the "
                    f"conversation or pass another --chat-template"
                ) from None
    return out
