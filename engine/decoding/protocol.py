"""Timing protocol v2: prompt-major, interleaved, repeated (SPEC "Timing protocol v2").

For each prompt every arm of an experiment (its baseline and each configuration) decodes back-to-back, in an
order rotated from prompt to prompt and from repeat to repeat, so slow drift of a shared machine lands on every
arm alike instead of on whichever arm happened to run during it. Each arm decodes each prompt `repeats` times;
the repeat with the median wall time stands for the prompt (its rounds and tokens are stored; outputs are
identical across repeats because every prompt draws from its own seeded generator), every repeat's timing is kept.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeVar

from engine.decoding.records import PromptResult

Arm = TypeVar("Arm", bound=Hashable)


def interleaved_order(arms: Sequence[Arm], prompt_index: int, repeats: int) -> list[tuple[int, Arm]]:
    """(repeat, arm) pairs in the order they decode one prompt: every arm once per repeat, the arm order
    rotated by one place per (prompt, repeat) so each arm takes every slot equally often."""
    arms = list(arms)
    order = []
    for repeat in range(repeats):
        shift = (prompt_index * repeats + repeat) % len(arms) if arms else 0
        order += [(repeat, arm) for arm in arms[shift:] + arms[:shift]]
    return order


def median_repeat(results: Sequence[PromptResult]) -> PromptResult:
    """The repeat whose wall time is the median (the lower middle one for an even count)."""
    ranked = sorted(results, key=lambda r: r.wall_seconds)
    return ranked[(len(ranked) - 1) // 2]
