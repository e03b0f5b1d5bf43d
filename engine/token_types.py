"""Token types, exactly as SPEC.md orders them: the first rule that matches a token's text wins.

Byte-level tokenizers split a CJK character across several tokens, and a lone fragment decodes to U+FFFD;
`TokenTyper` therefore also looks at the raw bytes: a fragment that starts a 3-byte UTF-8 sequence in the
CJK ranges (lead bytes E3..E9, or EF for fullwidth punctuation) counts as `chinese`.
"""
from __future__ import annotations

import re
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


def token_type(text: str, *, special: bool = False, raw: bytes | None = None) -> str:
    """The SPEC type of one token given its decoded text (and, for byte fragments, its raw bytes)."""
    if special:
        return "special"
    if raw is not None and "\ufffd" in text and _looks_cjk_fragment(raw):
        return "chinese"
    for name, pattern in RULES:
        if pattern.fullmatch(text):
            return name
    return "other"


def _looks_cjk_fragment(raw: bytes) -> bool:
    lead = next((b for b in raw if b >= 0xC0), None)
    if lead is None:
        return False
    return lead in _CJK_LEAD_BYTES or (lead == 0xEF and (b"\xef\xbc" in raw or b"\xef\xbd" in raw))


class TokenTyper:
    """Text and type of token ids for one tokenizer, memoised per id (typing is on every draft token)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._byte_decoder = _byte_decoder()
        self.describe = lru_cache(maxsize=None)(self._describe)

    def _describe(self, token_id: int) -> tuple[str, str]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        raw = None
        if "\ufffd" in text:
            piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
            if all(ch in self._byte_decoder for ch in piece):
                raw = bytes(self._byte_decoder[ch] for ch in piece)
        return text, token_type(text, special=token_id in self.special_ids, raw=raw)


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
