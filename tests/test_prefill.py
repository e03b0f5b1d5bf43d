"""pages/widgets/prefill.py: the New-experiment form's link parameters, parsed strictly, and the page's drafter specs,
which must read exactly as engine/decoding/drafting.py reads them (without importing torch)."""

from __future__ import annotations

import pytest

from pages.widgets import prefill as pf

SETS = ["code:tune", "code:validation", "math:tune", "math:validation"]


SPECS = [
    "model",
    "heuristic",
    " model ",
    "confidence:0.5",
    "confidence: 0.25 ",
    "confidence:.5",
    "confidence:5e-1",
    "confidence:0",
    "confidence:1",
    "confidence:-0.5",
    "confidence:nan",
    "confidence:inf",
    "confidence:",
    "confidence",
    "prompt-lookup:3",
    "prompt-lookup:+3",
    "prompt-lookup:03",
    "prompt-lookup:0",
    "prompt-lookup:3.0",
    "prompt-lookup",
    "model:1",
    "heuristic:",
    "modle",
    "",
    "  ",
    "prompt_lookup:3",
]


@pytest.mark.parametrize("spec", SPECS)
def test_drafter_specs_read_as_the_engine_reads_them(spec):
    from engine.config.drafter_specs import canonical_drafter, parse_drafter
    from engine.errors import DraftLabError

    try:
        expected = parse_drafter(spec), canonical_drafter(spec)
    except DraftLabError:
        expected = None
    try:
        got = pf.parse_drafter_spec(spec), pf.canonical_drafter(spec)
    except ValueError:
        got = None
    assert got == expected


@pytest.mark.parametrize(
    "spec",
    ["confidence:٠.٥", "prompt-lookup:٣", "confidence:0_5", "prompt-lookup:1_0", "prompt-lookup:３", "confidence:nan"],
)
def test_drafter_numbers_are_ascii_only(spec):
    from engine.config.drafter_specs import parse_drafter
    from engine.errors import DraftLabError

    with pytest.raises(ValueError):
        pf.parse_drafter_spec(spec)
    with pytest.raises(DraftLabError):  # the CLI and the engine read the same spec the same way
        parse_drafter(spec)


def test_the_page_offers_every_drafter_of_the_engine():
    from engine.config.drafter_specs import SPECS

    assert tuple(SPECS) == pf.DRAFTER_KINDS
    assert {name for name, spec in SPECS.items() if spec.parameter} == set(pf.DRAFTER_PARAMETERS)


def test_drafter_sweep_specs_and_back():
    specs = pf.drafter_specs(
        ["model", "confidence", "prompt-lookup", "suffix"],
        {"confidence": "0.3, .7", "prompt-lookup": "2", "suffix": "8, 24"},
    )
    assert specs == ["model", "confidence:0.3", "confidence:0.7", "prompt-lookup:2", "suffix:8", "suffix:24"]
    assert pf.split_drafter_specs(specs) == (
        ["model", "confidence", "prompt-lookup", "suffix"],
        {"confidence": "0.3,0.7", "prompt-lookup": "2", "suffix": "8,24"},
    )
    assert pf.drafter_specs(["suffix"], {}) == ["suffix:24"]  # its parameter has a default: none listed is fine
    for kinds, listed, words in [
        (["confidence"], {"prompt-lookup": "3"}, "needs a probability"),
        (["confidence"], {"confidence": "1.5"}, "not a"),
        (["prompt-lookup"], {"prompt-lookup": "0"}, "not the longest"),
        (["suffix"], {"suffix": "65"}, "depth"),
        ([], {}, "at least one drafter"),
        (["confidence"], {"confidence": "0.5,0.50"}, "twice"),
    ]:
        with pytest.raises(ValueError, match=words):
            pf.drafter_specs(kinds, listed)


def test_every_drafter_parameter_has_its_fields_from_the_declaration():
    """The form's fields for a drafter's parameter come from its declaration (engine/config/drafter_specs.py), not from
    a list of names: each parameter has a field for the fixed drafter and one for a sweep's values, with its default."""
    from pages import new_experiment

    assert set(pf.DRAFTER_WIDGETS) == set(pf.DRAFTER_SWEEP_WIDGETS) == set(pf.DRAFTER_PARAMETERS)
    for name, param in pf.DRAFTER_PARAMETERS.items():
        assert new_experiment.DEFAULTS[pf.DRAFTER_WIDGETS[name]] == param.default
        assert pf.drafter_specs([name], {name: new_experiment.DEFAULTS[pf.DRAFTER_SWEEP_WIDGETS[name]]})


def test_sweep_values_of_every_variable():
    assert pf.parse_sweep_values("8, 1 4") == [1, 4, 8]
    assert pf.parse_sweep_values("1,0.5", "temperature") == [0.5, 1.0]
    assert pf.parse_sweep_values(" b , a ,", "draft") == ["b", "a"]  # names keep their order
    assert pf.parse_sweep_values("heuristic,confidence: 0.50", "drafter") == ["heuristic", "confidence:0.5"]
    for text, variable, words in [
        ("٣", "k", "whole number"),
        ("nan", "temperature", r"is not 0 \(greedy\) or a number"),
        ("1_0", "top_k", "whole number"),
        ("a,a", "draft", "twice"),
        ("confidence:0.5,confidence:.5", "drafter", "twice"),
        (",", "draft", "at least one"),
        ("beam", "drafter", "unknown drafter"),
    ]:
        with pytest.raises(ValueError, match=words):
            pf.parse_sweep_values(text, variable)


@pytest.mark.parametrize(
    "text, variable, words",
    [
        ("0", "k", "k value '0' is not a whole number from 1 to 64; enter e.g. 1,2,4,8"),
        ("1,x", "k", "k value 'x'"),
        ("2,2", "batch_size", "batch size lists 2 twice"),
        ("0.0001", "temperature", "or e.g. 0.001"),
        ("1.5", "top_p", "top-p value '1.5'"),
        ("1" * 12, "max_new_tokens", "max new tokens"),
        (",".join(map(str, range(1, 70))), "k", "k:"),
    ],
)
def test_form_errors_speak_the_form_s_language_not_cli_flags(text, variable, words):
    """The form and its links parse with engine/config/variables.py's one parser, worded for the form: a field's words
    and an example to type, never `--k` or `use e.g. --k 1,2,4,8` (the CLI keeps those)."""
    from engine.config.variables import SETTINGS, VARIABLES
    from engine.errors import DraftLabError

    described = VARIABLES.get(variable) or SETTINGS[variable]
    with pytest.raises((ValueError, DraftLabError)) as caught:
        if variable in VARIABLES:
            pf.parse_sweep_values(text, variable)
        else:
            described.parse(text, form=True)
    assert words in str(caught.value) and "--" not in str(caught.value), str(caught.value)
    with pytest.raises(DraftLabError, match=described.flag):  # the same value, from the CLI: its flag
        described.parse_list(text) if variable in VARIABLES else described.parse(text)


def test_a_findings_link_fills_every_field():
    from storage.analysis.findings import prefill_query

    page, params = prefill_query(
        {
            "target": "demo-target",
            "draft": "demo-draft",
            "prompts": "math:validation",
            "temperature": 0.7,
            "top_k": 40,
            "top_p": 0.9,
            "seed": 3,
            "max_new_tokens": 64,
            "device": "cpu",
            "dtype": "float32",
            "repeats": 5,
            "sweep": "temperature",
            "values": "0.5,1",
            "k": 3,
            "notes": "Follow-up to #1: *why*",
            "drafter": "heuristic",
            "k_auto": None,
            "batch_size": 2,
            "draft_sampling": "greedy",
        }
    )
    assert page == "new"
    values, notes = pf.parse_prefill(params, SETS)
    assert notes == []
    assert values == {
        "target": "demo-target",
        "draft": "demo-draft",
        "prompt_source": "Built-in",
        "prompt_set": "math:validation",
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "seed": 3,
        "max_new_tokens": 64,
        "device": "cpu",
        "dtype": "float32",
        "repeats": 5,
        "sweep_variable": "temperature",
        "sweep_values": "0.5,1",
        "fixed_k": 3,
        "notes": "Follow-up to #1: *why*",
        "drafter": "heuristic",
        "batch_size": 2,
        "draft_sampling": "greedy",
    }
    assert type(values["temperature"]) is float and type(values["top_k"]) is int


def test_link_sweeps_auto_draft_and_drafter():
    values, notes = pf.parse_prefill({"sweep": "auto", "k_auto": "6"}, SETS)
    assert values == {"sweep_variable": pf.AUTO_K, "k_auto": 6} and notes == []
    values, notes = pf.parse_prefill({"sweep": "draft", "draft": "demo-draft,demo-draft-distilled"}, SETS)
    assert values == {"sweep_variable": "draft", "draft_candidates": ["demo-draft", "demo-draft-distilled"]}
    values, notes = pf.parse_prefill(
        {"sweep": "drafter", "values": "model,confidence:0.3,prompt-lookup:3", "drafter": "confidence:0.9"}, SETS
    )
    assert values["drafter_sweep"] == ["model", "confidence", "prompt-lookup"]
    assert (values[pf.DRAFTER_SWEEP_WIDGETS["confidence"]], values[pf.DRAFTER_SWEEP_WIDGETS["prompt-lookup"]]) == (
        "0.3",
        "3",
    )
    assert (values["drafter"], values[pf.DRAFTER_WIDGETS["confidence"]]) == ("confidence", 0.9) and notes == []
    values, notes = pf.parse_prefill({"drafter": "prompt-lookup:4", "prompts": "code"}, SETS)
    assert values == {
        "drafter": "prompt-lookup",
        pf.DRAFTER_WIDGETS["prompt-lookup"]: 4,
        "prompt_source": "Built-in",
        "prompt_set": "code:tune",
    }


@pytest.mark.parametrize(
    "params, key",
    [
        ({"seed": "٣"}, "seed"),
        ({"seed": "-1"}, "seed"),
        ({"top_p": "0"}, "top_p"),
        ({"temperature": "nan"}, "temperature"),
        ({"temperature": "1e999"}, "temperature"),
        ({"max_new_tokens": "0x10"}, "max_new_tokens"),
        ({"k": "65"}, "k"),
        ({"k_auto": "1"}, "k_auto"),
        ({"repeats": "²"}, "repeats"),
        ({"device": "tpu"}, "device"),
        ({"dtype": "int8"}, "dtype"),
        ({"sweep": "seed"}, "sweep"),
        ({"values": "1,x"}, "values"),
        ({"prompts": "/etc/passwd"}, "prompts"),
        ({"drafter": "beam"}, "drafter"),
        ({"target": "a,b"}, "target"),
        ({"target": " "}, "target"),
        ({"draft": "x" * 301}, "draft"),
        ({"notes": "a\x00b"}, "notes"),
        ({"sweep": "draft", "values": "a,a"}, "values"),
        ({"trust_remote_code": "true"}, "trust_remote_code"),
        ({"seed": ["1", "2"]}, "seed"),
    ],
)
def test_a_bad_link_parameter_is_left_out_with_a_note(params, key):
    values, notes = pf.parse_prefill(params, SETS)
    widgets = {"k": "fixed_k", "sweep": "sweep_variable", "values": "sweep_values", "prompts": "prompt_set"}
    assert widgets.get(key, key) not in values and "draft_candidates" not in values
    assert len(notes) == 1 and key in notes[0], notes


def test_md_text_shows_user_text_literally():
    shown = pf.md_text("**b** _i_ `c` [l](http://x) <b> $x$ :red[r] :material/home: # h | t ~s~ a@b.c www.x.org \n2")
    for raw in ("**", "_i_", "`c`", "[l]", "<b>", "$x$", ":red[", ":material/", "http://", "a@b", "www."):
        assert raw not in shown, raw
    assert "\n" not in shown and pf.md_text("2 prompts from mine.txt") == "2 prompts from mine.txt"
