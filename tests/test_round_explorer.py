"""The Round explorer's words (issue 35 item 16): it says why it opens on the prompt it opens on, its prompt picker
shows line breaks (⏎) instead of gluing lines together, and its legend counts each kind once, without a label's
parenthesis running into the count's. tests/test_browser_round_explorer.py checks them drawn in Chromium."""

from __future__ import annotations

import pandas as pd

from pages.round_explorer import KIND_LABELS, legend_html, opening_prompt, opening_reason, picker_label

PER_PROMPT = pd.DataFrame(
    {
        "prompt_index": [0, 1, 2],
        "rejected": [9, 4, 7],
        "text": ["\n #\n #", "The cat sat on the mat", "def main(): return the value"],
    }
)


def test_the_opening_prompt_is_named_with_why():
    assert opening_prompt(PER_PROMPT) == 2
    reason = opening_reason(PER_PROMPT)
    assert "prompt 2" in reason and "most rejected drafts (7)" in reason and "read as text" in reason
    unreadable = PER_PROMPT.assign(text="\n #")
    assert opening_prompt(unreadable) == 0 and "(9)" in opening_reason(unreadable)
    assert "read as text" not in opening_reason(unreadable)


def test_the_prompt_picker_shows_line_breaks():
    label = picker_label(11, "import logging\nlogger = logging.getLogger(__name__)\r\n\tlogger.info('x')")
    assert label.startswith("11: import logging ⏎ logger = ")
    assert "logginglogger" not in label.replace(" ", "") and "\n" not in label and "\t" not in label
    assert label.endswith("…") and len(label) <= len("11: ") + 60 + 1
    assert picker_label(3, "short") == "3: short"


def test_the_legend_counts_the_kinds_the_output_has_once_each():
    output = pd.DataFrame({"kind": ["accepted", "accepted", "correction", "bonus", "accepted"]})
    legend = legend_html(output)
    assert f"{KIND_LABELS['accepted']}: 3" in legend and f"{KIND_LABELS['correction']}: 1" in legend
    assert ") (" not in legend and "(0)" not in legend
    assert "prefill" not in legend  # no first token in this output: not listed with a count of 0
    assert "prefill" in legend_html(pd.DataFrame({"kind": ["first", "accepted"]}))
