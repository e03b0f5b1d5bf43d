"""Fuzz tests (hypothesis) of what users type or upload: the number parsers every input shares
(engine/numbers.py), the swept variables' and drafter specs' parsers (engine/config/variables.py,
engine/config/drafter_specs.py), the prompt-file loaders (engine/text/prompt_sets.py) and a link's prefill
(pages/widgets/prefill.py). Whatever the input, the answer
is a value inside the documented bounds or one DraftLabError line — never another exception. Bounded: a fixed number of
examples per test, no deadline flakiness on a loaded machine."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config.drafter_specs import SPECS, parse_drafter
from engine.config.variables import VARIABLES
from engine.errors import DraftLabError
from engine.numbers import ascii_float, ascii_int
from engine.text.prompt_sets import load_prompt_file
from pages.widgets.prefill import KNOWN, parse_prefill

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
# Text users might type: ASCII digits and signs, other scripts' digits, fullwidth forms, spaces, odd floats.
typed = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="0123456789+-.eE ,_", max_size=20),
    st.sampled_from(
        ["nan", "inf", "-inf", "1e999", "٣", "３", "1_0", "", " ", "+", "-0", "0x10", "10" * 30, "1e-300", "²"]
    ),
)


@FUZZ
@given(typed)
def test_numbers_are_ascii_and_finite_or_refused(text):
    """(Hypothesis once found '0\xa0' read as 0: a non-ASCII space around a number is refused too.)"""
    value = ascii_int(text)
    if value is not None:
        assert str(text).strip().lstrip("+-").isascii() and str(text).strip().lstrip("+-").isdigit()
    f = ascii_float(text)
    if f is not None:
        assert math.isfinite(f) and str(text).isascii()


@FUZZ
@given(st.sampled_from(sorted(VARIABLES)), typed)
def test_a_swept_variable_gives_a_bounded_value_or_one_line(name, text):
    v = VARIABLES[name]
    try:
        values = v.parse_list(text)
    except DraftLabError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert values and len(set(values)) == len(values)
    for value in values:
        if not v.categorical:
            assert isinstance(value, v.kind) and v.in_range(value)


@FUZZ
@given(st.one_of(typed, st.builds(lambda n, t: f"{n}:{t}", st.sampled_from(sorted(SPECS)), typed)))
def test_a_drafter_spec_is_valid_or_one_line(text):
    try:
        name, value = parse_drafter(text)
    except DraftLabError as exc:
        assert "\n" not in str(exc)
        return
    param = SPECS[name].parameter
    assert (value is None) == (param is None)
    if param is not None:
        assert isinstance(value, param.kind) and param.valid(value)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10,
)
lines = st.one_of(
    st.text(max_size=40),
    st.builds(lambda v: json.dumps({"prompt": v}), json_values),
    st.builds(lambda t: json.dumps({"prompt": t}, ensure_ascii=True), st.text(max_size=20)),
    st.sampled_from(
        [
            '{"prompt": "a\\ud800"}',
            '{"prompt": "\\u0000"}',
            "[" * 5000,
            '"just a string"',
            '{"prompt": "   "}',
            "prompt",
            '"a,b",c',
        ]
    ),
)


@FUZZ
@given(st.sampled_from([".jsonl", ".csv", ".txt"]), st.lists(lines, max_size=6))
def test_a_prompt_file_loads_clean_prompts_or_one_line(tmp_path_factory, suffix, content):
    path = tmp_path_factory.mktemp("fuzz") / f"prompts{suffix}"
    path.write_text("\n".join(content), encoding="utf-8", errors="surrogatepass")
    try:
        prompts = load_prompt_file(path)
    except DraftLabError as exc:
        assert "\n" not in str(exc)
        return
    assert prompts
    for prompt in prompts:
        assert isinstance(prompt, str) and prompt.strip() and "\x00" not in prompt
        prompt.encode("utf-8")  # valid Unicode: a tokenizer and both databases take it


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"prompt": "a\\u0000b"}\n', "NUL character"),
        ('{"prompt": "a\\ud800b"}\n', "unpaired surrogate"),
        ('{"prompt": " \\t "}\n', "only whitespace"),
        ("[" * 100_000 + "\n", "nested too deeply"),
    ],
)
def test_the_probe_prompts_are_refused_in_one_line(tmp_path, content, words):
    path = tmp_path / "p.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DraftLabError, match=words) as err:
        load_prompt_file(path)
    assert "\n" not in str(err.value)


def test_prompt_limits_are_settable(tmp_path, monkeypatch):
    path = tmp_path / "p.txt"
    path.write_text("a\nb\nc\n", encoding="utf-8")
    assert load_prompt_file(path) == ["a", "b", "c"]
    monkeypatch.setenv("DRAFTLAB_LIMIT_PROMPTS", "2")
    with pytest.raises(DraftLabError, match=r"limit of 2\b.*DRAFTLAB_LIMIT_PROMPTS"):
        load_prompt_file(path)
    monkeypatch.setenv("DRAFTLAB_LIMIT_PROMPTS", "２")
    with pytest.raises(DraftLabError, match=r"\$DRAFTLAB_LIMIT_PROMPTS\b.*'２'"):
        load_prompt_file(path)
    monkeypatch.delenv("DRAFTLAB_LIMIT_PROMPTS")
    monkeypatch.setenv("DRAFTLAB_LIMIT_PROMPT_FILE_MB", "1")
    path.write_text("x" * (2 * 2**20), encoding="utf-8")
    with pytest.raises(DraftLabError, match="2.0 MB, more than the limit of 1 MB"):
        load_prompt_file(path)


def _cli_number_options():
    """Every option and argument of every `draftlab` subcommand that reads a number: (where, its argparse type)."""
    import argparse

    from app.cli import build_parser

    found = []
    for group in build_parser()._subparsers._group_actions:
        for command, sub in group.choices.items():
            for action in sub._actions:
                if callable(action.type) and not isinstance(action, argparse._HelpAction):
                    found.append((f"{command} {'/'.join(action.option_strings) or action.dest}", action.type))
    return found


CLI_NUMBERS = _cli_number_options()


def test_every_cli_number_has_a_checked_parser():
    """No bare int/float left: Python's int() takes '٣' and 10**30, float() 'nan' (the probe's tracebacks)."""
    assert len(CLI_NUMBERS) >= 15, CLI_NUMBERS
    bare = [where for where, parse in CLI_NUMBERS if parse in (int, float) or not hasattr(parse, "accepts")]
    assert not bare, bare


@FUZZ
@given(st.sampled_from(range(len(CLI_NUMBERS))), st.one_of(typed, st.integers().map(str)))
def test_every_cli_number_parser_gives_a_bounded_value_or_one_line(index, text):
    import argparse

    from engine.numbers import DB_INT_MAX

    where, parse = CLI_NUMBERS[index]
    try:
        value = parse(text)
    except argparse.ArgumentTypeError as exc:
        assert str(exc) and "\n" not in str(exc), where
        return
    assert parse.accepts(value), (where, text, value)
    assert isinstance(value, float) or abs(value) <= DB_INT_MAX, (where, value)  # fits every database column


def test_a_non_ascii_space_around_a_number_is_refused():
    """str.strip() also removes U+00A0 and U+3000: '0\\xa0' was read as 0 (found by the fuzz test above)."""
    for text in ("0\xa0", "\u30004", "1.5\u2009"):
        assert ascii_float(text) is None and ascii_int(text) is None
    assert ascii_float(" 0.5\t") == 0.5 and ascii_int("\n4 ") == 4


@FUZZ
@given(
    st.dictionaries(
        st.one_of(st.sampled_from(sorted(KNOWN)), typed),
        st.one_of(typed, st.lists(typed, max_size=3)),
        max_size=8,
    )
)
def test_a_links_parameters_are_read_or_noted_never_raised(params):
    """pages/widgets/prefill.parse_prefill promises "nothing here raises": the New-experiment page calls it without
    a try (an exception there is a bug, never "the link could not be read"); a note is one line."""
    values, notes = parse_prefill(params, ["code:tune", "code:validation"])
    assert isinstance(values, dict) and all(isinstance(note, str) and "\n" not in note for note in notes)
