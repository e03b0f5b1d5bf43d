"""One rule table, SPEC order, first match wins: a test per type with real examples."""
import pytest
from transformers import AutoTokenizer

from engine import zoo
from engine.token_types import TOKEN_TYPES, TokenTyper, token_type

EXAMPLES = {
    "whitespace": [" ", "    ", "\n", "\n        ", "\t\t", "\r\n"],
    "chinese": ["中", "推理", "，", "。", "、", " 模型", "《", "（", "加速比"],
    "number": ["0", "42", " 3.14", "1,000", "-7", "+2", " 256 ", ".5"],
    "english": ["the", " The", " model", "Hello", "a"],
    "punctuation": [",", ".", "!", "?", ";", ":", "'", '"', "...", "—", ", ", ".\n", "“"],
    "code": ["_", "__init__", "self_", "x1", " foo_bar", "==", "+=", "->", "(", ")", "[", "]", "{", "}",
             "():", " {", "#", "/", "*", "**", "<=", "&&", "=", " return_value"],
    "other": ["é", "α", "🙂", "naïve"],
}


@pytest.mark.parametrize("kind", [k for k in TOKEN_TYPES if k != "special"])
def test_each_type_with_real_examples(kind):
    for text in EXAMPLES[kind]:
        assert token_type(text) == kind, text


def test_special_wins_over_everything():
    assert token_type("<|endoftext|>", special=True) == "special"
    assert token_type(" ", special=True) == "special"


def test_rule_order_first_match_wins():
    assert token_type("  \n") == "whitespace"  # not punctuation/code
    assert token_type("3中") == "chinese"  # chinese before number
    assert token_type("12") == "number"  # number before code
    assert token_type("abc") == "english"  # english before code identifiers
    assert token_type("abc_1") == "code"


def test_byte_fragments_of_chinese_characters_count_as_chinese():
    # "中" is E4 B8 AD: a byte-level token holding only its lead bytes decodes to U+FFFD.
    assert token_type("\ufffd", raw=b"\xe4\xb8") == "chinese"
    assert token_type("\ufffd", raw=b"\xef\xbc") == "chinese"  # fullwidth punctuation lead
    assert token_type("\ufffd", raw=b"\xf0\x9f") == "other"  # an emoji fragment


@pytest.mark.skipif(zoo.resolve("demo-draft") is None, reason="demo pair not built in this checkout")
def test_typer_on_the_shipped_byte_level_tokenizer():
    tok = AutoTokenizer.from_pretrained(zoo.resolve("demo-draft"))
    typer = TokenTyper(tok)
    types = {typer.describe(i)[1] for i in tok("def add(a, b):\n    return a + b  # 加速比 3.5 倍").input_ids}
    assert {"code", "whitespace", "chinese", "number", "english"} <= types
    assert typer.describe(tok.eos_token_id)[1] == "special"
