"""One variable at a time: which of `draftlab run`'s options is swept, and with which values.

The article's rule for tuning a draft: change one variable per sweep, so a difference in speedup has one
cause. `--k`, `--temperature`, `--top-k`, `--top-p`, `--draft` and `--drafter` each take one value or a
comma-separated list; at most one of them may be a list.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import DraftLabError

AUTO_K_MAX = 8
# option name -> (sweep variable, parser of one value, example)
OPTIONS = {
    "k": ("k", int, "--k 1,2,4,8"),
    "temperature": ("temperature", float, "--temperature 0,0.7,1"),
    "top_k": ("top_k", int, "--top-k 0,20,50"),
    "top_p": ("top_p", float, "--top-p 0.8,0.95,1"),
    "draft": ("draft", str, "--draft demo-draft,path/to/other"),
    "drafter": ("drafter", str, "--drafter model,heuristic,prompt-lookup:3"),
}


@dataclass(frozen=True)
class Sweep:
    variable: str  # k, temperature, top_k, top_p, draft or drafter
    values: list  # the swept values (one value: a single configuration)
    fixed: dict  # the other five options' single values
    k_auto: int | None = None  # `--k auto[:K]`: predict, then confirm up to K

    @property
    def ks(self) -> list[int]:
        return [int(v) for v in self.values] if self.variable == "k" else [int(self.fixed["k"])]

    @property
    def drafts(self) -> list[str]:
        return list(self.values) if self.variable == "draft" else [self.fixed["draft"]]

    @property
    def drafters(self) -> list[str]:
        return list(self.values) if self.variable == "drafter" else [self.fixed["drafter"]]


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _values(option: str, text) -> list:
    _, parse, example = OPTIONS[option]
    items = [v.strip() for v in str(text).split(",")]
    if not items or any(not v for v in items):
        raise DraftLabError(f"{_flag(option)} {text!r} has an empty value; use e.g. {example}")
    try:
        values = [parse(v) for v in items]
    except ValueError:
        raise DraftLabError(f"{_flag(option)} takes {parse.__name__} values like {example.split(' ', 1)[1]} "
                            f"(got {text!r}); list one value or several separated by commas") from None
    if len(set(values)) < len(values):
        raise DraftLabError(f"{_flag(option)} lists a value twice ({text!r}); list each value once")
    if option == "k" and any(v <= 0 for v in values):
        raise DraftLabError(f"--k values must be >= 1 (got {text!r}); use e.g. --k 4 or --k 1,2,4,8")
    return values


def parse_sweep(options: dict) -> Sweep:
    """options: {k, temperature, top_k, top_p, draft, drafter} as given on the command line (strings)."""
    k_text = str(options["k"]).strip().lower()
    k_auto = None
    if k_text == "auto" or k_text.startswith("auto:"):
        try:
            k_auto = int(k_text.split(":", 1)[1]) if ":" in k_text else AUTO_K_MAX
        except ValueError:
            raise DraftLabError(f"--k auto takes a largest k like auto:8 (got {options['k']!r})") from None
        if k_auto < 2:
            raise DraftLabError(f"--k auto needs a largest k of at least 2 (got {options['k']!r}); use e.g. --k auto:8")
    parsed = {name: ([k_auto] if name == "k" and k_auto else _values(name, text)) for name, text in options.items()}
    listed = [name for name, values in parsed.items() if len(values) > 1]
    if k_auto and listed:
        raise DraftLabError(f"--k auto sweeps k itself; give {', '.join(_flag(n) for n in listed)} one value")
    if len(listed) > 1:
        raise DraftLabError(f"sweep one variable at a time: {' and '.join(_flag(n) for n in listed)} both list values; "
                            f"keep the list in one of them and give the others one value")
    variable = listed[0] if listed else "k"
    fixed = {name: values[0] for name, values in parsed.items() if name != variable}
    return Sweep(variable, parsed[variable], fixed, k_auto)
