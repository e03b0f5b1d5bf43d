"""One variable at a time: `draftlab run`'s sweep options parsed into one swept variable."""

import pytest

from app.sweep import parse_sweep
from engine.errors import DraftLabError

BASE = {
    "k": "4",
    "temperature": "0",
    "top_k": "0",
    "top_p": "1.0",
    "draft": "demo-draft",
    "drafter": "model",
    "draft_sampling": "probabilistic",
}


def sweep(**changes):
    return parse_sweep({**BASE, **changes})


def test_a_single_configuration_is_a_k_sweep_of_one():
    s = sweep()
    assert (s.variable, s.values, s.ks, s.drafts, s.drafters) == ("k", [4], [4], ["demo-draft"], ["model"])
    assert s.fixed == {
        "temperature": 0.0,
        "top_k": 0,
        "top_p": 1.0,
        "draft": "demo-draft",
        "drafter": "model",
        "draft_sampling": "probabilistic",
    }


@pytest.mark.parametrize(
    "option, text, values",
    [
        ("k", "1,2,4", [1, 2, 4]),
        ("temperature", "0,0.7", [0.0, 0.7]),
        ("top_k", "0,50", [0, 50]),
        ("top_p", "0.9,1", [0.9, 1.0]),
        ("draft", "a, b ,c", ["a", "b", "c"]),
        ("drafter", "model,heuristic,prompt-lookup:3", ["model", "heuristic", "prompt-lookup:3"]),
        ("draft_sampling", "probabilistic, greedy", ["probabilistic", "greedy"]),
    ],
)
def test_any_one_option_may_list_values(option, text, values):
    s = sweep(**{option: text})
    assert s.variable == option and s.values == values
    assert option not in s.fixed and len(s.fixed) == len(BASE) - 1


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"k": "1,2", "draft": "a,b"}, "sweep one variable at a time: --k and --draft both list values"),
        ({"temperature": "0,1", "top_p": "0.9,1"}, "--temperature and --top-p"),
        ({"k": "auto", "drafter": "model,heuristic"}, "--k auto sweeps k itself"),
        ({"k": "1,,2"}, "empty value"),
        ({"k": "0,2"}, "from 1 to 64"),
        ({"top_k": "a"}, "not a whole number"),
        ({"draft": "a,a"}, "lists a twice"),
        ({"k": "auto:1"}, "at least 2"),
        ({"draft_sampling": "argmax"}, "not one of probabilistic, greedy"),
    ],
)
def test_bad_sweeps_are_one_line_errors(changes, message):
    with pytest.raises(DraftLabError, match=message):
        sweep(**changes)


def test_k_auto():
    s = sweep(k="auto:6")
    assert s.variable == "k" and s.k_auto == 6 and s.values == [6]
    assert sweep(k="auto").k_auto == 8
