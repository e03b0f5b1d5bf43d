"""One rule table, SPEC order, first match wins: a test per type with real examples."""

import pytest
from transformers import AutoTokenizer

from engine import zoo
from engine.text.token_types import TOKEN_TYPES, TokenTyper, token_type

EXAMPLES = {
    "whitespace": [" ", "    ", "\n", "\n        ", "\t\t", "\r\n"],
    "chinese": ["中", "推理", "，", "。", "、", " 模型", "《", "（", "加速比"],
    "number": ["0", "42", " 3.14", "1,000", "-7", "+2", " 256 ", ".5"],
    "english": ["the", " The", " model", "Hello", "a"],
    "punctuation": [",", ".", "!", "?", ";", ":", "'", '"', "...", "—", ", ", ".\n", "“"],
    "code": [
        "_",
        "__init__",
        "self_",
        "x1",
        " foo_bar",
        "==",
        "+=",
        "->",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        "():",
        " {",
        "#",
        "/",
        "*",
        "**",
        "<=",
        "&&",
        "=",
        " return_value",
    ],
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


# --- context decides for letters (SPEC Token types, turn 5) -------------------------------------------------------


def test_latin_letters_inside_code_are_code_and_nothing_else_changes():
    for text in ("class", "list", " tuple", "self", " return", "def"):
        assert token_type(text) == "english" and token_type(text, code=True) == "code", text
    for kind in ("whitespace", "number", "punctuation", "chinese", "code", "other"):
        for text in EXAMPLES[kind]:
            assert token_type(text, code=True) == kind, text
    assert token_type("<|endoftext|>", special=True, code=True) == "special"


def test_a_code_fence_opens_and_closes_the_code_context_across_tokens():
    from engine.text.token_types import CodeContext

    context = CodeContext(False, "Write a loop:\n")
    assert not context.code
    for piece, inside in (
        ("``", False),
        ("`python\n", True),
        ("for x in range(3):\n", True),
        ("`", True),
        ("``\nDone", False),
    ):
        context.see(piece)
        assert context.code == inside, piece
    assert CodeContext(False, "Fix this:\n```py\nimport os\n").code  # a fence the prompt leaves open
    assert CodeContext(True, "Some prose.").code  # a prompt from a code set: code throughout


def test_code_prompts_are_the_indices_a_code_set_contributes():
    from engine.text.prompt_sets import load_prompts
    from engine.text.token_types import code_prompts

    n_code, n_english = len(load_prompts("code:validation")), len(load_prompts("english"))
    assert code_prompts("code:validation") == frozenset(range(n_code))
    assert code_prompts("english+code:validation") == frozenset(range(n_english, n_english + n_code))
    assert code_prompts("english") == code_prompts("mixed") == code_prompts("inline") == frozenset()


@pytest.mark.skipif(zoo.resolve("demo-draft") is None, reason="demo pair not built in this checkout")
def test_a_code_prompts_drafts_read_as_code_in_the_engine():
    """The demo pair decodes a Python prompt: typed as a code prompt, its draft tokens of Latin letters (`def`,
    `return`, names) are code; the same decode typed as prose has them english. Nothing else moves."""
    from engine.decoding.runs import encode_prompts, speculative_decoder
    from engine.decoding.sampling import SamplingConfig
    from engine.models.loading import load_pair

    pair = load_pair("demo-target", "demo-draft", "cpu", "float32", False)
    prompt = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=48)
    ids = encode_prompts(pair, [prompt], cfg.max_new_tokens)
    typer = TokenTyper(pair.tokenizer)
    typed = {}
    for code in (False, True):
        decoder = speculative_decoder(pair, cfg, 3, typer.with_code_prompts({0} if code else ()))
        (result,) = decoder.generate_batch([prompt], ids, [0])
        typed[code] = [(d.text, d.token_type) for r in result.rounds for d in r.draft_tokens]
    assert [text for text, _ in typed[True]] == [text for text, _ in typed[False]]
    letters = [i for i, (text, kind) in enumerate(typed[False]) if kind == "english"]
    assert letters, typed[False]  # the demo's code has words: typed as prose they read english
    assert all(typed[True][i][1] == "code" for i in letters)
    assert all(typed[True][i] == typed[False][i] for i in range(len(typed[False])) if i not in letters)
    assert "english" not in {kind for _, kind in typed[True]}


@pytest.mark.skipif(zoo.resolve("demo-draft") is None, reason="demo pair not built in this checkout")
def test_draftlab_run_on_the_code_set_stores_a_breakdown_that_reads_as_code(tmp_path, capsys):
    """Issue 35 item 16: `class`, `list`, `return` were typed english in code prompts. Through the worker (its
    experiment's prompt spec names the code set), no stored draft token of a code prompt is english."""
    import json

    from app.cli import main

    db = f"sqlite:///{tmp_path / 'code.db'}"
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft",
                "--prompts",
                "code:validation",
                "--k",
                "3",
                "--max-new-tokens",
                "12",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--db",
                db,
                "--json",
            ]
        )
        == 0
    )
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["acceptance_by_type"] and "english" not in run["acceptance_by_type"]
    assert "code" in run["acceptance_by_type"]
