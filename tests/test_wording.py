"""Counts in words (engine/wording.py): `1 repeat`, `3 repeats`, never "1 repeats" or "run(s)"."""

from engine.wording import noun, plural


def test_one_is_singular_and_every_other_count_plural():
    assert plural(1, "repeat") == "1 repeat"
    assert plural(3, "repeat") == "3 repeats"
    assert plural(0, "run") == "0 runs"
    assert plural(2, "visible GPU") == "2 visible GPUs"
    assert plural(1, "process") == "1 process" and plural(2, "process") == "2 processes"
    assert plural(1472, "token", thousands=True) == "1,472 tokens"
    assert noun(1, "is", "are") == "is" and noun(4, "is", "are") == "are"
    assert noun(1.0, "median") == "median"


def test_counts_print_through_it_a_single_repeat_included():
    from app.report import format_table

    doc = {
        "experiment_id": 1,
        "repeats": 1,
        "runs": [],
        "verdict": None,
        "baseline": {"new_tokens": 8, "tokens_per_second": 10.0, "target_step_seconds": 0.01},
    }
    assert "(1 repeat, median)" in format_table(doc)
    assert "(3 repeats, medians)" in format_table({**doc, "repeats": 3})
