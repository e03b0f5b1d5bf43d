"""The New-experiment form's link parameters (`new?target=...&sweep=k&values=1,2`), parsed strictly, and the
swept variables and drafter specs the form offers, from their one description (engine/variables.py and
engine/drafter_specs.py: plain Python, no torch).

    values, notes = parse_prefill(params, prompt_sets)  # widget key -> value; one short note per ignored parameter

Plain Python, no streamlit: the page puts `values` into its widgets on the first draw and shows `notes` as a
caption (escaped with md_text). The parameters are those storage/findings.py's prefill_query() writes.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, NamedTuple

from engine.drafter_specs import DRAFT_SAMPLING, SPECS, parse_drafter
from engine.errors import DraftLabError
from engine.numbers import ascii_float, ascii_int
from engine.variables import MAX_K, SETTINGS, VARIABLES, Variable

# --- what the form offers ---------------------------------------------------------------------------------------
# Swept variables and drafters are described once, in engine/variables.py and engine/drafter_specs.py (torch-free);
# the form's choices, bounds and parsers below are read from those descriptions.

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
NUMERIC_SWEEPS = tuple(name for name, v in VARIABLES.items() if not v.categorical)
AUTO_K = "k: auto (predict, then confirm)"  # `--k auto`: one more choice of what to vary
SWEEP_CHOICES = ("k", AUTO_K, *(name for name in VARIABLES if name != "k"))
SWEEP_LABELS = {name: v.choice for name, v in VARIABLES.items() if v.label}
URL_SWEEPS = {"auto": AUTO_K, **{name: name for name in VARIABLES}}  # the link's `sweep=` -> the selectbox's option
INTEGER_VARIABLES = tuple(name for name, v in VARIABLES.items() if v.kind is int)
DEFAULT_SWEEP = "1,2,3,4,6,8"
MAX_NOTES = 4000    # characters of notes from a link

DRAFTER_KINDS = tuple(SPECS)
DRAFTER_SUMMARY = {name: f"{spec.usage}: {spec.summary}" for name, spec in SPECS.items()}
DRAFTER_PARAMETERS = {name: spec.parameter for name, spec in SPECS.items() if spec.parameter}
DEFAULT_THRESHOLD = SPECS["confidence"].parameter.default
DEFAULT_NGRAM = SPECS["prompt-lookup"].parameter.default


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
        return VARIABLES["draft"].parse(name, form=True)
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
                value = VARIABLES[variable].parse(item, form=True)
            except DraftLabError as exc:
                raise ValueError(str(exc)) from None
        if value in values:
            raise ValueError(f"{what} {value[:60]!r} is listed twice; list each once")
        values.append(value)
    if not values:
        raise ValueError("give at least one draft to compare, e.g. demo-draft" if variable == "draft" else
                         "give at least one drafter to compare, e.g. model and prompt-lookup:3" if variable == "drafter"
                         else f"give at least one {variable} value, e.g. {VARIABLES[variable].example}")
    return values


def drafter_specs(kinds: Iterable[str], thresholds: str, ngrams: str) -> list[str]:
    """The drafter sweep's specs from the form: each chosen kind, once per listed parameter value (T for
    confidence, N for prompt-lookup). Raises ValueError naming a bad T or N."""
    listed = {"confidence": thresholds, "prompt-lookup": ngrams}
    specs = []
    for kind in kinds:
        param = DRAFTER_PARAMETERS.get(kind)
        if param is not None:
            items = [p.strip() for p in str(listed.get(kind) or "").split(",") if p.strip()]
            if not items:
                raise ValueError(f"{kind} needs {param.meaning}; list one or more, e.g. {param.example.split(':')[1]}")
            specs += [f"{kind}:{item}" for item in items]
        else:
            specs.append(kind)
    return parse_names(specs, "drafter")


def split_drafter_specs(specs: Iterable[str]) -> tuple[list[str], str | None, str | None]:
    """The inverse of drafter_specs: (kinds in registry order, T list, N list) of canonical specs."""
    kinds, params = [], {name: [] for name in DRAFTER_PARAMETERS}
    for spec in specs:
        name, value = parse_drafter_spec(spec)
        if name not in kinds:
            kinds.append(name)
        if value is not None:
            params[name].append(f"{value!r}")
    kinds = [k for k in DRAFTER_KINDS if k in kinds]
    return kinds, ",".join(params["confidence"]) or None, ",".join(params["prompt-lookup"]) or None


# --- link parameters --------------------------------------------------------------------------------------------

# The link's numeric parameters: (widget key, the setting's description). The swept variables' bounds come from
# engine/variables.py (VARIABLES, and SETTINGS: seed, max new tokens, repeats, with engine/limits.py's caps);
# k auto's largest k is the form's own.
_Bounded = NamedTuple("_Bounded", [("kind", type), ("low", float), ("high", float), ("meaning", str)])
NUMBERS = {
    "temperature": ("temperature", VARIABLES["temperature"]),
    "top_k": ("top_k", VARIABLES["top_k"]),
    "top_p": ("top_p", VARIABLES["top_p"]),
    "seed": ("seed", SETTINGS["seed"]),
    "max_new_tokens": ("max_new_tokens", SETTINGS["max_new_tokens"]),
    "k": ("fixed_k", VARIABLES["k"]),
    "k_auto": ("k_auto", _Bounded(int, 2, MAX_K, f"a whole number from 2 to {MAX_K}")),
    "repeats": ("repeats", SETTINGS["repeats"]),
    "batch_size": ("batch_size", VARIABLES["batch_size"]),
}
KNOWN = ("target", "draft", "prompts", "device", "dtype", "sweep", "values", "notes", "drafter", "batch_sizes",
         "draft_sampling", *NUMBERS)


def _shown(value) -> str:
    text = str(value)
    return repr(text if len(text) <= 40 else text[:40] + "…")


def parse_prefill(params: Mapping[str, str | list[str]], prompt_sets: Iterable[str],
                  default_split: str = "tune") -> tuple[dict, list[str]]:
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
            ok = number is not None and (setting.in_range(number) if isinstance(setting, Variable)
                                         else setting.low <= number <= setting.high)
            if ok:
                values[widget] = number
            else:
                bad(key, f"not {setting.meaning}")
    for key, options in (("device", DEVICES), ("dtype", DTYPES), ("draft_sampling", DRAFT_SAMPLING)):
        if key in raw:
            if raw[key].strip() in options:
                values[key] = raw[key].strip()
            else:
                bad(key, f"not one of {', '.join(options)}")
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
            name, value = parse_drafter_spec(raw["drafter"])
        except ValueError as exc:
            bad("drafter", str(exc))
        else:
            values["drafter"] = name
            if name == "confidence":
                values["drafter_threshold"] = value
            elif name == "prompt-lookup":
                values["drafter_ngram"] = value

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
                kinds, thresholds, ngrams = split_drafter_specs(parsed)
                values["drafter_sweep"] = kinds
                if thresholds:
                    values["drafter_sweep_t"] = thresholds
                if ngrams:
                    values["drafter_sweep_n"] = ngrams
            else:
                values["sweep_values"] = ",".join(f"{v:g}" for v in parsed)
    if "batch_sizes" in raw:  # a grid: the sweep at each of these batch sizes (the form's "at batch sizes")
        if variable == "batch_size":
            notes.append("batch_sizes: ignored when sweeping batch size (a grid sweeps another variable at each "
                         "batch size)")
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
