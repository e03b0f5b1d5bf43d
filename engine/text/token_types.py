"""Token types, exactly as SPEC.md orders them: the first rule that matches a token's text wins.

Byte-level tokenizers split a CJK character across several tokens, and a lone fragment decodes to U+FFFD;
`TokenTyper` therefore also looks at the raw bytes: a fragment that starts a 3-byte UTF-8 sequence in the
CJK ranges (lead bytes E3..E9, or EF for fullwidth punctuation) counts as `chinese`.

Context decides for letters (SPEC "Token types", turn 5): a Latin-letter token inside code is `code`, not `english`
(`class`, `list`, `self`). The context is one flag passed to the one rule table (`token_type(..., code=True)`);
`CodeContext` keeps it for one prompt's output as it grows: code throughout for a prompt from a code set
(`code_prompts`), else while a ``` fence is open in the prompt and the output so far.
"""

from __future__ import annotations

import re
from copy import copy
from functools import lru_cache

TOKEN_TYPES = ("special", "whitespace", "chinese", "number", "english", "punctuation", "code", "other")

_CJK = (
    "\u3000-\u303f"  # CJK symbols and punctuation (、。《》「」…)
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # ideographs
    "\uff00-\uffef"  # fullwidth forms (，！？：；（）)
    "\U00020000-\U0002fa1f"
)

# (type, predicate on the decoded text). `special` is decided by the tokenizer, before this table.
RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("whitespace", re.compile(r"[ \t\r\n\f\v]+")),
    ("chinese", re.compile(rf".*[{_CJK}]", re.S)),
    ("number", re.compile(r"\s*[+-]?(\d[\d.,]*|[.,]\d[\d.,]*)\s*")),
    ("english", re.compile(r" ?[A-Za-z]+")),
    ("punctuation", re.compile(r"\s*[,.!?;:'\"`‘’“”…–—]+\s*")),
    # Operators, brackets, `_`, identifiers with `_`/digits, and runs of them (`self.`, `():`) — ASCII only.
    ("code", re.compile(r"\s*(?:[A-Za-z0-9_]|[!-/:-@\[-`{-~])+\s*")),
)

_CJK_LEAD_BYTES = range(0xE3, 0xEA)


def token_type(text: str, *, special: bool = False, raw: bytes | None = None, code: bool = False) -> str:
    """The SPEC type of one token given its decoded text (and, for byte fragments, its raw bytes). `code`: the
    token sits inside code, where Latin letters are `code` (a keyword, a builtin, a name), not `english`."""
    if special:
        return "special"
    if raw is not None and "\ufffd" in text and _looks_cjk_fragment(raw):
        return "chinese"
    for name, pattern in RULES:
        if pattern.fullmatch(text):
            return "code" if code and name == "english" else name
    return "other"


CODE_SETS = ("code",)  # built-in prompt sets whose prompts and outputs are code
FENCE = "```"


def code_prompts(spec: str) -> frozenset[int]:
    """The indices of the prompts of a prompt spec (engine/text/prompt_sets.py) that come from a code set: all of
    `code:tune`, the first n of `code+english` (n = code:tune's size); none for a file or another set."""
    from engine.text.prompt_sets import load_prompts, union_parts

    parts = union_parts(spec)
    is_code = [part.strip().partition(":")[0] in CODE_SETS for part in parts]
    if not any(is_code):
        return frozenset()
    indices: set[int] = set()
    start = 0
    for part, code in zip(parts, is_code):
        size = len(load_prompts(part))
        indices.update(range(start, start + size) if code else ())
        start += size
    return frozenset(indices)


class CodeContext:
    """Whether the next token of one prompt's output sits inside code: throughout for a prompt from a code set,
    else while a ``` fence (three or more backticks) is open in the text so far (the prompt, then the output)."""

    def __init__(self, code_set: bool, prompt: str = ""):
        self.code_set = code_set
        self.fenced = False
        self._ticks = 0  # backticks ending the text so far
        self.see(prompt)

    @property
    def code(self) -> bool:
        return self.code_set or self.fenced

    def see(self, text: str) -> None:
        """The text grew by `text`."""
        for ch in text:
            self._ticks = self._ticks + 1 if ch == "`" else 0
            if self._ticks == len(FENCE):
                self.fenced = not self.fenced

    def copy(self) -> CodeContext:
        twin = CodeContext(self.code_set)
        twin.fenced, twin._ticks = self.fenced, self._ticks
        return twin


def _looks_cjk_fragment(raw: bytes) -> bool:
    lead = next((b for b in raw if b >= 0xC0), None)
    if lead is None:
        return False
    return lead in _CJK_LEAD_BYTES or (lead == 0xEF and (b"\xef\xbc" in raw or b"\xef\xbd" in raw))


class TokenTyper:
    """Text and type of token ids for one tokenizer, memoised per id and context (typing is on every draft token).
    `code_prompts`: the prompt indices from a code set (`code_prompts(spec)`), whose outputs are code."""

    def __init__(self, tokenizer, code_prompts: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.code_prompts = frozenset(code_prompts)
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._byte_decoder = _byte_decoder()
        self.describe = lru_cache(maxsize=None)(self._describe)

    def with_code_prompts(self, indices) -> TokenTyper:
        """This typer (its memo shared) for prompts whose `indices` come from a code set."""
        view = copy(self)
        view.code_prompts = frozenset(indices)
        return view

    def context(self, prompt_index: int, prompt: str) -> CodeContext:
        """The code context at the start of a prompt's output."""
        return CodeContext(prompt_index in self.code_prompts, prompt if isinstance(prompt, str) else "")

    def drafts(self, token_ids: list[int], context: CodeContext) -> list[tuple[str, str]]:
        """(text, type) of a round's drafted tokens, each in the context the drafts before it leave."""
        ahead, described = context.copy(), []
        for token_id in token_ids:
            described.append(self.describe(token_id, ahead.code))
            ahead.see(described[-1][0])
        return described

    def emitted(self, token_ids: list[int], context: CodeContext) -> None:
        """The output grew by these tokens: move the context past their text."""
        for token_id in token_ids:
            context.see(self.describe(token_id)[0])

    def _describe(self, token_id: int, code: bool = False) -> tuple[str, str]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        raw = None
        if "\ufffd" in text:
            piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
            if all(ch in self._byte_decoder for ch in piece):
                raw = bytes(self._byte_decoder[ch] for ch in piece)
        return text, token_type(text, special=token_id in self.special_ids, raw=raw, code=code)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}
