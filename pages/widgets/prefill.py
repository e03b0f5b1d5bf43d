"""The New-experiment form's link parameters (`new?target=...&sweep=k&values=1,2`), parsed strictly, and the
swept variables and drafter specs the form offers, from their one description (engine/config/variables.py and
engine/config/drafter_specs.py: plain Python, no torch).

    values, notes = parse_prefill(params, prompt_sets)  # widget key -> value; one short note per ignored parameter

Plain Python, no streamlit: the page puts `values` into its widgets on the first draw and shows `notes` as a
caption (escaped with md_text). The parameters are those storage/analysis/findings/links.py's prefill_query() writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from engine.config.drafter_specs import SPECS, parse_drafter
from engine.config.run_config import DEVICES, DTYPES, PARAMETERS, URL_KEYS, RunConfig
from engine.config.run_config import exact_text as _exact
from engine.config.variables import MAX_K, VARIABLES, Variable
from engine.errors import DraftLabError
from engine.numbers import ascii_float, ascii_int

# --- what the form offers ---------------------------------------------------------------------------------------
# Swept variables and drafters are described once, in engine/config/variables.py and engine/config/drafter_specs.py
# (torch-free); the form's choices, bounds and parsers below are read from those descriptions.

NUMERIC_SWEEPS = tuple(name for name, v in VARIABLES.items() if not v.categorical)
AUTO_K = "k: auto (predict, then confirm)"  # `--k auto`: one more choice of what to vary
SWEEP_CHOICES = ("k", AUTO_K, *(name for name in VARIABLES if name != "k"))
SWEEP_LABELS = {name: v.choice for name, v in VARIABLES.items() if v.label}
URL_SWEEPS = {"auto": AUTO_K, **{name: name for name in VARIABLES}}  # the link's `sweep=` -> the selectbox's option
INTEGER_VARIABLES = tuple(name for name, v in VARIABLES.items() if v.kind is int)
DEFAULT_SWEEP = "1,2,3,4,6,8"
MAX_NOTES = 4000  # characters of notes from a link

DRAFTER_KINDS = tuple(SPECS)
DRAFTER_SUMMARY = {name: f"{spec.usage}: {spec.summary}" for name, spec in SPECS.items()}
DRAFTER_PARAMETERS = {name: spec.parameter for name, spec in SPECS.items() if spec.parameter}
# Each drafter's parameter has a field for the one drafter every run uses and one listing a sweep's values, both
# keyed from the declaration (engine/config/drafter_specs.py), never a drafter's name: a new drafter's parameter gets
# them.
DRAFTER_WIDGETS = {name: f"drafter_param_{name}" for name in DRAFTER_PARAMETERS}
DRAFTER_SWEEP_WIDGETS = {name: f"drafter_sweep_param_{name}" for name in DRAFTER_PARAMETERS}
# A drafter sweep compares every drafter that runs on the pair's draft model or none (a hidden-state drafter needs a
# head of its own as the draft).
DEFAULT_DRAFTER_SWEEP = [name for name, spec in SPECS.items() if spec.default_sweep and not spec.needs_hidden_states]


def parse_drafter_spec(spec) -> tuple[str, int | float | None]:
    """(name, parameter) of a drafter spec, as the engine reads it; a ValueError names the problem and the fix."""
    try:
        return parse_drafter(spec)
    except DraftLabError as exc:
        raise ValueError(str(exc)) from None


def canonical_drafter(spec) -> str:
    """One spelling per drafter ("confidence: 0.50" -> "confidence:0.5"); a ValueError names a bad spec."""
    name, value = parse_drafter_spec(spec)
    return SPECS[name].spec(value)


def drafter_spec(name: str, value=None) -> str:
    return SPECS[name].spec(value) if name in SPECS else name


# --- model names ------------------------------------------------------------------------------------------------


def check_model_name(text) -> str:
    """A model name as the form takes it (stripped), or a ValueError: empty, too long, a control character, or a
    comma (experiments store a draft sweep's names comma-separated)."""
    name = str(text).strip()
    if not name:
        raise ValueError("a model name is empty")
    if "," in name:
        raise ValueError(f"model name {name[:60]!r} holds a comma; give one name per entry")
    try:
        return str(VARIABLES["draft"].parse(name, form=True))
    except DraftLabError as exc:
        raise ValueError(str(exc)) from None


# --- sweep values -----------------------------------------------------------------------------------------------


def parse_sweep_values(text: str, variable: str = "k") -> list:
    """Numeric `1,2,4` → [1, 2, 4] (sorted); a draft or drafter list `a, b` → ['a', 'b'] (in the given order,
    drafter specs canonical). Raises ValueError naming the bad entry and the fix in the form's words (engine/
    variables.py's parser with form=True: `k value '0' is not …; enter e.g. 1,2,4,8`, never a CLI flag)."""
    v = VARIABLES[variable]
    if v.categorical:
        return parse_names(str(text or "").split(","), variable)
    parts = [p.strip() for p in re.split(r"[,\s]+", text or "") if p.strip()]
    if not parts:
        raise ValueError(f"give at least one {variable} value, e.g. {DEFAULT_SWEEP if variable == 'k' else v.example}")
    try:
        return v.parse_list(parts, form=True)  # worded for the form, not the CLI
    except DraftLabError as exc:
        raise ValueError(str(exc)) from None


def parse_names(items: Iterable[str], variable: str) -> list[str]:
    """The draft names or drafter specs of a categorical sweep, in order: at least one, each valid, none twice."""
    what = "draft" if variable == "draft" else "drafter"
    values: list[str] = []
    for item in items:
        if not str(item).strip():
            continue
        if variable == "draft":
            value = check_model_name(item)
        elif variable == "drafter":
            value = canonical_drafter(item)
        else:  # another categorical variable (draft sampling): its own description parses it
            try:
                value = str(VARIABLES[variable].parse(item, form=True))  # a categorical variable's name
            except DraftLabError as exc:
                raise ValueError(str(exc)) from None
        if value in values:
            raise ValueError(f"{what} {value[:60]!r} is listed twice; list each once")
        values.append(value)
    if not values:
        raise ValueError(
            "give at least one draft to compare, e.g. demo-draft"
            if variable == "draft"
            else "give at least one drafter to compare, e.g. model and prompt-lookup:3"
            if variable == "drafter"
            else f"give at least one {variable} value, e.g. {VARIABLES[variable].example}"
        )
    return values


def drafter_specs(kinds: Iterable[str], listed: dict[str, str]) -> list[str]:
    """The drafter sweep's specs from the form: each chosen kind, once per value listed for its parameter
    (`listed`: drafter name -> its comma-separated values, e.g. T for confidence). A kind whose parameter has a
    default may list none (its bare name, the default). Raises ValueError naming a bad value."""
    specs = []
    for kind in kinds:
        param = DRAFTER_PARAMETERS.get(kind)
        if param is not None:
            items = [p.strip() for p in str(listed.get(kind) or "").split(",") if p.strip()]
            if not items and SPECS[kind].default_parameter:
                specs.append(kind)  # no value listed: the bare name, its parameter's default
                continue
            if not items:
                raise ValueError(f"{kind} needs {param.meaning}; list one or more, e.g. {param.example.split(':')[1]}")
            specs += [f"{kind}:{item}" for item in items]
        else:
            specs.append(kind)
    return parse_names(specs, "drafter")


def split_drafter_specs(specs: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """The inverse of drafter_specs: (kinds in registry order, {name: its listed parameter values}) of canonical
    specs (a name listed only bare lists none)."""
    kinds: list[str] = []
    params: dict[str, list[str]] = {name: [] for name in DRAFTER_PARAMETERS}
    for spec in specs:
        name, value = parse_drafter_spec(spec)
        if name not in kinds:
            kinds.append(name)
        if value is not None and spec.strip() != name:
            params[name].append(f"{value!r}")
    kinds = [k for k in DRAFTER_KINDS if k in kinds]
    return kinds, {name: ",".join(values) for name, values in params.items() if values}


# --- link parameters --------------------------------------------------------------------------------------------

# Each described parameter's widget on the form (engine/config/run_config.py's PARAMETERS): its own name, except k,
# whose field is the fixed k of a sweep over something else. The link's numeric parameters are read by their
# descriptions (VARIABLES, and SETTINGS: seed, max new tokens, repeats, with engine/config/limits.py's caps); k auto's
# largest k is the form's own.
WIDGETS = {name: "fixed_k" if name == "k" else name for name in PARAMETERS}


class _Bounded(NamedTuple):
    kind: type
    low: float
    high: float
    meaning: str


NUMBERS: dict[str, tuple[str, Variable | _Bounded]] = {
    **{name: (WIDGETS[name], v) for name, v in PARAMETERS.items() if not v.categorical},
    "k_auto": ("k_auto", _Bounded(int, 2, MAX_K, f"a whole number from 2 to {MAX_K}")),
}
NAMED = tuple(name for name, v in VARIABLES.items() if v.categorical and name not in ("draft", "drafter"))
KNOWN = (*URL_KEYS, "notes", *PARAMETERS)


def _shown(value) -> str:
    text = str(value)
    return repr(text if len(text) <= 40 else text[:40] + "…")


def parse_prefill(
    params: Mapping[str, str | list[str]], prompt_sets: Iterable[str], default_split: str = "tune"
) -> tuple[dict, list[str]]:
    """(widget key -> value, notes) from a link's query parameters. A parameter given twice, unknown, or with a
    bad value is left out, with a note saying what was ignored and why; nothing here raises."""
    values: dict = {}
    notes: list[str] = []
    raw: dict[str, str] = {}
    for key, value in params.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        if key not in KNOWN:
            notes.append(f"{_shown(key)} is not a field of this form")
        elif len(items) != 1:
            notes.append(f"{key} is given {len(items)} times")
        else:
            raw[key] = str(items[0])

    def bad(key: str, why: str) -> None:
        notes.append(f"{key}={_shown(raw[key])}: {why}")

    for key in ("target", "draft"):
        if key in raw:
            try:
                values[key] = check_model_name(raw[key])
            except ValueError as exc:
                if not (key == "draft" and raw.get("sweep") == "draft" and "," in raw[key]):
                    bad(key, str(exc))  # a draft sweep's experiment stores its drafts as `a,b`: candidates below
    if "prompts" in raw:
        sets = list(prompt_sets)
        spec = raw["prompts"].strip()
        spec = spec if ":" in spec else f"{spec}:{default_split}"
        if spec in sets:
            values["prompt_source"], values["prompt_set"] = "Built-in", spec
        else:
            bad("prompts", "not a built-in prompt set (upload a file instead)")
    for key, (widget, setting) in NUMBERS.items():
        if key in raw:
            number = ascii_int(raw[key]) if setting.kind is int else ascii_float(raw[key])
            ok = number is not None and (
                setting.in_range(number) if isinstance(setting, Variable) else setting.low <= number <= setting.high
            )
            if ok:
                values[widget] = number
            else:
                bad(key, f"not {setting.meaning}")
    for key, options in (("device", DEVICES), ("dtype", DTYPES)):
        if key in raw:
            if raw[key].strip() in options:
                values[key] = raw[key].strip()
            else:
                bad(key, f"not one of {', '.join(options)}")
    for key in NAMED:  # another named variable (draft sampling): its own description parses it
        if key in raw:
            try:
                values[WIDGETS[key]] = VARIABLES[key].parse(raw[key], form=True)
            except DraftLabError as exc:
                bad(key, str(exc))
    if "notes" in raw:
        text = raw["notes"].replace("\r\n", "\n")
        if len(text) > MAX_NOTES:
            bad("notes", f"longer than {MAX_NOTES} characters")
        elif re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text):
            bad("notes", "holds a control character")
        else:
            values["notes"] = text
    if "drafter" in raw:
        try:
            name, parameter = parse_drafter_spec(raw["drafter"])
        except ValueError as exc:
            bad("drafter", str(exc))
        else:
            values["drafter"] = name
            if name in DRAFTER_WIDGETS:
                values[DRAFTER_WIDGETS[name]] = parameter

    sweep = None
    if "sweep" in raw:
        sweep = URL_SWEEPS.get(raw["sweep"].strip())
        if sweep is None:
            bad("sweep", f"not one of {', '.join(URL_SWEEPS)}")
        else:
            values["sweep_variable"] = sweep
    variable = sweep or "k"
    listed = raw.get("values")
    if listed is None and variable == "draft" and "," in raw.get("draft", ""):
        listed = raw["draft"]
    if listed is not None and variable == AUTO_K:
        notes.append("values: ignored for k auto (it picks the k values itself; see the largest k)")
    elif listed is not None:
        try:
            parsed = parse_sweep_values(listed, variable)
        except ValueError as exc:
            notes.append(f"values={_shown(listed)}: {exc}")
        else:
            if variable == "draft":
                values["draft_candidates"] = parsed
            elif variable == "drafter":
                kinds, by_name = split_drafter_specs(parsed)
                values["drafter_sweep"] = kinds
                values.update({DRAFTER_SWEEP_WIDGETS[name]: text for name, text in by_name.items()})
            elif variable in NAMED:  # the form compares every value of a named variable (draft sampling)
                if parsed != list(VARIABLES[variable].parse_list(VARIABLES[variable].example)):
                    notes.append(f"values={_shown(listed)}: the form compares {VARIABLES[variable].example}")
            else:
                values["sweep_values"] = ",".join(_exact(VARIABLES[variable], v) for v in parsed)
    if "batch_sizes" in raw:  # a grid: the sweep at each of these batch sizes (the form's "at batch sizes")
        if variable == "batch_size":
            notes.append(
                "batch_sizes: ignored when sweeping batch size (a grid sweeps another variable at each batch size)"
            )
        else:
            try:
                sizes = parse_sweep_values(raw["batch_sizes"], "batch_size")
            except ValueError as exc:
                bad("batch_sizes", str(exc))
            else:
                if len(sizes) < 2:
                    bad("batch_sizes", "a grid lists two or more batch sizes")
                else:
                    values["grid_batch_sizes"] = ",".join(str(v) for v in sizes)
    return values, notes


# --- the form and a run configuration, both ways -----------------------------------------------------------------


def _prompt_spec(spec: str, default_split: str = "tune") -> str:
    spec = str(spec).strip()
    return spec if ":" in spec else f"{spec}:{default_split}"


def form_values(cfg: RunConfig, default_split: str = "tune") -> dict:
    """The form's widget values that show `cfg` (widget key -> value): what a link to it fills in
    (`parse_prefill(cfg.to_url(), ...)` gives exactly these for a built-in prompt set), and what form_config reads
    back. A drafter parameter the form has no field for (suffix's depth) is its default there."""
    values: dict[str, Any] = {
        "target": cfg.target,
        "device": cfg.device,
        "dtype": cfg.dtype,
        "prompt_source": "Built-in",
        "prompt_set": _prompt_spec(cfg.prompts, default_split),
    }
    for name, value in cfg.settings:
        if name == cfg.sweep or (name == "draft" and value == "") or (name == "batch_size" and cfg.batch_sizes):
            continue
        if name == "drafter" and cfg.drafters:
            continue  # each draft its own (a head eagle3, a causal LM model): the form's Drafter field gives way
        if name == "drafter":
            kind, parameter = parse_drafter(value)
            values["drafter"] = kind
            if kind in DRAFTER_WIDGETS:
                values[DRAFTER_WIDGETS[kind]] = parameter
        else:
            values[WIDGETS[name]] = value
    if cfg.k_auto is not None:
        values.update(sweep_variable=AUTO_K, k_auto=cfg.k_auto)
    else:
        values["sweep_variable"] = cfg.sweep
        if cfg.sweep == "draft":
            values["draft_candidates"] = list(cfg.values)
        elif cfg.sweep == "drafter":
            kinds, listed = split_drafter_specs(cfg.values)
            values["drafter_sweep"] = kinds
            values.update({DRAFTER_SWEEP_WIDGETS[name]: text for name, text in listed.items()})
        elif cfg.sweep not in NAMED:
            values["sweep_values"] = ",".join(_exact(cfg.swept, v) for v in cfg.values)
    if cfg.batch_sizes:
        values["grid_batch_sizes"] = ",".join(str(b) for b in cfg.batch_sizes)
    return values


def form_config(values: dict, prompts: str) -> RunConfig:
    """The run configuration the form's widget values describe: what Launch queues (pages/widgets/form_checks.py's
    validate). `sweep_list`, when given, is a named sweep's values as checked on the page (drafts each pair-checked,
    drafter specs built from their fields); `drafter_spec` the fixed drafter as one spec. A DraftLabError (or the
    ValueError of a drafter field) names the problem in the form's words."""
    choice = values.get("sweep_variable") or "k"
    k_auto = values.get("k_auto") if choice == AUTO_K else None
    sweep = "k" if choice == AUTO_K else choice
    given = {name: values[WIDGETS[name]] for name in PARAMETERS if name != "drafter" and WIDGETS[name] in values}
    kind = values.get("drafter")
    given["drafter"] = values.get("drafter_spec") or (
        drafter_spec(kind, values.get(DRAFTER_WIDGETS[kind]) if kind in DRAFTER_WIDGETS else None) if kind else None
    )
    listed = values.get("sweep_list")
    if k_auto is not None:
        listed = None
    elif listed is None and sweep == "draft":
        listed = parse_names(values.get("draft_candidates") or [], "draft")
    elif listed is None and sweep == "drafter":
        listed = drafter_specs(
            values.get("drafter_sweep") or [],
            {name: values.get(key, "") for name, key in DRAFTER_SWEEP_WIDGETS.items()},
        )
    elif listed is None and sweep in NAMED:
        listed = VARIABLES[sweep].parse_list(VARIABLES[sweep].example)  # the form compares every value
    elif listed is None:
        listed = parse_sweep_values(values.get("sweep_values", ""), sweep)
    return RunConfig.make(
        target=values.get("target", ""),
        prompts=prompts,
        sweep=sweep,
        values=listed,
        k_auto=k_auto,
        batch_sizes=values.get("grid_batch_sizes") or None,
        device=values.get("device", "auto"),
        dtype=values.get("dtype", "auto"),
        form=True,
        **given,
    )


# --- text shown through markdown --------------------------------------------------------------------------------

_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>#|~$&])")
_JOINER = "\u2060"  # an invisible word joiner


def md_text(value) -> str:
    """User text shown literally inside st.markdown / st.caption / st.error: one line, every character that
    formats backslash-escaped, and a word joiner after ':' (no `:emoji:`, `:red[...]` or `https://` autolink),
    after '@' (no e-mail autolink) and inside 'www.' (no www autolink)."""
    flat = " ".join(str(value).split())
    escaped = _MARKDOWN.sub(r"\\\1", flat)
    for mark in (":", "@"):
        escaped = escaped.replace(mark, mark + _JOINER)
    return re.sub(r"(?i)(www)\.", lambda m: m.group(1) + _JOINER + ".", escaped)
