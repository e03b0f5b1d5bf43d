"""What an experiment's Launch decodes and how long that takes, said under the New-experiment form before it is
queued: tokens at most (prompts x arms x batch sizes x repeats x new tokens) and the duration at the target's speed
at each batch size (pages/panels/estimate.py: measured, or scaled from model size), or why there is no duration.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from engine.config.variables import VARIABLES
from engine.errors import DraftLabError
from engine.wording import plural
from pages.panels.estimate import decode_speed, duration
from pages.widgets.common import cached
from pages.widgets.form_checks import count_prompts
from pages.widgets.prefill import md_text, parse_sweep_values


def workload(
    prompt_count: int,
    arms: int,
    max_new_tokens: int,
    repeats: int,
    tokens_per_second: float | None,
    batch_sizes: int = 1,
):
    """(tokens at most, seconds at the measured target speed or None): every arm decodes every prompt `repeats`
    times up to max_new_tokens, at each of a grid's `batch_sizes` (speculative arms are counted at the target's
    speed: the estimate assumes no speedup)."""
    tokens = prompt_count * arms * max_new_tokens * repeats * batch_sizes
    return tokens, (tokens / tokens_per_second if tokens_per_second else None)


def arms_of(sweep_variable: str, values: int, k_auto: int | None) -> int:
    """Timed arms of an experiment: a shared baseline + one run per value, a baseline per value for a sampling
    sweep, and for k auto the k_max pass plus a confirmation pass (a baseline and the 3 best k)."""
    if k_auto is not None:
        return 2 + 4
    return 2 * values if VARIABLES[sweep_variable].per_value_baseline else 1 + values


def _speed(target: str, batch_size: int):
    """The target's decoding speed at batch_size and what it is from (pages/panels/estimate.py), None when unknown."""
    measured = cached("target_speed", target, batch_size=batch_size)
    return decode_speed(
        target, batch_size, measured, cached("baseline_speeds", batch_size) if measured is None else pd.DataFrame()
    )


def show_workload(
    prompts,
    prompt_texts,
    target,
    sweep_variable,
    sweep_text,
    sweep_list,
    k_auto,
    max_new_tokens,
    repeats,
    sizes: Sequence[int] = (1,),
):
    """What Launch would decode, and how long that takes at this target's speed at the same batch size (each of a
    grid's batch sizes at its own), saying what the speed is from."""
    try:
        count = count_prompts(prompts, prompt_texts) or 0
        values = (
            len(sweep_list)
            if sweep_list is not None and VARIABLES[sweep_variable].categorical
            else len(parse_sweep_values(sweep_text, sweep_variable))
            if k_auto is None
            else 1
        )
    except (DraftLabError, ValueError):
        return
    if not count:
        return
    arms = arms_of(sweep_variable, values, k_auto)
    if sweep_variable == "batch_size":  # a batch-size sweep: each value's baseline and run, at its own speed
        sizes = parse_sweep_values(sweep_text, "batch_size")
    per_size, _ = workload(
        count, arms // len(sizes) if sweep_variable == "batch_size" else arms, max_new_tokens, repeats, None
    )
    tokens = per_size * len(sizes)
    grid = f"{plural(len(sizes), 'batch size')} × " if len(sizes) > 1 and sweep_variable != "batch_size" else ""
    text = (
        f"Launch decodes at most {tokens:,} tokens: {plural(count, 'prompt')} × {plural(arms, 'arm')} × "
        f"{grid}{plural(repeats, 'repeat')} × {max_new_tokens} new tokens"
    )
    speeds = {size: _speed(target.strip(), size) for size in sizes} if target.strip() else {}
    if speeds and all(speeds.values()):
        seconds = sum(per_size / speed.tokens_per_second for speed in speeds.values())
        sources = "; ".join(
            (f"batch size {size}: " if len(sizes) > 1 else "") + speed.source for size, speed in speeds.items()
        )
        text += f"; about {duration(seconds)} on one worker, at {sources}."
    else:
        missing = ", ".join(str(size) for size, speed in speeds.items() if speed is None) or str(sizes[0])
        text += (
            f"; this target has no measured speed at batch size {missing} yet, and no measured target to "
            f"scale from by model size, so no duration estimate."
        )
    st.caption(md_text(text))
