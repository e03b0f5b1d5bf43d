"""Tests pin meaning, not sentences (issue 36 item 5): an assert that compares a message with a long sentence breaks
when the sentence is reworded and says nothing about what the message means. A test pins what the message names
instead: the field or flag, the number it quotes, the exit code, the stored status, the error's type
(tests/meaning.py's `missing(text, *parts)` lists the parts a message lacks).

The rule, checked on every tests/**/*.py by reading its syntax tree:
- where: a string literal (an f-string's placeholders read as `{}`) on either side of a comparison inside an `assert`
  (`==`, `in`, ...; also inside a list, tuple, set or dict written there, but not a call's arguments, which are the
  code's input), the pattern given to `.startswith`, `.endswith`, `re.search`, `re.match` or `re.fullmatch` inside an
  `assert`, and any call's `match=` (pytest.raises, pytest.warns);
- what: plain prose of at least MIN_CHARS characters: at least MIN_TOKENS whitespace-separated tokens, of which at
  least WORD_SHARE are plain words (letters, an apostrophe or inner hyphen, punctuation around them). Data is not
  prose by that rule, whatever its length: JSON, commands and flags, paths, URLs, code, regular expressions, tables
  and figures are mostly tokens that are not plain words.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MIN_CHARS = 60
MIN_TOKENS = 8
WORD_SHARE = 2 / 3
WORD = re.compile(r"[(\"'“‘*_]*[A-Za-z]+(?:['’-][A-Za-z]+)*[,.;:!?)\"'”’*_]*")
PATTERN_CALLS = {"startswith", "endswith", "search", "match", "fullmatch"}
CONTAINERS = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.BoolOp, ast.BinOp, ast.IfExp, ast.Starred)


def literal(node: ast.AST) -> str | None:
    """The text of a string literal; an f-string's placeholders read as `{}`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}" for v in node.values
        )
    return None


def is_prose(text: str) -> bool:
    tokens = text.split()
    if len(text.strip()) < MIN_CHARS or len(tokens) < MIN_TOKENS:
        return False
    return sum(bool(WORD.fullmatch(t)) for t in tokens) >= WORD_SHARE * len(tokens)


def _strings(node: ast.AST):
    """The string literals written at `node`: itself, or inside the containers written there (not inside a call)."""
    if literal(node) is not None:
        yield node
    elif isinstance(node, CONTAINERS):
        for child in ast.iter_child_nodes(node):
            yield from _strings(child)


def pinned(tree: ast.AST):
    """(line, text) of each string literal an assert compares a value with, or a match= pattern, in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "match":
                    yield from _strings(keyword.value)
        if not isinstance(node, ast.Assert):
            continue
        for inner in ast.walk(node.test):
            if isinstance(inner, ast.Compare):
                for side in (inner.left, *inner.comparators):
                    yield from _strings(side)
            elif isinstance(inner, ast.Call) and inner.args:
                name = inner.func.attr if isinstance(inner.func, ast.Attribute) else None
                if name in PATTERN_CALLS:
                    yield from _strings(inner.args[0])


def sentences(source: str, name: str = "<test>") -> list[str]:
    """`name:line: text` of each long sentence an assert in `source` pins."""
    found = {(node.lineno, text) for node in pinned(ast.parse(source)) if (text := literal(node)) is not None}
    return [f"{name}:{line}: {text!r}" for line, text in sorted(found) if is_prose(text)]


def test_no_assert_in_tests_pins_a_long_sentence():
    found = [
        hit
        for path in sorted(TESTS.rglob("*.py"))
        for hit in sentences(path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent)))
    ]
    assert not found, (
        f"{len(found)} assert(s) pin a sentence of {MIN_CHARS}+ characters: pin what the message names instead "
        "(the field, flag, number, exit code or stored state; tests/meaning.py's missing()):\n" + "\n".join(found)
    )


SAMPLE = """
import pytest, re
def test_sample(err, out, notes, run):
    assert "the drafter model drafts with a causal LM but the draft is an EAGLE-3 head" in err
    assert err == f"run {run} was named but the verdict would deploy another value of k instead"
    assert notes == ["a list that holds one long sentence that the assert compares word for word"]
    assert out.startswith("Timing drifted: rerun the experiment with more repeats on a quiet machine")
    with pytest.raises(ValueError, match="the prompt set holds fewer prompts than the batch size needs here"):
        pass
    assert re.fullmatch(r"error: the server could not bind its port because another program holds it", err)
    assert "--lr" in err and "0.5" in err and "limit of 2" in err
    assert out == "draftlab run --target demo-target --draft demo-draft --k 1,2,4 --repeats 3 --json"
    assert out == '{"run_id": 1, "k": 2, "speedup": 1.31, "speedup_ci": [1.22, 1.40], "status": "done"}'
    assert out == "| k | speedup (95% CI) | tokens/s | same output |\\n|---|---|---|---|"
    assert run(["the input of the code under test may be a long sentence written in plain words"]) == 0
    assert err == "short, and in plain words"
"""


def test_the_rule_names_each_sentence_and_lets_data_through():
    """The guard fails on each kind of pinned sentence, by its line, and passes what names things and data."""
    lines = [int(hit.split(":")[1]) for hit in sentences(SAMPLE)]
    assert lines == [4, 5, 6, 7, 8, 10], sentences(SAMPLE)
    assert all(hit.startswith("<test>:") for hit in sentences(SAMPLE))
