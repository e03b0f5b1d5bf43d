"""What a test pins in a message: the things it names (a field, a flag, a number, a status), not its sentence.

`assert not missing(err, "--lr", "0.5"), err` fails, listing what is absent, when the message stops naming them; a
reworded message that still names them passes. tests/test_test_style.py keeps long sentences out of asserts."""

from __future__ import annotations


def missing(text: str, *parts: str) -> list[str]:
    """The parts that `text` does not contain (all of them when it is empty or None)."""
    return [part for part in parts if part not in (text or "")]
