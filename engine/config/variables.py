"""The swept variables: one description of each, read by the CLI (`--k 1,2,4`), the New-experiment form and its
link prefill (`new?sweep=top_p&values=0.8,1`), the queue (how a sweep becomes runs), the worker, the queries and
findings (how a run's swept value is read back and shown), export, validation and deploy.

Each `Variable` says what it is called everywhere (runs column, CLI flag, URL key, form label), how one value is
parsed and bounded (ASCII numbers, engine/numbers.py), how it is shown, whether its values are names (a draft or
a drafter spec: `sweep_value` then stores the value's index and `sweep_label` the name), whether the
target-only baseline depends on it (a sampling setting: one baseline per value; k, draft, drafter: one shared),
and what serving a value costs (a smaller k, a smaller draft, no draft model: the verdict's cheaper tied choice).

A new swept variable is one entry in VARIABLES plus what the engine does with it. engine/config/run_config.py's
RunConfig carries every entry to the CLI (a flag), the form (a number field from title/step/help; a named one needs its
own widget), its link, the queue (storage/db/schema.py declares its columns from `kind`, storage/db/migrations.py adds
them to an older database), the worker (a SamplingConfig field of the same name reaches the engine), validation, deploy
(`serving_note`) and findings. draft_sampling took 11 files; draft_temperature took 3 (this entry,
engine/config/sampling_config.py's field, engine/decoding/drafting.py's use) besides its test and docs; draft_dtype, a
loading setting rather than a sampling one, took 4 (this entry, app/runtime/model_cache.py loading each run's draft in
its dtype, app/worker/timing.py handing the run's value over, storage/records/queries.py giving the verdict's cost the
experiment's dtype). Plain Python, no torch: storage and pages import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

from engine import zoo
from engine.config.drafter_specs import (
    DEFAULT_DRAFT_SAMPLING,
    DEFAULT_DRAFTER,
    DRAFT_SAMPLING,
    SPECS,
    canonical_drafter,
    needs_draft_model,
)
from engine.config.limits import LIMITS, limit, over
from engine.config.tree_shape import MAX_TREE_TOKENS, MAX_TREE_TOPK, verified_nodes
from engine.errors import DraftLabError
from engine.numbers import DB_INT_MAX, ascii_float, ascii_int

MAX_K = 64  # the largest k anyone sweeps (the form's bound, --k's, and the prefill's)
MAX_TOP_K = 10**6
MAX_TEMPERATURE = 100.0
# The smallest temperature above 0: below it sampling is greedy in all but exact ties, and float32 logits divided
# by it overflow or divide by zero (1e-300 is 0 in float32). 0 is greedy decoding, anything from this up samples.
MIN_TEMPERATURE = 1e-3
# How the target verifies a round's drafts (engine/decoding/verification.py): the standard rule, token by token, or
# block verification (Sun et al. 2024; vLLM's rejection_sample_method "block"); both lossless.
VERIFY_RULES = ("standard", "block")
DEFAULT_VERIFY = "standard"
# The precision the draft model is loaded and run in (app/runtime/model_cache.py loads each run's draft at its own):
# "same" is the experiment's dtype (what runs stored before the variable read as), the others a dtype of their own;
# the target always runs at the experiment's. Bytes per parameter order the verdict's cheaper tied choice.
DRAFT_DTYPES = ("same", "float32", "bfloat16", "float16")
DEFAULT_DRAFT_DTYPE = "same"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAX_NAME = 300  # characters of a model name
# The largest batch size anyone sweeps: requests decoded together per forward (a server's running batch). Whether a
# batch fits is checked per run before it decodes (engine/decoding/memory.py's batch estimate), this is only the bound.
MAX_BATCH_SIZE = 256
# A stored run's column getter, `get(name, default=None)` (a runs row as a mapping or a pandas row).
Getter = Callable[..., Any]


@dataclass(frozen=True)
class Variable:
    name: str  # the runs/experiments column, the URL's `sweep=` key, the CLI option's dest
    kind: type  # int, float or str (names: a draft model, a drafter spec)
    what: str  # what one valid value is, for error messages: "a whole number from 1 to 64" ({upper}: the limit)
    example: str  # a valid list of values: "1,2,4,8"
    default: str | None = None  # the value when not given (CLI text); None: required where it matters
    help: str = ""  # the CLI's help, what a form field's help says
    label: str = ""  # the form's choice: "draft (compare drafts)"; the name when empty
    title: str = ""  # a form field's title: "Top-k"
    step: float | None = None  # a number input's step in the form
    low: float | None = None  # numeric bounds (inclusive unless low_open)
    high: float | None = None
    low_open: bool = False
    min_positive: float | None = None  # a value above 0 must be at least this (temperature: 0 or >= 0.001)
    limit: str | None = (
        None  # the engine/config/limits.py bound that is its upper bound (settable by $DRAFTLAB_LIMIT_...)
    )
    per_value_baseline: bool = False  # the target's own decoding depends on it: one baseline per value
    check_name: Callable[[str], str] | None = None  # names: the value as stored, or a DraftLabError
    choices: tuple[str, ...] = ()  # names from a fixed list (draft sampling): the form offers them, a sweep takes all
    # What serving a value costs, to choose among statistically tied values (storage/analysis/verdict.py deploys the
    # cheapest): (value, the run's column getter) -> a number, lower is cheaper; None when unknown. No cost: no
    # value is cheaper than another (a sampling setting changes what is generated, not what it costs).
    cost: Callable[[Any, Getter], float | None] | None = None
    cheaper_because: str = ""  # why a lower cost is cheaper, for the verdict's and the findings' sentences
    # What serving engines do differently with a value (storage/serving/deploy.py adds it to every engine's notes):
    # (value, the run's settings by name) -> a sentence, or None when they do as measured.
    serving_note: Callable[[Any, dict[str, Any]], str | None] | None = None

    @property
    def meaning(self) -> str:
        """What one valid value is, with the limit in force filled in: "a whole number from 1 to 100"."""
        return self.what.format(upper=self.upper) if self.limit else self.what

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def categorical(self) -> bool:
        """Values are names; runs store the index as sweep_value and the name as sweep_label."""
        return self.kind is str

    @property
    def choice(self) -> str:
        return self.label or self.name

    def said(self, form: bool = False) -> str:
        """How an error names this variable: its CLI flag (`--top-k`), or in the form its field's words (`top-k`)."""
        return (self.title or self.name).lower().replace("_", " ") if form else self.flag

    def for_example(self, example: str, form: bool = False) -> str:
        """An error's fix: `use e.g. --k 1,2,4,8` for the CLI, `enter e.g. 1,2,4,8` in the form."""
        return f"enter e.g. {example}" if form else f"use e.g. {self.flag} {example}"

    def parse(self, text: object, form: bool = False) -> int | float | str:
        """One value from its text (a DraftLabError names the problem and the fix, worded for the CLI's flags or,
        with form, for the New-experiment form's fields: the same bounds, the user's own words)."""
        raw = str(text).strip()
        said = self.said(form)
        if self.categorical:
            if not raw:
                raise DraftLabError(f"{said} has an empty value; {self.for_example(self.example, form)}")
            return self.check_name(raw) if self.check_name else raw
        value = ascii_int(raw) if self.kind is int else ascii_float(raw)
        upper = self.upper
        if value is not None and self.limit and upper is not None and value > upper:
            raise DraftLabError(
                f"{said} {raw[:40]} is more than the limit of {self.upper} "
                f"{LIMITS[self.limit].meaning.split(' (')[0]}: use fewer, or raise it with "
                f"${LIMITS[self.limit].env}"
            )
        if value is not None and self.min_positive is not None and 0 < value < self.min_positive:
            raise DraftLabError(
                f"{said if form else self.name} value {raw[:40]!r} is too small to compute with (a "
                f"value above 0 must be at least {self.min_positive:g}); use 0 for greedy decoding "
                f"or e.g. {'' if form else self.flag + ' '}{self.min_positive:g}"
            )
        if value is None or not self.in_range(value):
            raise DraftLabError(
                f"{said if form else self.name} value {raw[:40]!r} is not {self.meaning}; "
                f"{self.for_example(self.example, form)}"
            )
        return value

    @property
    def upper(self) -> float | None:
        """The largest value: the limit in force (engine/config/limits.py) when it has one, else `high`."""
        return limit(self.limit) if self.limit else self.high

    def in_range(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.min_positive is not None and 0 < value < self.min_positive:
            return False
        return self.upper is None or value <= self.upper

    def parse_list(self, text: object, form: bool = False) -> list[int | float | str]:
        """Comma-separated values, each once: numbers sorted, names in the order given (errors worded as parse's)."""
        items = (
            [item.strip() for item in str(text).split(",")]
            if not isinstance(text, (list, tuple))
            else [str(item).strip() for item in text]
        )
        said = self.said(form)
        if not items or any(not item for item in items):
            raise DraftLabError(f"{said} {str(text)[:60]!r} has an empty value; {self.for_example(self.example, form)}")
        if len(items) > limit("swept_values"):
            raise DraftLabError(f"{said}: " + over("swept_values", len(items), "the sweep"))
        values = [self.parse(item, form) for item in items]
        seen = set()
        for value in values:
            if value in seen:
                raise DraftLabError(f"{said} lists {self.show(value)} twice; list each value once")
            seen.add(value)
        return values if self.categorical else sorted(values)

    def coerce(self, value: Any) -> int | float | str:
        """A stored or programmatic value as this variable's type (numbers from a float column, names stripped)."""
        if self.categorical:
            return str(value).strip()
        return int(value) if self.kind is int else float(value)

    def show(self, value: Any) -> str:
        """How a value reads on a page or in a sentence: 4, 0.7, demo-draft, confidence:0.5."""
        if self.categorical:
            return str(value)
        value = self.coerce(value)
        return str(value) if self.kind is int else f"{value:g}"

    def run_value(self, run: Any) -> int | float | str | None:
        """A stored run's swept value (a runs row: a mapping or a pandas row with sweep_value and sweep_label);
        None for a baseline of a shared-baseline sweep."""
        get = run.get if hasattr(run, "get") else lambda key, default=None: getattr(run, key, default)
        if self.categorical:
            label = get("sweep_label")
            return str(label) if isinstance(label, str) else None
        value = get("sweep_value")
        if value is None or value != value:  # NULL / NaN
            return None
        return self.coerce(value)

    def run_cost(self, run: Any) -> float | None:
        """What serving this run's swept value costs (lower is cheaper; `cost` above), None when not comparable."""
        if self.cost is None:
            return None
        value = self.run_value(run)
        if value is None:
            return None
        get = run.get if hasattr(run, "get") else lambda key, default=None: getattr(run, key, default)
        return self.cost(value, get)

    def sweep_value(self, value: Any, index: int) -> float:
        """What a run stores as sweep_value: the number, or a name's index in the sweep."""
        return float(index) if self.categorical else value


def _model_name(text: str) -> str:
    name = text.strip()
    if len(name) > MAX_NAME:
        raise DraftLabError(f"a model name is longer than {MAX_NAME} characters; give a shorter path or id")
    if re.search(r"[\x00-\x1f\x7f]", name):
        raise DraftLabError("a model name holds a control character; give the model's id or path")
    return name


def _draft_size(value: Any, get: Getter) -> float | None:
    """A draft's cost: the parameters of the model the run loaded (unknown for runs stored before they were)."""
    size = get("draft_parameters")
    return float(size) if isinstance(size, Real) and size == size and float(size) > 0 else None


def _tree_cost(value: Any, get: Getter) -> float | None:
    """A tree's serving cost: the nodes the target verifies per round (a larger tree, more verify compute), from
    the run's k, tree_topk and tree_tokens (the swept one's value given)."""

    def whole(key: str, default: int) -> int | None:
        got = get(key)
        if isinstance(got, Real) and got == got:
            return int(float(got))
        return default if default >= 0 else None

    k = whole("k", -1)
    return None if k is None else float(verified_nodes(k, whole("tree_topk", 1) or 1, whole("tree_tokens", 0) or 0))


def _drafter_help() -> str:
    """The drafter variable's help, read from the declarations (engine/config/drafter_specs.py): 'model (the
    default; eagle3 when the draft is an EAGLE-3 head), heuristic, confidence:T, ... or eagle3; a comma list ...'."""
    heads = [s.name for s in SPECS.values() if s.needs_hidden_states]
    default = f"{DEFAULT_DRAFTER} (the default" + (f"; {heads[0]} when the draft is an EAGLE-3 head)" if heads else ")")
    others = [s.usage for s in SPECS.values() if s.name != DEFAULT_DRAFTER]
    listed = f"{', '.join(others[:-1])} or {others[-1]}" if len(others) > 1 else "".join(others)
    return f"{default}, {listed}; a comma list compares them"


def _draft_sampling(text: str) -> str:
    mode = text.strip().lower()
    if mode not in DRAFT_SAMPLING:
        raise DraftLabError(
            f"--draft-sampling {text[:40]!r} is not one of {', '.join(DRAFT_SAMPLING)}; use e.g. "
            f"--draft-sampling greedy (drafts by argmax, as vLLM's V1 drafter did)"
        )
    return mode


def _verify_rule(text: str) -> str:
    rule = text.strip().lower()
    if rule not in VERIFY_RULES:
        raise DraftLabError(
            f"--verify {text[:40]!r} is not one of {', '.join(VERIFY_RULES)}; use e.g. --verify standard,block"
        )
    return rule


def _draft_dtype(text: str) -> str:
    name = text.strip().lower()
    if name not in DRAFT_DTYPES:
        raise DraftLabError(
            f"--draft-dtype {text[:40]!r} is not one of {', '.join(DRAFT_DTYPES)}; use e.g. --draft-dtype "
            f"same,bfloat16 (same: the experiment's --dtype)"
        )
    return name


def _draft_dtype_cost(value: Any, get: Getter) -> float | None:
    """A draft precision's cost: its bytes per parameter times the draft's parameters (the weights read per draft
    step); "same" at the experiment's dtype (auto: float32 on a CPU, bfloat16 on a GPU, as the engine resolves it,
    from the run's device_name). None for a run with no draft model (the variable changes nothing there) or a dtype
    the row does not say."""
    size = _draft_size(value, get)
    name = str(value)
    if name == DEFAULT_DRAFT_DTYPE:
        name = dtype if isinstance(dtype := get("dtype"), str) else ""
        if name == "auto":
            device = get("device_name")
            name = "" if not isinstance(device, str) else "float32" if device.startswith("cpu") else "bfloat16"
    per = DTYPE_BYTES.get(name)
    return None if size is None or per is None else per * size


def _draft_dtype_note(value: Any, run: dict[str, Any]) -> str | None:
    """What serving engines do with a draft precision of its own (None for "same" and for runs with no draft)."""
    if value == DEFAULT_DRAFT_DTYPE or not run.get("draft"):
        return None
    return (
        f"Check: this run's draft ran in {value}, the target in the experiment's dtype. vLLM (speculative_config) "
        f"and SGLang load the draft in the target's --dtype, with only a quantization of its own (vLLM's "
        f"speculative_config quantization, SGLang's --speculative-draft-model-quantization): unless the target "
        f"serves in {value} too, measure draft_dtype same, which is what they run. llama.cpp takes a separately "
        f"quantized GGUF draft (-md); transformers takes the assistant_model in whatever torch_dtype you load it."
    )


VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable(
            "k",
            int,
            f"a whole number from 1 to {MAX_K}",
            "1,2,4,8",
            "4",
            "draft length, a comma-separated sweep (1,2,4,8), or auto[:K]: run k=K, predict the speedup of every k, "
            "then measure the 3 best predicted",
            low=1,
            high=MAX_K,
            title="k",
            step=1,
            cost=lambda value, get: float(value),
            cheaper_because="fewer draft steps, a smaller KV cache",
        ),
        Variable(
            "temperature",
            float,
            f"0 (greedy) or a number from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}",
            "0,0.7,1",
            "0",
            f"0 = greedy, else {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}; a comma list sweeps it",
            low=0.0,
            high=MAX_TEMPERATURE,
            min_positive=MIN_TEMPERATURE,
            per_value_baseline=True,
            title="Temperature",
            step=0.1,
        ),
        Variable(
            "top_k",
            int,
            f"a whole number from 0 to {MAX_TOP_K} (0 turns it off)",
            "0,20,50",
            "0",
            "0 = off; a comma list sweeps it",
            low=0,
            high=MAX_TOP_K,
            per_value_baseline=True,
            title="Top-k",
            step=1,
        ),
        Variable(
            "top_p",
            float,
            "a number in (0, 1] (1 turns it off)",
            "0.8,0.95,1",
            "1.0",
            "1 = off; a comma list sweeps it",
            low=0.0,
            high=1.0,
            low_open=True,
            per_value_baseline=True,
            title="Top-p",
            step=0.05,
        ),
        Variable(
            "batch_size",
            int,
            f"a whole number from 1 to {MAX_BATCH_SIZE}",
            "1,4,16",
            "1",
            "requests decoded together, B prompts per forward (prompts grouped in order into batches of B); a comma "
            "list sweeps it, each batch size with its own target-only baseline at that batch size",
            low=1,
            high=MAX_BATCH_SIZE,
            per_value_baseline=True,
            title="Batch size",
            step=1,
        ),
        Variable(
            "draft",
            str,
            "a draft model's id or path",
            "demo-draft,demo-draft-distilled",
            None,
            f"{zoo.model_help('draft')}; a comma list compares drafts, EAGLE-3 heads beside causal LMs (each "
            "drafts with its own drafter when none is named; not needed when every drafter drafts without one: "
            f"{', '.join(s.usage for s in SPECS.values() if not s.needs_model)})",
            label="draft (compare drafts)",
            check_name=_model_name,
            cost=_draft_size,
            cheaper_because="a smaller draft model",
        ),
        Variable(
            "drafter",
            str,
            "a drafter spec",
            "model,heuristic,prompt-lookup:3",
            DEFAULT_DRAFTER,
            _drafter_help(),
            label="drafter (drafting strategy)",
            check_name=canonical_drafter,
            cost=lambda value, get: 1.0 if needs_draft_model(str(value)) else 0.0,
            cheaper_because="no draft model to load or run",
        ),
        Variable(
            "draft_sampling",
            str,
            "probabilistic or greedy",
            "probabilistic,greedy",
            DEFAULT_DRAFT_SAMPLING,
            "how the draft model proposes: probabilistic (draws from its distribution) or greedy (its argmax, "
            "verified as a point mass: still lossless; what a server that drafts by argmax sees); a comma list "
            "compares them",
            label="draft sampling (probabilistic or greedy)",
            check_name=_draft_sampling,
            choices=DRAFT_SAMPLING,
        ),
        # The draft's own temperature: a cooler draft proposes likelier tokens, a warmer one covers more of the
        # target's mass. Lossless at any value: the target verifies against the distribution the draft sampled from.
        Variable(
            "draft_temperature",
            float,
            f"0 (the target's temperature) or a number from {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}",
            "0,0.5,1",
            "0",
            "the temperature the draft model proposes at: 0 = the target's (default), else its own; the target "
            "verifies against the distribution the draft sampled from, so every value is lossless; a comma list "
            "sweeps it",
            low=0.0,
            high=MAX_TEMPERATURE,
            min_positive=MIN_TEMPERATURE,
            title="Draft temperature",
            step=0.1,
            serving_note=lambda value, run: (
                None
                if not value or value == run["temperature"]
                else (
                    f"Check: this run's draft proposed at temperature {value:g}, the target sampled at "
                    f"{run['temperature']:g}. These settings carry no separate draft temperature (the engines draft "
                    f"under the request's sampling), so acceptance there follows a draft at the target's "
                    f"temperature; measure that too (draft_temperature 0)."
                )
            ),
        ),
        # The draft model's precision, the target's staying at the experiment's dtype: a lower precision drafts
        # cheaper (c = target step / draft step rises) and may propose a little worse (alpha). Lossless at any value:
        # the target verifies against the probabilities the draft proposed with. The target-only baseline loads no
        # draft: one serves every value.
        Variable(
            "draft_dtype",
            str,
            ", ".join(DRAFT_DTYPES[:-1]) + f" or {DRAFT_DTYPES[-1]}",
            "same,bfloat16",
            DEFAULT_DRAFT_DTYPE,
            "the precision the draft model is loaded and run in: same (the experiment's --dtype, the default), "
            "float32, bfloat16 or float16 (all three run on a CPU too, at the CPU's speed for them); the target "
            "stays at --dtype; no effect on drafters without a draft model, and an EAGLE-3 head takes only same; a "
            "comma list compares them",
            label="draft dtype (the draft model's precision)",
            check_name=_draft_dtype,
            choices=DRAFT_DTYPES,
            cost=_draft_dtype_cost,
            cheaper_because="a lower-precision draft: fewer bytes per parameter",
            serving_note=_draft_dtype_note,
        ),
        # Token trees (engine/config/tree_shape.py, SPEC "Token trees"): k stays the depth.
        Variable(
            "tree_topk",
            int,
            f"a whole number from 1 to {MAX_TREE_TOPK} (1 drafts a chain)",
            "1,2,4",
            "1",
            "tree branches per node (not the sampling top-k): 1 drafts a chain, 2 or more a token tree of depth k "
            "(SGLang's --speculative-eagle-topk); a comma list sweeps it",
            label="tree_topk (tree branches per node, not the sampling top-k)",
            low=1,
            high=MAX_TREE_TOPK,
            title="Tree branches per node (not the sampling top-k)",
            step=1,
            cost=lambda value, get: _tree_cost(
                value, lambda key, default=None: value if key == "tree_topk" else get(key)
            ),
            cheaper_because="a smaller tree: fewer nodes to verify per round",
        ),
        Variable(
            "tree_tokens",
            int,
            f"0 (the whole tree) or a whole number from 2 to {MAX_TREE_TOKENS}",
            "0,8,16",
            "0",
            "tree nodes verified per round, the root included (SGLang's --speculative-num-draft-tokens): 0 verifies "
            "every node the tree's expansion makes; with tree branches above 1 it must be at least k + 1; a chain "
            "verifies k + 1 whatever it says; a comma list sweeps it",
            label="tree_tokens (tree nodes verified per round)",
            low=0,
            high=MAX_TREE_TOKENS,
            title="Tree nodes verified per round",
            step=1,
            cost=lambda value, get: _tree_cost(
                value, lambda key, default=None: value if key == "tree_tokens" else get(key)
            ),
            cheaper_because="a smaller tree: fewer nodes to verify per round",
        ),
        # How the target verifies the drafts (engine/decoding/verification.py). The target-only baseline verifies
        # nothing: one baseline serves both rules.
        Variable(
            "verify",
            str,
            "standard or block",
            "standard,block",
            DEFAULT_VERIFY,
            "how the target verifies the drafts: standard (token by token) or block (block verification, Sun et al. "
            "2024; vLLM's rejection_sample_method block): both lossless, block accepts at least as many in "
            "expectation, and a block run also records what the standard rule would have accepted on its drafts; a "
            "comma list compares them",
            label="verify (standard or block verification)",
            check_name=_verify_rule,
            choices=VERIFY_RULES,
        ),
    )
}
DEFAULT_VARIABLE = "k"

# The fixed numeric settings of an experiment, described the same way (never swept): the CLI's options, the form's
# fields and its link prefill, and the queue's last check read these. Seeds fit the INTEGER column on every database
# (engine/numbers.py's DB_INT_MAX); repeats and max new tokens are bounded by engine/config/limits.py.
SETTINGS: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable(
            "seed",
            int,
            f"a whole number from 0 to {DB_INT_MAX}",
            "0",
            "0",
            f"prompt i samples from a generator seeded by (seed, i); 0 to {DB_INT_MAX}",
            low=0,
            high=DB_INT_MAX,
            title="Seed",
            step=1,
        ),
        Variable(
            "repeats",
            int,
            "a whole number from 1 to {upper}",
            "3",
            None,
            "timed decodes per prompt and configuration, medians used",
            low=1,
            limit="repeats",
            title="Repeats",
            step=1,
        ),
        Variable(
            "max_new_tokens",
            int,
            "a whole number from 1 to {upper}",
            "128",
            "128",
            "new tokens per prompt",
            low=1,
            limit="max_new_tokens",
            title="Max new tokens",
            step=16,
        ),
    )
}


def variable(name: str | None) -> Variable:
    """The description of a swept variable by name (None or empty: k, what experiments stored before sweeps had
    a variable). A DraftLabError names the variables there are."""
    v = VARIABLES.get(name or DEFAULT_VARIABLE)
    if v is None:
        raise DraftLabError(f"cannot sweep {name!r}; sweep one of {', '.join(VARIABLES)}")
    return v


def value_labels(sweep: str, values: list[Any], drafters: list[Any]) -> list[Any]:
    """How runs' swept values read side by side (the run listing's, the detail page's): `values` each run's
    run_value (None: a shared baseline) as they are, except in a draft sweep whose runs draft with different
    drafters (EAGLE-3 heads beside causal LMs: `drafters`, each run's), where each names its drafter too:
    `heads/h · eagle3`."""
    named = [(v, d) for v, d in zip(values, drafters) if v is not None and isinstance(d, str)]
    if sweep != "draft" or len({d for _, d in named}) < 2:
        return list(values)
    return [f"{v} · {d}" if v is not None and isinstance(d, str) else v for v, d in zip(values, drafters)]
