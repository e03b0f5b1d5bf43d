"""What the New-experiment form refuses, testable without a browser: validate() checks every field and returns a
Launch (enqueue_experiment's keyword arguments, or the one-line problems that block Launch); number_error and
k_auto_error are the bound checks said under a field as it is typed, parse_grid the "At batch sizes" field,
batch_size_unused why the Batch size field is disabled. Plain Python (no Streamlit): pages/new_experiment.py draws the
form and calls these.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.config.limits import LIMITS
from engine.config.run_config import DEFAULT_REPEATS
from engine.config.variables import SETTINGS, VARIABLES
from engine.errors import DraftLabError
from engine.text.prompt_sets import Prompt, load_prompts
from pages.widgets.prefill import (
    AUTO_K,
    DEVICES,
    DTYPES,
    MAX_K,
    WIDGETS,
    canonical_drafter,
    form_config,
    parse_names,
    parse_sweep_values,
)
from storage.db.schema import NAME_CHARS

SWEEP_VARIABLES = tuple(
    VARIABLES
)  # engine/config/variables.py: k, a sampling setting with k fixed, the draft or the drafter
# The variables drawn by fields of their own on the page; any other numeric variable gets a number field from its
# description (title, step, help) under Sampling, and reaches validate() by name.
OWN_FIELDS = ("k", "temperature", "top_k", "top_p", "batch_size", "draft", "drafter", "draft_sampling")
EXTRA_FIELDS = tuple(name for name, v in VARIABLES.items() if not v.categorical and name not in OWN_FIELDS)
# Any other variable whose values are names from a fixed list (Variable.choices) gets a choice field from its
# description (its label, help and choices), and a sweep of it compares every choice.
CHOICE_FIELDS = tuple(name for name, v in VARIABLES.items() if v.choices and name not in OWN_FIELDS)
PAIR_REASON = "its reason is shown under Models: change the target or the draft"


@dataclass
class Launch:
    """A validated experiment, ready for enqueue_experiment, or the problems that stop it."""

    errors: list[str] = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)


def number_error(setting: str, value) -> str | None:
    """What is wrong with one number field's value, None when nothing: the bounds every input of the setting shares
    (engine/config/variables.py, with engine/config/limits.py's caps). The one check both for the line under the field,
    as it is typed, and for Launch's list."""
    described = VARIABLES.get(setting) or SETTINGS[setting]
    if described.in_range(value):
        return None
    cap = f" (raise the cap with ${LIMITS[described.limit].env})" if described.limit else ""
    return f"{described.title.lower()} must be {described.meaning}{cap}"


def k_auto_error(k_auto) -> str | None:
    """k auto's largest k out of range (under the field as typed, and in Launch's list), None when fine."""
    return None if 2 <= k_auto <= MAX_K else f"the largest k for k auto must be from 2 to {MAX_K}"


def validate(
    *,
    target: str,
    draft: str,
    pair_ok: bool,
    pair_message: str | None,
    prompts: str | None,
    prompt_error: str | None,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    max_new_tokens: int,
    device: str,
    dtype: str,
    sweep_variable: str,
    sweep_text: str,
    k: int,
    name: str,
    notes: str,
    tags_text: str,
    prompt_texts: list[Prompt] | None = None,
    repeats: int = DEFAULT_REPEATS,
    k_auto: int | None = None,
    drafter: str | None = "model",
    sweep_list: Sequence[str] | None = None,
    sweep_error: str | None = None,
    pair_checks: Sequence[tuple[str, bool, str]] | None = None,
    draft_sampling: str = "probabilistic",
    batch_size: int = 1,
    grid_text: str = "",
    prompt_count: int | None = None,
    **settings,
) -> Launch:
    """Check every field; a Launch with no errors carries the enqueue_experiment keyword arguments (plain text:
    the page escapes it). With k_auto (the largest k) the experiment is `--k auto`: sweep_text is not used. A draft
    or drafter sweep takes its names as sweep_list (else from sweep_text, comma-separated); a draft sweep is
    checked by pair_checks, (draft, ok, message) for each candidate, instead of pair_ok; sweep_error is a problem
    the form found in the swept values itself. `drafter` applies to every run unless the drafter is what is swept;
    None: the draft decides (engine/config/run_config.py default_drafter: eagle3 for an EAGLE-3 head, else model).
    grid_text: the optional "at batch sizes" list (two or more): the sweep (or k auto) at each, a grid (not with a
    batch-size sweep). prompt_count: the prompt set's size, when known: no batch size may have more rows.
    `settings`: any other described parameter's field by name (EXTRA_FIELDS: a variable with no field of its own)."""
    launch = Launch()
    # The check's reason is already on the page, under Models, where it was run: named here, not repeated.
    if sweep_variable == "draft" and pair_checks is not None:
        launch.errors += [
            f"pair check for draft {candidate!r} failed ({PAIR_REASON})"
            for candidate, ok, message in pair_checks
            if not ok
        ]
    elif not pair_ok:
        launch.errors.append(f"pair check failed ({PAIR_REASON})" if pair_message else "pair check failed")
    if prompt_error:
        launch.errors.append(f"prompts: {prompt_error}")
    elif not prompts:
        launch.errors.append("prompts: choose a built-in set or upload a .jsonl/.csv/.txt file")
    for setting, value in (
        ("temperature", temperature),
        ("top_k", top_k),
        ("top_p", top_p),
        ("batch_size", batch_size),
        *((name, value) for name, value in settings.items() if not VARIABLES[name].categorical),
        ("seed", seed),
        ("max_new_tokens", max_new_tokens),
        ("repeats", repeats),
    ):
        problem = number_error(setting, value)
        if problem:
            launch.errors.append(problem)
    if len(name.strip()) > NAME_CHARS:
        launch.errors.append(f"name is {len(name.strip())} characters; an experiment's name holds at most {NAME_CHARS}")
    if device not in DEVICES:
        launch.errors.append(f"device must be one of {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        launch.errors.append(f"dtype must be one of {', '.join(DTYPES)}")
    if sweep_variable not in SWEEP_VARIABLES:
        launch.errors.append(f"swept variable must be one of {', '.join(SWEEP_VARIABLES)}")
    if sweep_variable == "drafter":
        drafter = "model"  # each run names its own
    elif drafter is not None:
        try:
            drafter = canonical_drafter(drafter)
        except ValueError as exc:
            launch.errors.append(f"drafter: {exc}")
    values: list = []
    if k_auto is not None:
        sweep_variable, values, k = "k", [k_auto], k_auto
        if problem := k_auto_error(k_auto):
            launch.errors.append(problem)
    elif sweep_error:
        launch.errors.append(sweep_error)
    elif sweep_variable in SWEEP_VARIABLES:
        try:
            if VARIABLES[sweep_variable].categorical and sweep_list is not None:
                values = parse_names(sweep_list, sweep_variable)
            else:
                values = parse_sweep_values(sweep_text, sweep_variable)
        except ValueError as exc:
            launch.errors.append(str(exc))
    if problem := number_error("k", k):
        launch.errors.append(problem)
    sizes = None  # a grid's batch sizes
    if sweep_variable != "batch_size":  # k auto too: predicted, then confirmed at each
        sizes, problem = parse_grid(grid_text)
        if problem:
            launch.errors.append(problem)
    largest = max(sizes or (values if sweep_variable == "batch_size" and values else [batch_size]))
    if prompt_count is not None and VARIABLES["batch_size"].in_range(largest) and largest > prompt_count:
        launch.errors.append(
            f"batch size {largest} needs at least {largest} prompts but the prompt set has "
            f"{prompt_count}; use a batch size of {prompt_count} or less, or more prompts"
        )
    if launch.errors:
        return launch
    assert prompts, "no prompts is an error above"
    tags = tuple(dict.fromkeys(t.strip() for t in tags_text.split(",") if t.strip()))
    if sweep_variable == "draft":
        draft = values[0]
        models = f"{', '.join(values)} → {target.strip()}"
    elif sweep_variable == "drafter":
        models = f"{draft.strip()} ({', '.join(values)}) → {target.strip()}"
    else:
        models = f"{draft.strip()}{'' if drafter in ('model', None) else f' [{drafter}]'} → {target.strip()}"
    default_name = f"{models} on {Path(prompts).name if os.sep in prompts else prompts}"[:NAME_CHARS]
    # What is on screen, as one run configuration (engine/config/run_config.py, read by pages/widgets/prefill.py's
    # form_config): its enqueue arguments are what Launch queues.
    state = {
        "target": target,
        "draft": draft,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "batch_size": batch_size,
        "fixed_k": k,
        "draft_sampling": draft_sampling,
        "drafter_spec": drafter,
        "device": device,
        "dtype": dtype,
        "sweep_variable": AUTO_K if k_auto is not None else sweep_variable,
        "k_auto": k_auto,
        "sweep_list": values,
        "grid_batch_sizes": ",".join(map(str, sizes)) if sizes else None,
        **{WIDGETS[setting]: value for setting, value in settings.items()},
    }
    try:
        config = form_config(state, prompts)
    except (DraftLabError, ValueError) as exc:
        launch.errors.append(str(exc))
        return launch
    launch.kwargs = {**config.enqueue(), "name": name.strip() or default_name, "notes": notes.strip(), "tags": tags}
    if prompt_texts is not None:  # an upload: freeze its prompts now, so any worker can run them
        from pages.widgets.pair_check import render_prompts

        try:  # conversations become the text the target sees (its chat template), frozen as such
            launch.kwargs["prompt_texts"] = render_prompts(target.strip(), list(prompt_texts))
        except DraftLabError as exc:
            launch.errors.append(f"prompts: {exc}")
            launch.kwargs = {}
    return launch


def batch_size_unused(choice: str, grid_text) -> str | None:
    """Why the Batch size field is not used (batch size is swept, or "At batch sizes" lists a grid), None when it is:
    the field is then shown disabled with this as its help, so what is on screen is what Launch queues."""
    if choice == "batch_size":
        return "not used: batch size is the swept variable (its values are listed under Sweep)"
    if str(grid_text or "").strip():
        return "not used: At batch sizes lists the batch sizes (the first is the experiment's own)"
    return None


def count_prompts(prompts, prompt_texts) -> int | None:
    """How many prompts the chosen set holds, None when it cannot be read (its error is shown where it is chosen)."""
    try:
        return len(prompt_texts) if prompt_texts is not None else len(load_prompts(prompts)) if prompts else None
    except DraftLabError:
        return None


def parse_grid(grid_text) -> tuple[list[int] | None, str | None]:
    """The "At batch sizes" field: (its batch sizes, None); (None, None) when it is empty; (None, the problem)
    when it is not a grid (engine/config/variables.py's bounds, two or more sizes)."""
    if not str(grid_text or "").strip():
        return None, None
    try:
        sizes = parse_sweep_values(grid_text, "batch_size")
    except ValueError as exc:
        return None, f"at batch sizes: {exc}"
    if len(sizes) < 2:
        return None, (
            f"at batch sizes: a grid lists two or more batch sizes (got {sizes[0]}); for one batch size "
            f"set Batch size instead and leave this empty"
        )
    return sizes, None


def batch_sizes_of(grid_text: str, batch_size: int) -> list[int]:
    """The batch sizes Launch decodes at: the grid's (two or more listed in "at batch sizes"), else batch_size."""
    return parse_grid(grid_text)[0] or [int(batch_size)]
