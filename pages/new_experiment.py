"""New experiment: pick the pair (checked before launch), prompts, sampling, the drafter and the one variable to
sweep (k, k auto, a sampling setting, the draft or the drafting strategy), optionally at several batch sizes (a
grid, whose detail page gives a k schedule); Launch enqueues it.

A link can fill the form: `new?target=...&draft=...&sweep=k&values=1,2,4&drafter=confidence:0.5` (the parameters
storage/analysis/findings/links.py's prefill_query writes; pages/widgets/prefill.py parses them strictly), and
`batch_sizes=1,4,16` for a grid: the sweep at each batch size (the "At batch sizes" field). They are put into the
widgets when the form is first drawn; a bad one is left out with a short note.

What is on screen is what Launch queues: no number field has bounds in the browser (a number outside them is kept
by the browser with a red mark and never sent, so Launch would queue the value before it); validate() checks every
bound with engine/config/variables.py's descriptions and blocks Launch in one line. A field that is not used (Batch size
beside a grid's "At batch sizes") is shown disabled, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import streamlit as st

from engine import zoo
from engine.config.drafter_specs import DRAFT_SAMPLING, SPECS
from engine.config.limits import LIMITS
from engine.config.run_config import DEFAULT_REPEATS
from engine.config.run_config import DEFAULTS as RUN_DEFAULTS
from engine.config.variables import SETTINGS, VARIABLES
from engine.errors import DraftLabError
from engine.text.prompt_sets import (
    DEFAULT_SPLIT,
    PROMPT_SET_DESCRIPTIONS,
    Prompt,
    list_prompt_sets,
    load_prompt_file,
    load_prompts,
)
from engine.wording import plural
from pages.panels.estimate import decode_speed, duration
from pages.widgets.common import NO_DATABASE, cached, nav_page, store
from pages.widgets.prefill import (
    AUTO_K,
    DEFAULT_DRAFTER_SWEEP,
    DEFAULT_SWEEP,
    DEVICES,
    DRAFTER_KINDS,
    DRAFTER_PARAMETERS,
    DRAFTER_SUMMARY,
    DRAFTER_SWEEP_WIDGETS,
    DRAFTER_WIDGETS,
    DTYPES,
    INTEGER_VARIABLES,
    MAX_K,
    NUMERIC_SWEEPS,
    SWEEP_CHOICES,
    SWEEP_LABELS,
    WIDGETS,
    canonical_drafter,
    drafter_spec,
    drafter_specs,
    form_config,
    md_text,
    parse_names,
    parse_prefill,
    parse_sweep_values,
)
from pages.widgets.uploads import UPLOAD_TYPES, prune_uploads, save_upload, upload_dir  # noqa: F401 (re-exported)
from storage.db.errors import QueueError
from storage.db.schema import NAME_CHARS
from storage.jobs.experiments import DUPLICATE_WINDOW_SECONDS, enqueue_experiment, recent_duplicate

__all__ = [
    "AUTO_K",
    "DEFAULT_SWEEP",
    "INTEGER_VARIABLES",
    "MAX_K",
    "Launch",
    "parse_sweep_values",
    "render",
    "save_upload",
    "upload_dir",
    "validate",
]

SWEEP_VARIABLES = tuple(
    VARIABLES
)  # engine/config/variables.py: k, a sampling setting with k fixed, the draft or the drafter
# The variables drawn by fields of their own below; any other numeric variable gets a number field from its
# description (title, step, help) under Sampling, and reaches validate() by name.
OWN_FIELDS = ("k", "temperature", "top_k", "top_p", "batch_size", "draft", "drafter", "draft_sampling")
EXTRA_FIELDS = tuple(name for name, v in VARIABLES.items() if not v.categorical and name not in OWN_FIELDS)
# Any other variable whose values are names from a fixed list (Variable.choices) gets a choice field from its
# description (its label, help and choices), and a sweep of it compares every choice.
CHOICE_FIELDS = tuple(name for name, v in VARIABLES.items() if v.choices and name not in OWN_FIELDS)
DEFAULT_K_AUTO = 8
LINK_NOTES = "new_experiment_link_notes"  # session key: what the link's parameters left out
# Each widget's first value: the page seeds st.session_state with these (or the link's values) and creates the
# widgets without value=/index=, so a value from a link never competes with a default.
DEFAULTS = {
    # every described parameter's field at its default (engine/config/run_config.py), the draft a shipped one
    **{WIDGETS[name]: RUN_DEFAULTS[name] for name in RUN_DEFAULTS if name != "draft"},
    "target": zoo.DEMO_TARGET,
    "draft": zoo.DEMO_DRAFTS[0],
    "prompt_source": "Built-in",
    "device": "auto",
    "dtype": "auto",
    "sweep_variable": "k",
    "sweep_values": DEFAULT_SWEEP,
    "k_auto": DEFAULT_K_AUTO,
    "name": "",
    "tags": "",
    "notes": "",
    "drafter_sweep": DEFAULT_DRAFTER_SWEEP,
    "grid_batch_sizes": "",
    **{DRAFTER_WIDGETS[name]: param.default for name, param in DRAFTER_PARAMETERS.items()},
    **{DRAFTER_SWEEP_WIDGETS[name]: f"{param.default:g}" for name, param in DRAFTER_PARAMETERS.items()},
}
GRID_HELP = (
    "optional, comma-separated (e.g. 1,4,16): run the whole sweep (k auto: its probe, prediction and "
    "confirmations), baselines included, at each of these "
    "batch sizes, each paired with its own target-only baseline there; the experiment then gives a k "
    "schedule (the k to serve at each batch size, off where no k is measurably faster). Each batch size is "
    f"{VARIABLES['batch_size'].meaning}; with a list, Batch size above is not used"
)


@dataclass
class Launch:
    """A validated experiment, ready for enqueue_experiment, or the problems that stop it."""

    errors: list[str] = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)


def _format(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


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


# --- widgets ----------------------------------------------------------------------------------------------------


def batch_size_unused(choice: str, grid_text) -> str | None:
    """Why the Batch size field is not used (batch size is swept, or "At batch sizes" lists a grid), None when it is:
    the field is then shown disabled with this as its help, so what is on screen is what Launch queues."""
    if choice == "batch_size":
        return "not used: batch size is the swept variable (its values are listed under Sweep)"
    if str(grid_text or "").strip():
        return "not used: At batch sizes lists the batch sizes (the first is the experiment's own)"
    return None


def _seed(key: str, default=None) -> None:
    """Give a widget its first value through st.session_state (the widget is then created without one)."""
    if key not in st.session_state:
        st.session_state[key] = DEFAULTS[key] if default is None else default


def _apply_link() -> None:
    """On the form's first draw (a fresh visit of the page): the link's query parameters into the widgets."""
    params = {key: st.query_params.get_all(key) for key in st.query_params}
    # No try: parse_prefill notes every bad parameter and raises nothing (fuzzed in tests/test_fuzz_inputs.py), so an
    # exception here is a bug to see, never "the link's parameters could not be read".
    values, notes = parse_prefill(params, list_prompt_sets(), DEFAULT_SPLIT)
    for key, value in values.items():
        st.session_state[key] = value
    st.session_state[LINK_NOTES] = notes


PAIR_REASON = "its reason is shown under Models: change the target or the draft"
CHECKING = "checking that the two tokenizers match (the first check after a start loads transformers)…"


@dataclass(frozen=True)
class _CheckOnPage:
    """A pair check and where its result goes on the page: `slot`, the placeholder that said `checking…` while
    it ran (None when the result was already known: then it is drawn in the same place directly)."""

    ok: bool
    message: str
    slot: object = None
    vocab: str | None = None  # "intersection": the draft has another tokenizer (pages/widgets/pair_check.PairCheck)


def _pair_check(target: str, draft: str) -> _CheckOnPage:
    """The pair check of target and draft. One that has work to do (not remembered, or a local directory that
    changed) first puts `checking…` where its result will go, so the last result (a green `tokenizers match`)
    never stays up while a new check runs; _show_check then draws the result in that place."""
    from pages.widgets.pair_check import cached_check, check_pair_names

    target, draft = target.strip(), draft.strip()
    check, slot = cached_check(target, draft), None
    if check is None:
        slot = st.empty()
        slot.info(f"Pair check: {CHECKING}", icon=":material/hourglass_top:")
        check = check_pair_names(target, draft)
    return _CheckOnPage(check.ok, check.message, slot, check.vocab)


def _vocab_warning(target: str, draft: str, prompts: str, prompt_texts) -> None:
    """Under the prompts: the share of their tokens outside the vocabulary a draft of another tokenizer shares with
    the target (pages/widgets/pair_check.prompt_vocab_warning), when any are."""
    from pages.widgets.pair_check import prompt_vocab_warning

    texts = prompt_texts if prompt_texts is not None else load_prompts(prompts)
    warning = prompt_vocab_warning(target.strip(), draft.strip(), texts)
    if warning:
        st.warning(md_text(warning), icon=":material/translate:")


def _model_error(name: str) -> str | None:
    """Under a model field, as it is typed: a path-looking name with no folder there (engine/zoo/__init__.py's
    missing_folder, the rule the engine loads by), never the hub's complaint about a repo id; None when fine."""
    problem = zoo.missing_folder(str(name or "").strip())
    if problem:
        st.error(md_text(problem), icon=":material/folder_off:")
    return problem


def _number_error(setting: str, value, container=st) -> str | None:
    """Under a number field, as it is typed: number_error's line, in the field's own column; None when fine."""
    problem = number_error(setting, value)
    if problem:
        container.error(md_text(problem), icon=":material/error:")
    return problem


def _show_check(check, label: str = "Pair check") -> None:
    where = getattr(check, "slot", None) or st
    if check.ok:
        where.success(f"{label}: {md_text(check.message)}", icon=":material/check_circle:")
    else:
        where.error(f"{label}: {md_text(check.message)}", icon=":material/error:")


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


def _prompt_count(prompts, prompt_texts) -> int | None:
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


def _speed(target: str, batch_size: int):
    """The target's decoding speed at batch_size and what it is from (pages/panels/estimate.py), None when unknown."""
    measured = cached("target_speed", target, batch_size=batch_size)
    return decode_speed(
        target, batch_size, measured, cached("baseline_speeds", batch_size) if measured is None else pd.DataFrame()
    )


def _workload(
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
        count = _prompt_count(prompts, prompt_texts) or 0
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


def _prompt_source() -> tuple[str | None, str | None, list[Prompt] | None]:
    """(prompt set spec or saved file path, error, the uploaded prompts) from the prompt-set widgets."""
    _seed("prompt_source")
    source = st.radio("Prompt set", ["Built-in", "Upload a file"], horizontal=True, key="prompt_source")
    if source == "Built-in":
        sets = list_prompt_sets()
        _seed("prompt_set", "code:tune" if "code:tune" in sets else sets[0])
        spec = st.selectbox(
            "Built-in set (NAME:SPLIT)",
            sets,
            key="prompt_set",
            persist_state="page",
            help="Tune on `tune`, confirm on `validation`.",
        )
        try:
            count = len(load_prompts(spec))
        except DraftLabError as exc:
            return None, str(exc), None
        st.caption(f"{plural(count, 'prompt')} — {PROMPT_SET_DESCRIPTIONS.get(spec.split(':')[0], '')}")
        return spec, None, None
    upload = st.file_uploader(
        'Prompt file: .jsonl (a "prompt" field, or a conversation: OpenAI "messages" or '
        'ShareGPT "conversations", per line), .csv (a "prompt" column), .txt (one prompt a '
        "line) or a .parquet/.arrow dataset export",
        type=UPLOAD_TYPES,
        key="prompt_upload",
    )
    if upload is None:
        return None, None, None
    path = save_upload(upload.name, upload.getvalue())
    try:
        prompts = load_prompt_file(path)
    except DraftLabError as exc:
        return None, str(exc).replace(str(path), upload.name), None
    if not prompts:
        return None, f"{upload.name} holds no prompts", None
    st.caption(md_text(f"{plural(len(prompts), 'prompt')} from {upload.name}"))  # never the server's path
    return str(path), None, prompts


def _parameter_input(kind: str, key: str, container=st) -> float | int:
    """The number a drafter's parameter takes (its declaration: symbol, meaning, int or float; unbounded here, like
    every number of the form: the browser keeps an out-of-range number to itself, so validate() checks it and blocks
    Launch)."""
    param = DRAFTER_PARAMETERS[kind]
    _seed(key)
    return container.number_input(
        f"{param.symbol} of {kind}",
        step=1 if param.kind is int else 0.05,
        key=key,
        persist_state="page",
        help=param.meaning,
    )


def _kind_label(kind: str) -> str:
    return f"{kind}:{DRAFTER_PARAMETERS[kind].symbol}" if kind in DRAFTER_PARAMETERS else kind


def _drafter_choice(drafts: list[str]) -> str | None:
    """The one drafter every run uses (when the drafter is not what is swept), as a spec; None when a draft is an
    EAGLE-3 head: the run configuration then gives each draft its own drafter (engine/config/run_config.py: a head the
    one that reads hidden states, a causal LM model), so one draft sweep compares heads with causal LMs."""
    from engine.config.head_format import is_head

    heads = [d for d in drafts if d.strip() and is_head(d.strip())]
    if heads:
        st.caption(
            "The draft is an EAGLE-3 head: it drafts as eagle3, from the target's own hidden states"
            if len(heads) == len(drafts)
            else "Each draft drafts with its own drafter: the EAGLE-3 heads as "
            "eagle3, from the target's own hidden states, the causal LMs as model"
        )
        return None
    c1, c2 = st.columns([2, 1])
    _seed("drafter")
    kind = c1.selectbox(
        "Drafter",
        DRAFTER_KINDS,
        key="drafter",
        persist_state="page",
        format_func=_kind_label,
        help="how each round's draft tokens are proposed: " + "; ".join(DRAFTER_SUMMARY.values()),
    )
    value = None
    if kind in DRAFTER_PARAMETERS:
        raw = _parameter_input(kind, DRAFTER_WIDGETS[kind], c2)
        # 0.1 + 0.2 steps: 0.3, not 0.30…04
        value = int(raw) if DRAFTER_PARAMETERS[kind].kind is int else round(float(raw), 6)
    if not SPECS[kind].needs_model:
        st.caption(f"{kind} drafts without the draft model; the pair is still loaded and checked")
    return drafter_spec(kind, value)


def _trained_drafts() -> dict[str, str]:
    """{path: label} of the drafts finished training jobs wrote (Train a draft), newest first; an EAGLE-3 head is
    labelled as one (it drafts for its own target only, with the eagle3 drafter)."""
    import logging

    from storage.jobs import training

    try:
        drafts = training.trained_drafts(store())
    except NO_DATABASE:  # the form works without the database (it opens it to launch); a bug is raised
        logging.getLogger("draftlab.dashboard").warning("could not list trained drafts", exc_info=True)
        return {}
    return {
        d["out"]: f"{d['name']} ({'EAGLE-3 head' if d['kind'] == 'head' else 'trained'}, job {d['job_id']})"
        for d in drafts
    }


def _pick_draft() -> None:
    picked = st.session_state.get("draft_pick")
    if picked:
        st.session_state["draft"] = picked


def _draft_candidates(target: str) -> tuple[list[str], list[tuple[str, bool, str]]]:
    """The drafts a draft sweep compares, each pair-checked against the target (tokenizers only)."""
    current = str(st.session_state.get("draft", DEFAULTS["draft"]) or "").strip()
    _seed("draft_candidates", [current] if current else [])
    trained = _trained_drafts()
    chosen = st.multiselect(
        "Draft candidates",
        list(dict.fromkeys([*zoo.DEMO_DRAFTS, *trained])),
        key="draft_candidates",
        accept_new_options=True,
        format_func=lambda v: trained.get(v, v),
        persist_state="page",
        placeholder="pick a demo draft or type a model id / path",
        help="one speculative run per draft, all against one baseline; type an HF model id or "
        "a local directory and press Enter to add it",
    )
    names = [str(n).strip() for n in chosen if str(n).strip()]
    checks = []
    for name in names:
        check = _pair_check(target, name)
        _show_check(check, f"Pair check {md_text(name)}")
        checks.append((name, check.ok, check.message))
    if not names:
        st.info("Add at least one draft to compare.", icon=":material/info:")
    return names, checks


def _drafter_sweep() -> tuple[list[str] | None, str | None]:
    """(the drafter specs a drafter sweep compares, or None and why not) from its widgets."""
    _seed("drafter_sweep")
    kinds = st.multiselect(
        "Drafters",
        DRAFTER_KINDS,
        key="drafter_sweep",
        persist_state="page",
        format_func=_kind_label,
        help="one speculative run per drafter (per parameter value listed), all against one "
        "baseline; " + "; ".join(DRAFTER_SUMMARY.values()),
    )
    with_parameter = [kind for kind in kinds if kind in DRAFTER_PARAMETERS]
    for column, kind in zip(st.columns(max(1, len(with_parameter))), with_parameter):
        param, key = DRAFTER_PARAMETERS[kind], DRAFTER_SWEEP_WIDGETS[kind]
        _seed(key)
        column.text_input(
            f"{kind} {param.symbol} values",
            key=key,
            persist_state="page",
            help=f"comma-separated, each {param.meaning}; one run each",
        )
    try:
        return drafter_specs(
            kinds, {kind: st.session_state.get(DRAFTER_SWEEP_WIDGETS[kind], "") for kind in with_parameter}
        ), None
    except ValueError as exc:
        return None, str(exc)


def render() -> None:
    st.title("New experiment")
    st.caption("A target-only baseline plus one speculative run per swept value, queued for the worker.")
    if "target" not in st.session_state:  # a fresh visit: the form's widgets are not there yet
        _apply_link()
    link_notes = st.session_state.get(LINK_NOTES) or []
    if link_notes:
        st.caption("Left out from the link: " + "; ".join(md_text(n) for n in link_notes))
    _seed("sweep_variable")
    choice = st.session_state["sweep_variable"]  # the selectbox below: the Models column depends on it

    left, right = st.columns(2)
    with left:
        st.subheader("Models")
        _seed("target")
        target = st.text_input("Target model", key="target", help=zoo.model_help("target"))
        unfound = _model_error(target)  # a path with no folder there, said under its field
        checks = None
        check = None  # the one draft's pair check (a draft sweep checks each candidate)
        if choice == "draft":
            candidates, checks = _draft_candidates(target)
            draft, check_ok = (candidates[0] if candidates else ""), True
            check_message: str | None = ""
        else:
            _seed("draft")
            trained = _trained_drafts()
            shipped = {name: f"{name} (shipped)" for name in zoo.DEMO_DRAFTS}
            choices = {**shipped, **trained}
            st.selectbox(
                "Shipped and trained drafts",
                [None, *choices],
                key="draft_pick",
                on_change=_pick_draft,
                format_func=lambda v: "pick one to use it as the draft" if v is None else choices[v],
                help="the drafts shipped with DraftLab and those Train a draft jobs wrote; choosing one "
                "fills in Draft model",
            )
            draft = st.text_input("Draft model", key="draft", persist_state="page", help=zoo.model_help("draft"))
            unfound = _model_error(draft) or unfound
            check = _pair_check(target, draft) if not unfound else None  # nothing to load: said under the field
            if check is not None:
                _show_check(check)
            check_ok, check_message = (check.ok, check.message) if check is not None else (False, unfound)
        drafter = "model" if choice == "drafter" else _drafter_choice(candidates if choice == "draft" else [draft])
        st.subheader("Prompts")
        prompts, prompt_error, prompt_texts = _prompt_source()
        if prompt_error:
            st.error(md_text(prompt_error), icon=":material/error:")
        elif check is not None and check.ok and check.vocab == "intersection" and prompts:
            _vocab_warning(target, draft, prompts, prompt_texts)
    with right:
        st.subheader("Sampling")
        for key in ("temperature", "top_k", "top_p", "seed", "max_new_tokens", "device", "dtype"):
            _seed(key)
        fixed = {}  # each sampling setting's one value (engine/config/variables.py: title, step, help)
        problems = []  # each field's own, shown under it as it is typed
        for column, setting in zip(st.columns(3), ("temperature", "top_k", "top_p")):
            v = VARIABLES[setting]
            fixed[setting] = column.number_input(v.title, step=v.step, key=setting, help=v.help.split(";")[0])
            problems.append(_number_error(setting, fixed[setting], column))
        for setting in EXTRA_FIELDS:
            _seed(setting)
            v = VARIABLES[setting]
            fixed[setting] = st.number_input(v.title, step=v.step, key=setting, help=v.help.split(";")[0])
            problems.append(_number_error(setting, fixed[setting]))
        temperature, top_k, top_p = fixed["temperature"], fixed["top_k"], fixed["top_p"]
        _seed("batch_size")
        unused = batch_size_unused(choice, st.session_state.get("grid_batch_sizes", ""))
        fixed["batch_size"] = st.number_input(
            VARIABLES["batch_size"].title,
            step=1,
            key="batch_size",
            disabled=unused is not None,
            help=unused or VARIABLES["batch_size"].help.split(";")[0],
        )
        if unused is None:
            problems.append(_number_error("batch_size", fixed["batch_size"]))
        c1, c2 = st.columns(2)
        seed = c1.number_input(SETTINGS["seed"].title, step=1, key="seed", help=SETTINGS["seed"].meaning)
        problems.append(_number_error("seed", seed, c1))
        max_new_tokens = c2.number_input(
            SETTINGS["max_new_tokens"].title,
            step=16,
            key="max_new_tokens",
            help=f"{SETTINGS['max_new_tokens'].meaning} (the cap: ${LIMITS['max_new_tokens'].env})",
        )
        problems.append(_number_error("max_new_tokens", max_new_tokens, c2))
        c1, c2 = st.columns(2)
        device = c1.selectbox("Device", DEVICES, key="device")
        dtype = c2.selectbox("Dtype", DTYPES, key="dtype")
        st.subheader("Sweep")
        c1, c2 = st.columns([1, 2])
        choice = c1.selectbox(
            "Swept variable",
            SWEEP_CHOICES,
            key="sweep_variable",
            help="one variable at a time",
            format_func=lambda c: SWEEP_LABELS.get(c, c),
        )
        sweep_variable, sweep_text, sweep_list, sweep_error = ("k" if choice == AUTO_K else choice), "", None, None
        k, k_auto = 4, None
        if choice == AUTO_K:
            _seed("k_auto")
            k_auto = c2.number_input(
                "Largest k",
                step=1,
                key="k_auto",
                persist_state="page",
                help="this k is measured first; from it and the target's verify cost the "
                "speedup of every smaller k is predicted, then the 3 best predicted are "
                "measured against a fresh baseline to confirm",
            )
            problems.append(k_auto_error(k_auto))
            if problems[-1]:
                c2.error(problems[-1], icon=":material/error:")
        elif choice in NUMERIC_SWEEPS:
            _seed("sweep_values")
            sweep_text = c2.text_input(
                f"{sweep_variable} values",
                key="sweep_values",
                persist_state="page",
                help="comma-separated; one speculative run each",
            )
            try:
                parse_sweep_values(sweep_text, sweep_variable)  # validate()'s parse, said under the field
            except ValueError as exc:
                c2.error(md_text(str(exc)), icon=":material/error:")
                problems.append(str(exc))
        elif choice == "draft":
            c2.caption(
                "One speculative run per draft candidate (listed under Models), k fixed below, all against "
                "one target-only baseline."
            )
            sweep_list = candidates
        elif choice == "drafter":
            with c2:
                sweep_list, sweep_error = _drafter_sweep()
            if sweep_error:
                st.error(md_text(sweep_error), icon=":material/error:")
        elif choice == "draft_sampling":
            c2.caption(
                "One speculative run drafting from the draft's distribution and one proposing its argmax "
                "(verified as a point mass: what a server that drafts by argmax sees), one shared baseline."
            )
            sweep_list = list(DRAFT_SAMPLING)
        elif choice in CHOICE_FIELDS:
            c2.caption(
                f"One speculative run per {VARIABLES[choice].name.replace('_', ' ')}: "
                + ", ".join(VARIABLES[choice].choices)
            )
            sweep_list = list(VARIABLES[choice].choices)
        grid_text = ""
        if choice != "batch_size":  # a grid: the sweep (or k auto's prediction) at each of several batch sizes
            _seed("grid_batch_sizes")
            grid_text = st.text_input(
                "At batch sizes (optional: a grid)",
                key="grid_batch_sizes",
                persist_state="page",
                placeholder="e.g. 1,4,16",
                help=GRID_HELP,
            )
            grid_problem = parse_grid(grid_text)[1]
            if grid_problem:
                st.error(md_text(grid_problem), icon=":material/error:")
                problems.append(grid_problem)
        draft_sampling = "probabilistic"
        if choice != "draft_sampling":
            _seed("draft_sampling")
            draft_sampling = st.selectbox(
                "Draft sampling",
                DRAFT_SAMPLING,
                key="draft_sampling",
                persist_state="page",
                help=VARIABLES["draft_sampling"].help,
            )
        named = {}  # CHOICE_FIELDS: each not swept is one choice for every run
        for setting in CHOICE_FIELDS:
            if choice != setting:
                _seed(WIDGETS[setting])
                named[setting] = st.selectbox(
                    VARIABLES[setting].name.replace("_", " ").capitalize(),
                    VARIABLES[setting].choices,
                    key=WIDGETS[setting],
                    persist_state="page",
                    help=VARIABLES[setting].help,
                )
        if sweep_variable != "k":
            _seed("fixed_k")
            k = st.number_input(
                "k (fixed)" if choice != "drafter" else "k (fixed; heuristic: its starting k)",
                step=1,
                key="fixed_k",
                persist_state="page",
            )
            problems.append(_number_error("k", k))
        _seed("repeats")
        repeats = st.number_input(
            "Repeats",
            step=1,
            key="repeats",
            help="each prompt is decoded this many times per configuration (the baseline and "
            "every swept value, interleaved), and the median time is used; more repeats narrow "
            "the speedup's 95 % interval on a noisy machine",
        )
        problems.append(_number_error("repeats", repeats))
        if any(problems):  # an estimate of what Launch refuses would be no figure at all (-2,100 tokens)
            st.caption("No estimate of the work while a field above is wrong.")
        else:
            _workload(
                prompts,
                prompt_texts,
                target,
                sweep_variable,
                sweep_text,
                sweep_list,
                k_auto,
                int(max_new_tokens),
                int(repeats),
                batch_sizes_of(grid_text, int(fixed["batch_size"])),
            )
    st.subheader("Label")
    for key in ("name", "tags", "notes"):
        _seed(key)
    c1, c2 = st.columns([1, 1])
    name = c1.text_input("Name", key="name", placeholder="defaults to draft → target on prompts")
    tags_text = c2.text_input("Tags", key="tags", placeholder="comma-separated, e.g. baseline, code")
    notes = st.text_area("Notes", key="notes", height=80)

    if st.button("Launch", type="primary", key="launch", icon=":material/rocket_launch:"):
        launch = validate(
            target=target,
            draft=draft,
            pair_ok=check_ok,
            pair_message=check_message,
            prompts=prompts,
            prompt_error=prompt_error,
            temperature=float(temperature),
            top_k=int(top_k),
            top_p=float(top_p),
            seed=int(seed),
            max_new_tokens=int(max_new_tokens),
            device=device,
            dtype=dtype,
            sweep_variable=sweep_variable,
            sweep_text=sweep_text,
            k=int(k),
            name=name,
            notes=notes,
            tags_text=tags_text,
            prompt_texts=prompt_texts,
            repeats=int(repeats),
            k_auto=int(k_auto) if k_auto is not None else None,
            drafter=drafter,
            sweep_list=sweep_list,
            sweep_error=sweep_error,
            pair_checks=checks,
            draft_sampling=draft_sampling,
            batch_size=int(fixed["batch_size"]),
            grid_text=grid_text,
            prompt_count=_prompt_count(prompts, prompt_texts),
            **{setting: fixed[setting] for setting in EXTRA_FIELDS},
            **named,
        )
        if launch.errors:
            st.error("Not launched:\n" + "\n".join(f"- {md_text(e)}" for e in launch.errors), icon=":material/error:")
            return
        from pages.widgets.access import launcher

        launch.kwargs["launched_by"] = launcher()
        first = recent_duplicate(store(), launch.kwargs)
        if first is not None:  # Launch pressed twice: link to the first instead of queuing a copy
            st.info(
                f"Experiment #{first} with exactly these settings was queued less than "
                f"{DUPLICATE_WINDOW_SECONDS // 60} minutes ago; not queuing a copy.",
                icon=":material/content_copy:",
            )
            st.page_link(
                nav_page("experiment"),
                label=f"Open experiment #{first}",
                query_params={"experiment": str(first)},
                icon=":material/monitoring:",
            )
            return
        try:
            experiment_id = enqueue_experiment(store(), **launch.kwargs)
        except QueueError as exc:
            st.error(f"Not launched: {md_text(exc)}", icon=":material/error:")
            return
        kw = launch.kwargs
        values = md_text(", ".join(_format(v) for v in kw["sweep_values"]))
        plan = (
            f"a baseline and k = {values}; the best predicted k values are measured when it finishes"
            if k_auto is not None
            else f"a baseline and {plural(len(kw['sweep_values']), 'run')} ({kw['sweep_variable']} = {values})"
        )
        if kw["drafter"] != "model" and kw["sweep_variable"] != "drafter":
            plan += f", drafter {md_text(kw['drafter'])}"
        if kw.get("batch_sizes"):
            plan += f", at batch sizes {', '.join(str(b) for b in kw['batch_sizes'])} (each with its own baseline)"
        st.success(
            f"Experiment #{experiment_id} queued: {plan}, {plural(kw['repeats'], 'repeat')} per prompt.",
            icon=":material/rocket_launch:",
        )
        st.page_link(
            nav_page("experiment"),
            label=f"Open experiment #{experiment_id}",
            query_params={"experiment": str(experiment_id)},
            icon=":material/monitoring:",
        )
        st.page_link(nav_page("experiments"), label="Watch progress on Experiments", icon=":material/list:")
