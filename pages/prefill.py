"""The New-experiment form's link parameters (`new?target=...&sweep=k&values=1,2`), parsed strictly, and the
drafter specs the form offers, checked without the engine (engine/drafting.py imports torch; pages must not).

    values, notes = parse_prefill(params, prompt_sets)  # widget key -> value; one short note per ignored parameter

Plain Python, no streamlit: the page puts `values` into its widgets on the first draw and shows `notes` as a
caption (escaped with md_text). The parameters are those storage/findings.py's prefill_query() writes.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Iterable, Mapping, NamedTuple

# --- what the form offers ---------------------------------------------------------------------------------------

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
NUMERIC_SWEEPS = ("k", "temperature", "top_k", "top_p")
AUTO_K = "k: auto (predict, then confirm)"  # `--k auto`: one more choice of what to vary
SWEEP_CHOICES = ("k", AUTO_K, "temperature", "top_k", "top_p", "draft", "drafter")
SWEEP_LABELS = {"draft": "draft (compare drafts)", "drafter": "drafter (drafting strategy)"}
URL_SWEEPS = {"k": "k", "auto": AUTO_K, "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
              "draft": "draft", "drafter": "drafter"}  # the link's `sweep=` -> the selectbox's option
INTEGER_VARIABLES = ("k", "top_k")
MAX_K = 64
DEFAULT_SWEEP = "1,2,3,4,6,8"
MAX_NAME = 300      # characters of a model name from a link
MAX_NOTES = 4000    # characters of notes from a link


# --- drafter specs (mirrors engine/drafting.py's registry; tests/test_prefill.py checks they agree) -------------

class DrafterParameter(NamedTuple):
    kind: type  # int or float
    meaning: str
    example: str
    valid: Callable[[float], bool]
    label: str  # the form's input for it


DRAFTER_KINDS = ("model", "heuristic", "confidence", "prompt-lookup")
DRAFTER_SUMMARY = {
    "model": "model: the draft model, a constant k per round",
    "heuristic": "heuristic: the draft model, k starts at k, +2 after a fully accepted round, else -1",
    "confidence": "confidence:T: the draft model, a round stops after a draft whose top probability < T",
    "prompt-lookup": "prompt-lookup:N: no draft model, the longest earlier n-gram (n ≤ N) proposes what followed",
}
DRAFTER_PARAMETERS = {
    "confidence": DrafterParameter(float, "a probability threshold T with 0 < T < 1", "confidence:0.5",
                                   lambda t: 0 < t < 1, "T"),
    "prompt-lookup": DrafterParameter(int, "the longest n-gram N to match, an integer >= 1", "prompt-lookup:3",
                                      lambda n: n >= 1, "N"),
}
DEFAULT_THRESHOLD, DEFAULT_NGRAM = 0.5, 3

_INT = re.compile(r"\+?[0-9]{1,9}")  # ASCII digits only: int() also takes '٣' and '³'-like digits
_FLOAT = re.compile(r"[+-]?(?:[0-9]{1,12}(?:\.[0-9]{0,12})?|\.[0-9]{1,12})(?:[eE][+-]?[0-9]{1,3})?")


def ascii_int(text) -> int | None:
    """An integer written with ASCII digits (an optional '+', surrounding spaces allowed), else None."""
    text = str(text).strip()
    return int(text) if _INT.fullmatch(text) else None


def ascii_float(text) -> float | None:
    """A finite decimal number written with ASCII characters (1, 0.5, .5, 1e-3), else None: no 'nan', 'inf',
    '1_0' or non-ASCII digits, which float() would take."""
    text = str(text).strip()
    if not _FLOAT.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def parse_drafter_spec(spec) -> tuple[str, int | float | None]:
    """(name, parameter) of `model`, `heuristic`, `confidence:T` or `prompt-lookup:N`, as engine.drafting's
    parse_drafter reads it (ASCII numbers only); a ValueError names the problem and the fix."""
    usage = "model, heuristic, confidence:T (0 < T < 1) or prompt-lookup:N (N >= 1)"
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty drafter; use {usage}")
    name, colon, raw = spec.strip().partition(":")
    name, raw = name.strip(), raw.strip()
    if name not in DRAFTER_KINDS:
        raise ValueError(f"unknown drafter {spec.strip()[:40]!r}; use {usage}")
    param = DRAFTER_PARAMETERS.get(name)
    if param is None:
        if colon:
            raise ValueError(f"drafter {name!r} takes no parameter (got {spec.strip()[:40]!r}); use {name}")
        return name, None
    if not raw:
        raise ValueError(f"drafter {name!r} needs {param.meaning} after a colon; use e.g. {param.example}")
    value = ascii_int(raw) if param.kind is int else ascii_float(raw)
    if value is None or not param.valid(value):
        raise ValueError(f"drafter {name!r}: {raw[:40]!r} is not {param.meaning}; use e.g. {param.example}")
    return name, value


def canonical_drafter(spec) -> str:
    """One spelling per drafter ("confidence: 0.50" -> "confidence:0.5"), as engine.drafting.canonical_drafter."""
    name, value = parse_drafter_spec(spec)
    return name if value is None else f"{name}:{value!r}"


def drafter_spec(name: str, value=None) -> str:
    return name if value is None or name not in DRAFTER_PARAMETERS else f"{name}:{value!r}"


# --- model names ------------------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_model_name(text) -> str:
    """A model name as the form takes it (stripped), or a ValueError: empty, too long, a control character, or a
    comma (experiments store a draft sweep's names comma-separated)."""
    name = str(text).strip()
    if not name:
        raise ValueError("a model name is empty")
    if len(name) > MAX_NAME:
        raise ValueError(f"a model name is longer than {MAX_NAME} characters")
    if _CONTROL.search(name):
        raise ValueError("a model name holds a control character")
    if "," in name:
        raise ValueError(f"model name {name[:60]!r} holds a comma; give one name per entry")
    return name


# --- sweep values -----------------------------------------------------------------------------------------------

def parse_sweep_values(text: str, variable: str = "k") -> list:
    """Numeric `1,2,4` → [1, 2, 4] (sorted); a draft or drafter list `a, b` → ['a', 'b'] (in the given order,
    drafter specs canonical). Raises ValueError naming the bad entry and the fix."""
    if variable in ("draft", "drafter"):
        return parse_names(str(text or "").split(","), variable)
    parts = [p.strip() for p in re.split(r"[,\s]+", text or "") if p.strip()]
    if not parts:
        raise ValueError(f"give at least one {variable} value, e.g. {DEFAULT_SWEEP}")
    values = []
    for part in parts:
        if variable in INTEGER_VARIABLES:
            low, high = (1, MAX_K) if variable == "k" else (0, 10**6)
            value = ascii_int(part)
            if value is None or not low <= value <= high:
                hint = f"from 1 to {MAX_K}; use e.g. {DEFAULT_SWEEP}" if variable == "k" else "≥ 0"
                raise ValueError(f"{variable} value {part[:40]!r} is not a whole number {hint}")
        else:
            value = ascii_float(part)
            if value is None:
                raise ValueError(f"{variable} value {part[:40]!r} is not a number")
            if variable == "temperature" and value < 0:
                raise ValueError(f"temperature value {part} is negative; 0 means greedy")
            if variable == "top_p" and not 0 < value <= 1:
                raise ValueError(f"top_p value {part} is outside (0, 1]")
        if value in values:
            raise ValueError(f"{variable} value {part} is listed twice; list each value once")
        values.append(value)
    return sorted(values)


def parse_names(items: Iterable[str], variable: str) -> list[str]:
    """The draft names or drafter specs of a categorical sweep, in order: at least one, each valid, none twice."""
    what = "draft" if variable == "draft" else "drafter"
    values: list[str] = []
    for item in items:
        if not str(item).strip():
            continue
        value = check_model_name(item) if variable == "draft" else canonical_drafter(item)
        if value in values:
            raise ValueError(f"{what} {value[:60]!r} is listed twice; list each once")
        values.append(value)
    if not values:
        raise ValueError("give at least one draft to compare, e.g. demo-draft" if variable == "draft" else
                         "give at least one drafter to compare, e.g. model and prompt-lookup:3")
    return values


def drafter_specs(kinds: Iterable[str], thresholds: str, ngrams: str) -> list[str]:
    """The drafter sweep's specs from the form: each chosen kind, once per listed T (confidence) or N
    (prompt-lookup). Raises ValueError naming a bad T or N."""
    specs = []
    for kind in kinds:
        if kind in DRAFTER_PARAMETERS:
            raw = thresholds if kind == "confidence" else ngrams
            items = [p.strip() for p in str(raw or "").split(",") if p.strip()]
            if not items:
                param = DRAFTER_PARAMETERS[kind]
                raise ValueError(f"{kind} needs {param.meaning}; list one or more, e.g. {param.example.split(':')[1]}")
            specs += [f"{kind}:{item}" for item in items]
        else:
            specs.append(kind)
    return parse_names(specs, "drafter")


def split_drafter_specs(specs: Iterable[str]) -> tuple[list[str], str | None, str | None]:
    """The inverse of drafter_specs: (kinds in registry order, T list, N list) of canonical specs."""
    kinds, params = [], {"confidence": [], "prompt-lookup": []}
    for spec in specs:
        name, value = parse_drafter_spec(spec)
        if name not in kinds:
            kinds.append(name)
        if value is not None:
            params[name].append(f"{value!r}")
    kinds = [k for k in DRAFTER_KINDS if k in kinds]
    return kinds, ",".join(params["confidence"]) or None, ",".join(params["prompt-lookup"]) or None


# --- link parameters --------------------------------------------------------------------------------------------

# The link's numeric parameters: (widget key, int or float, low, high, what a valid value is).
NUMBERS = {
    "temperature": ("temperature", float, 0.0, 100.0, "a number ≥ 0 (0 means greedy)"),
    "top_k": ("top_k", int, 0, 10**6, "a whole number ≥ 0 (0 turns it off)"),
    "top_p": ("top_p", float, 0.0, 1.0, "a number in (0, 1] (1 turns it off)"),
    "seed": ("seed", int, 0, 2**31 - 1, "a whole number ≥ 0"),
    "max_new_tokens": ("max_new_tokens", int, 1, 10**6, "a whole number ≥ 1"),
    "k": ("fixed_k", int, 1, MAX_K, f"a whole number from 1 to {MAX_K}"),
    "k_auto": ("k_auto", int, 2, MAX_K, f"a whole number from 2 to {MAX_K}"),
    "repeats": ("repeats", int, 1, 1000, "a whole number ≥ 1"),
}
KNOWN = ("target", "draft", "prompts", "device", "dtype", "sweep", "values", "notes", "drafter", *NUMBERS)


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
    for key, (widget, kind, low, high, meaning) in NUMBERS.items():
        if key in raw:
            number = ascii_int(raw[key]) if kind is int else ascii_float(raw[key])
            ok = number is not None and low <= number <= high and not (key == "top_p" and number == 0)
            if ok:
                values[widget] = number
            else:
                bad(key, f"not {meaning}")
    for key, options in (("device", DEVICES), ("dtype", DTYPES)):
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
