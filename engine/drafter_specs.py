"""What each drafter spec means: the one description of the drafting strategies, read by the engine, the CLI, the
New-experiment form and its link prefill, the queue, the findings and the deploy mapping.

    model            the draft model, a constant k per round (Leviathan et al.)
    heuristic        the draft model; k starts at --k, +2 after a round whose drafts were all accepted, else -1
    confidence:T     the draft model; a round stops after the first draft whose top probability is below T
    prompt-lookup:N  no model: the continuation of the longest earlier n-gram (n <= N) ending the sequence
    suffix:D         no model: suffix decoding over suffix trees of depth D (`suffix` = `suffix:24`, vLLM's default)

A new drafter is its class in engine/drafting.py plus one entry in SPECS.
Plain Python, no torch: storage and pages import it. Numbers in a spec are ASCII (engine/numbers.py).

    parse_drafter("confidence:0.50") -> ("confidence", 0.5)
    canonical_drafter(" confidence:0.50 ") -> "confidence:0.5"
    needs_draft_model("prompt-lookup:3") -> False
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from .errors import DraftLabError
from .numbers import ascii_float, ascii_int


@dataclass(frozen=True)
class Parameter:
    """The one parameter a drafter's spec carries after the colon (`confidence:0.5`)."""

    kind: type  # int or float
    symbol: str  # its name in the usage text and the form: T, N
    meaning: str  # what it is and its range, for error messages
    example: str  # a valid spec
    low: float  # the range: low < value (low_open) or low <= value, value < high
    high: float
    low_open: bool = False
    default: float | int | None = None  # the form's starting value

    def valid(self, value) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and value < self.high

    def parse(self, raw: str):
        """The parameter from its text, or None when it is not a valid one."""
        value = ascii_int(raw) if self.kind is int else ascii_float(raw)
        return value if value is not None and self.valid(value) else None


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the spec's name before the colon
    implementation: str  # its class in engine/drafting.py
    summary: str  # one line: what it proposes
    parameter: Parameter | None = None
    needs_model: bool = True  # drafts with the draft model (False: a run loads none)
    constant_k: bool = True  # every round proposes k drafts (until the budget ends): the formula's assumption
    needs_hidden_states: bool = False  # drafts from the target's hidden states (EAGLE-style heads)
    default_parameter: bool = False  # the bare name is the spec with the parameter's default (`suffix` = `suffix:24`)

    @property
    def usage(self) -> str:
        """`model` or `confidence:T`."""
        return self.name if self.parameter is None else f"{self.name}:{self.parameter.symbol}"

    def spec(self, value=None) -> str:
        """The canonical spec string of this drafter with `value` as its parameter."""
        return self.name if self.parameter is None or value is None else f"{self.name}:{value!r}"


SPECS: dict[str, DrafterSpec] = {spec.name: spec for spec in (
    DrafterSpec("model", "ModelDrafter", "the draft model, a constant k per round"),
    DrafterSpec("heuristic", "HeuristicDrafter",
                "the draft model; k starts at k, +2 after a fully accepted round, -1 (min 1) otherwise (transformers)",
                constant_k=False),
    DrafterSpec("confidence", "ConfidenceDrafter",
                "the draft model; a round stops after a draft whose top probability is below T",
                Parameter(float, "T", "a probability threshold T with 0 < T < 1", "confidence:0.5", 0.0, 1.0,
                          low_open=True, default=0.5), constant_k=False),
    DrafterSpec("prompt-lookup", "PromptLookupDrafter",
                "no draft model; the continuation of the longest earlier n-gram (n ≤ N) that ends the sequence",
                Parameter(int, "N", "the longest n-gram N to match, an integer from 1 to 64", "prompt-lookup:3",
                          1, 65, default=3), needs_model=False, constant_k=False),
    DrafterSpec("suffix", "SuffixDrafter",
                "no draft model; the most frequent continuation of the longest match of the context in suffix trees "
                "of depth D over the prompt, the output and earlier responses (vLLM's suffix decoding)",
                Parameter(int, "D", "the suffix tree depth D, an integer from 1 to 64", "suffix:24", 1, 65, default=24),
                needs_model=False, constant_k=False, default_parameter=True),
)}
DEFAULT_DRAFTER = "model"
# How a draft model proposes (engine/drafting.py): draws from p_d, or its argmax verified as a point mass.
DRAFT_SAMPLING = ("probabilistic", "greedy")
DEFAULT_DRAFT_SAMPLING = "probabilistic"


def drafter_usage() -> str:
    """'model, heuristic, confidence:T (0 < T < 1), ...': every spec form, for help texts and error messages."""
    return ", ".join(spec.usage + (f" ({spec.parameter.meaning})" if spec.parameter else "") for spec in SPECS.values())


def parse_drafter(text) -> tuple[str, int | float | None]:
    """(name, parameter) of a drafter spec such as "model" or "confidence:0.5"; the parameter is None for a drafter
    that takes none. A DraftLabError names the problem and the fix on one line."""
    if not isinstance(text, str) or not text.strip():
        raise DraftLabError(f"empty drafter spec; use one of {drafter_usage()}")
    shown = text.strip()[:60]
    name, colon, raw = text.strip().partition(":")
    name, raw = name.strip(), raw.strip()
    spec = SPECS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, SPECS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise DraftLabError(f"unknown drafter {shown!r}; {hint}use one of {drafter_usage()}")
    param = spec.parameter
    if param is None:
        if colon:
            raise DraftLabError(f"drafter {name!r} takes no parameter (got {shown!r}); use {name}")
        return name, None
    if not raw and not colon and spec.default_parameter:
        return name, param.default
    if not raw:
        raise DraftLabError(f"drafter {name!r} needs {param.meaning} after a colon (got {shown!r}); "
                            f"use e.g. {param.example}")
    value = param.parse(raw)
    if value is None:
        raise DraftLabError(f"drafter {name!r}: {raw[:40]!r} is not {param.meaning}; use e.g. {param.example}")
    return name, value


def drafter_spec(text) -> DrafterSpec:
    """The description of the drafter a spec names (the spec checked as parse_drafter does)."""
    return SPECS[parse_drafter(text)[0]]


def canonical_drafter(text) -> str:
    """One spelling per drafter configuration ("confidence:0.50 " -> "confidence:0.5"), for records and keys."""
    name, value = parse_drafter(text)
    return SPECS[name].spec(value)  # repr: the shortest spelling that reads back exactly


def needs_draft_model(text) -> bool:
    """Whether the drafter drafts with the draft model (False: a run needs no draft model at all)."""
    return drafter_spec(text).needs_model
