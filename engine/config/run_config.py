"""One run configuration: what an experiment runs, as one frozen object built from engine/config/variables.py's
descriptions. Every place that used to list the settings reads this instead: the CLI (`to_cli`, `from_args`), the
New-experiment form and its link (`to_url`, `from_url`; pages/widgets/prefill.py maps it onto widgets), the queue
(`enqueue`, `run_settings`, `from_experiment`: what a stored experiment or run was), the worker (`sampling`: the
engine's SamplingConfig), validation (`of_run`: the chosen run, rerun), deploy (`of_run`) and the duplicate-launch
key (`key`).

Each swept variable and setting is one entry of VARIABLES or SETTINGS; this module never names one of them except
where its meaning differs from "a value" (k auto is a k sweep, a draft sweep's experiment stores its drafts
joined, a drafter that needs no model has no draft, a draft sweep of EAGLE-3 heads and causal LMs gives each draft
its own drafter). So a new variable is its entry, what the engine does with it,
and nothing here.

    cfg = RunConfig.make(target="demo-target", prompts="code", draft="demo-draft", sweep="k", values="1,2,4")
    cfg.value("temperature") -> 0.0;  cfg.to_url()["values"] -> "1,2,4";  RunConfig.from_url(cfg.to_url()) == cfg

Plain Python, no torch: storage and pages import it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from engine.config.drafter_specs import (
    DEFAULT_DRAFTER,
    SPECS,
    DrafterSpec,
    canonical_drafter,
    drafter_spec,
    needs_draft_model,
    parse_drafter,
)
from engine.config.head_format import is_causal_lm_dir, is_head, read_config
from engine.config.sampling_config import SamplingConfig
from engine.config.tree_shape import check_tree
from engine.config.variables import DEFAULT_VARIABLE, SETTINGS, VARIABLES, Variable
from engine.errors import DraftLabError

# Every described parameter of a run: the swept variables and the fixed settings (seed, repeats, max new tokens).
PARAMETERS: dict[str, Variable] = {**VARIABLES, **SETTINGS}
# What every run row stores of them (repeats is the experiment's: how often each run is timed, not how it decodes).
RUN_PARAMETERS = tuple(name for name in PARAMETERS if name != "repeats")
# The settings the target-only decoding depends on: a baseline stores these (and a sweep of one gets a baseline
# per value).
BASELINE_PARAMETERS = tuple(name for name in RUN_PARAMETERS if name in SETTINGS or VARIABLES[name].per_value_baseline)
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_REPEATS = 3  # benchmarks/bench_protocol.md: what the demo pair needs to meet the spread goal
# Link and command-line keys that are not a described parameter: what the run decodes with, and the sweep.
URL_KEYS = ("target", "prompts", "device", "dtype", "sweep", "values", "batch_sizes", "k_auto")


def _default(v: Variable) -> Any:
    if v.name == "repeats":
        return DEFAULT_REPEATS
    return None if v.default is None else v.parse(v.default)


DEFAULTS = {name: _default(v) for name, v in PARAMETERS.items()}


def _text(value: object) -> str:
    """A value as its parser reads it back: shortest exact text of a number (0.7, 1e-05), a name as it is."""
    if isinstance(value, bool):
        raise DraftLabError(f"{value!r} is not a setting's value")
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _one(v: Variable, value: object, form: bool, stored: bool = False) -> Any:
    """One given value of a parameter (text from a flag, a field or a link, or a number from a script), parsed and
    bounded by its description; an empty draft is no draft (a drafter without a model). A stored number was
    checked when it was queued: read as it is (a workload cap lowered since must not make a stored run unreadable)."""
    if v.name == "draft" and (value is None or str(value).strip() == ""):
        return ""
    if stored and not v.categorical:
        return v.coerce(value)
    return v.parse(_text(value), form)


@dataclass(frozen=True)
class RunConfig:
    """An experiment's configuration: the target and prompts, the swept variable and its values, and every other
    parameter's one value (`settings`: name -> value, each parsed by its description; the swept one holds its first
    value). k_auto: `--k auto`, predict then confirm up to that k (a k sweep of [k_auto]). batch_sizes: a grid's
    outer axis (the sweep at each)."""

    target: str
    prompts: str
    settings: tuple[tuple[str, object], ...]
    sweep: str = DEFAULT_VARIABLE
    values: tuple[Any, ...] = ()
    k_auto: int | None = None
    batch_sizes: tuple[int, ...] | None = None
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    chat_template: str = "auto"
    # A draft sweep whose drafts draft with different drafters (EAGLE-3 heads and causal LMs, no drafter named):
    # each swept draft's own drafter, in the sweep's order; None when every run drafts with settings' drafter.
    drafters: tuple[str, ...] | None = None
    _index: dict[str, Any] = field(init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", dict(self.settings))

    # --- building ---------------------------------------------------------------------------------------------

    @classmethod
    def make(
        cls,
        *,
        target: str,
        prompts: str,
        sweep: str | None = None,
        values: str | Sequence[Any] | None = None,
        k_auto: int | str | None = None,
        batch_sizes: str | Sequence[Any] | None = None,
        device: str = "auto",
        dtype: str = "auto",
        trust_remote_code: bool = False,
        chat_template: str | None = "auto",
        form: bool = False,
        stored: bool = False,
        drafters: Sequence[str] | None = None,
        **given: Any,
    ) -> RunConfig:
        """A configuration from given values (text or numbers; missing ones take their defaults), each parsed and
        bounded by its description; `values` a list or comma-separated text of the swept variable's values (none:
        the swept variable's own value). A DraftLabError names the problem and the fix, in the form's words with
        `form`. `stored`: numbers read from the database, checked when they were queued, taken as they are;
        `drafters`: a stored draft sweep's drafter per draft (the `drafters` field)."""
        unknown = [name for name in given if name not in PARAMETERS]
        if unknown:
            raise DraftLabError(f"unknown settings {', '.join(sorted(unknown))}; use {', '.join(PARAMETERS)}")
        settings = {
            name: DEFAULTS[name] if given.get(name) is None else _one(PARAMETERS[name], given[name], form, stored)
            for name in PARAMETERS
        }
        settings["draft"] = settings["draft"] or ""
        auto = None if k_auto is None else _k_auto(k_auto)
        if auto is not None:
            sweep, values = "k", [auto]
        swept = VARIABLES.get(sweep or DEFAULT_VARIABLE)
        if swept is None:
            raise DraftLabError(f"cannot sweep {sweep!r}; sweep one of {', '.join(VARIABLES)}")
        if values is None or (isinstance(values, str) and not values.strip()):
            listed = [settings[swept.name]]
        else:
            listed = (
                [swept.coerce(v) for v in values]
                if stored and not swept.categorical
                else swept.parse_list(values if isinstance(values, str) else [_text(v) for v in values], form)
            )
        settings[swept.name] = listed[0]
        if stored:  # stored runs named their drafters
            drafters = _stored_drafters(drafters, swept.name, listed)
        else:  # what a draft is decides the drafter a run takes when none is named: each draft its own
            drafts = [d for d in (listed if swept.name == "draft" else [settings["draft"]]) if d]
            named = values is not None and not (isinstance(values, str) and not values.strip())
            if given.get("drafter") is None and not (swept.name == "drafter" and named):
                own = [default_drafter(d) for d in drafts] or [DEFAULT_DRAFTER]
                settings["drafter"] = own[0]
                drafters = tuple(own) if len(set(own)) > 1 else None
                listed = [settings["drafter"]] if swept.name == "drafter" else listed
            else:
                drafters = None
                check_drafters(listed if swept.name == "drafter" else [settings["drafter"]], drafts)
        sizes: tuple[int, ...] | None = None
        if batch_sizes is not None and not (isinstance(batch_sizes, str) and not batch_sizes.strip()):
            if swept.name == "batch_size":
                raise DraftLabError(
                    "a grid sweeps another variable at each batch size; give the batch sizes as the "
                    "sweep or as the grid's batch sizes, not both"
                )
            sizes = (
                tuple(int(b) for b in batch_sizes)
                if stored
                else tuple(
                    int(b)
                    for b in VARIABLES["batch_size"].parse_list(
                        batch_sizes if isinstance(batch_sizes, str) else [_text(v) for v in batch_sizes], form
                    )
                )
            )
            settings["batch_size"] = sizes[0]
        if not stored:  # each run's tree fits its k and drafter (engine/config/tree_shape.py)
            for i, value in enumerate(listed):
                drafter_of: Any = drafters[i] if drafters and swept.name == "draft" else settings["drafter"]
                check_tree({**settings, "drafter": drafter_of, swept.name: value}, form)
        if device not in DEVICES:
            raise DraftLabError(f"device {str(device)[:40]!r} is not one of {', '.join(DEVICES)}")
        if dtype not in DTYPES:
            raise DraftLabError(f"dtype {str(dtype)[:40]!r} is not one of {', '.join(DTYPES)}")
        return cls(
            target=str(target).strip(),
            prompts=str(prompts).strip(),
            settings=tuple(settings.items()),
            sweep=swept.name,
            values=tuple(listed),
            k_auto=auto,
            batch_sizes=sizes,
            device=device,
            dtype=dtype,
            trust_remote_code=bool(trust_remote_code),
            chat_template=chat_template or "auto",
            drafters=drafters,
        )

    @classmethod
    def from_args(cls, args: Any, sweep: Any, chat_template: str | None = None) -> RunConfig:
        """`draftlab run`'s configuration: its parsed arguments and app/sweep.py's Sweep of the listed option
        (chat_template: the --chat-template FILE's text, engine/text/chat.py's resolve_option, when read)."""
        fixed: dict[str, Any] = {
            name: value for name, value in sweep.fixed.items() if not (name == "draft" and value == "-")
        }
        return cls.make(
            target=args.target,
            prompts=args.prompts,
            sweep=sweep.variable,
            values=None if sweep.k_auto else list(sweep.values),
            k_auto=sweep.k_auto,
            batch_sizes=sweep.batch_sizes,
            device=args.device,
            dtype=args.dtype,
            trust_remote_code=args.trust_remote_code,
            chat_template=chat_template or args.chat_template,
            **fixed,
            **{name: getattr(args, name) for name in SETTINGS},
        )

    @classmethod
    def from_url(cls, params: Mapping[str, str], form: bool = True) -> RunConfig:
        """The configuration a link (`new?target=...&sweep=k&values=1,2`) describes, strictly: a bad parameter is a
        DraftLabError (pages/widgets/prefill.py reads links leniently, one parameter at a time, through `url_value`)."""
        sweep = params.get("sweep") or DEFAULT_VARIABLE
        k_auto = params.get("k_auto") if sweep == "auto" else None
        given: dict[str, Any] = {name: params[name] for name in PARAMETERS if name in params}
        return cls.make(
            target=params.get("target", ""),
            prompts=params.get("prompts", ""),
            sweep="k" if sweep == "auto" else sweep,
            values=params.get("values"),
            k_auto=k_auto,
            batch_sizes=params.get("batch_sizes"),
            device=params.get("device", "auto"),
            dtype=params.get("dtype", "auto"),
            form=form,
            **given,
        )

    @classmethod
    def from_enqueue(cls, kwargs: Mapping[str, Any]) -> RunConfig:
        """The configuration of enqueue_experiment's keyword arguments (storage/jobs/experiments.py): `sampling` holds
        any fixed parameter by name, the others are keywords of their own."""
        given = {name: kwargs[name] for name in PARAMETERS if kwargs.get(name) is not None}
        given.update({name: value for name, value in (kwargs.get("sampling") or {}).items() if value is not None})
        sweep = kwargs.get("sweep_variable") or DEFAULT_VARIABLE
        values = kwargs.get("sweep_values")
        if sweep == "draft" and values:  # each value is a draft; the experiment's own is its first
            given["draft"] = values[0]
        return cls.make(
            target=kwargs["target"],
            prompts=kwargs["prompts"],
            sweep=sweep,
            values=None if kwargs.get("k_auto") is not None else values,
            k_auto=kwargs.get("k_auto"),
            batch_sizes=kwargs.get("batch_sizes"),
            device=kwargs.get("device") or "auto",
            dtype=kwargs.get("dtype") or "auto",
            trust_remote_code=kwargs.get("trust_remote_code", False),
            chat_template=kwargs.get("chat_template"),
            **given,
        )

    @classmethod
    def from_experiment(cls, row: Mapping[Any, Any]) -> RunConfig:
        """What a stored experiment row runs (the inverse of `experiment_columns`); columns an older database
        lacks (NULL) take their defaults."""
        values = row["sweep_values"]
        values = json.loads(values) if isinstance(values, str) else list(values)
        stored_sizes: Any = row.get("batch_sizes")  # JSON text, a list, or NULL
        sizes = (
            json.loads(stored_sizes)
            if isinstance(stored_sizes, str)
            else None
            if not _present(stored_sizes)
            else list(stored_sizes)
        )
        sweep = row.get("sweep_variable") or DEFAULT_VARIABLE
        given: dict[str, Any] = {name: row.get(name) for name in PARAMETERS if _present(row.get(name))}
        if sweep == "draft":
            given["draft"] = values[0] if values else ""
        k_auto: Any = row.get("k_auto")
        drafters = row.get("draft_drafters")
        return cls.make(
            target=row["target"],
            prompts=row["prompts"],
            sweep=sweep,
            values=None if _present(k_auto) else values,
            k_auto=int(k_auto) if _present(k_auto) else None,
            batch_sizes=sizes,
            device=row.get("device") or "auto",
            dtype=row.get("dtype") or "auto",
            trust_remote_code=bool(row.get("trust_remote_code") or False),
            chat_template=row.get("chat_template"),
            stored=True,
            drafters=json.loads(drafters) if isinstance(drafters, str) else None,
            **given,
        )

    @classmethod
    def of_run(cls, run: Mapping[Any, Any], experiment: Mapping[Any, Any]) -> RunConfig:
        """One stored run's own configuration (its swept value fixed): the run's columns, else the experiment's
        (runs stored before a column existed), else the defaults. A run whose drafter needs no model has no draft."""
        given: dict[str, Any] = {}
        for name in PARAMETERS:
            value = run.get(name)
            given[name] = value if _present(value) else experiment.get(name)
        if not _present(run.get("draft")) and experiment.get("sweep_variable") == "draft":
            given["draft"] = None  # a draft sweep's experiment joins its drafts: never one run's
        given = {name: value for name, value in given.items() if _present(value)}
        if not needs_draft_model(str(given.get("drafter") or VARIABLES["drafter"].default)):
            given.pop("draft", None)
        return cls.make(
            target=experiment.get("target") or "",
            prompts=experiment.get("prompts") or "",
            device=experiment.get("device") or "auto",
            dtype=experiment.get("dtype") or "auto",
            trust_remote_code=bool(experiment.get("trust_remote_code") or False),
            chat_template=experiment.get("chat_template"),
            stored=True,
            **given,
        )

    # --- reading ----------------------------------------------------------------------------------------------

    def value(self, name: str) -> Any:
        """A parameter's one value (the swept variable's first)."""
        return self._index[name]

    @property
    def swept(self) -> Variable:
        return VARIABLES[self.sweep]

    def with_values(self, **changes: Any) -> RunConfig:
        """The same configuration with some parameters changed (checked where they were given: the queue, the
        grid); a changed batch size is one batch size, no grid."""
        given = {**self._index, **changes}
        return RunConfig.make(
            target=self.target,
            prompts=self.prompts,
            sweep=self.sweep,
            values=None if self.k_auto or self.sweep in changes else list(self.values),
            k_auto=self.k_auto,
            batch_sizes=None if "batch_size" in changes else self.batch_sizes,
            device=self.device,
            dtype=self.dtype,
            trust_remote_code=self.trust_remote_code,
            chat_template=self.chat_template,
            stored=True,
            drafters=None if self.sweep in changes else self.drafters,
            **given,
        )

    def run_settings(self, value: Any = None, baseline: bool = False) -> dict[str, Any]:
        """What a run of swept value `value` stores of each parameter (runs' columns, storage/db/schema.py): a baseline
        only what the target's own decoding depends on; a run whose drafter needs no model no draft (None); a draft
        sweep's run its draft's own drafter when they differ (`drafters`)."""
        settings = {name: self._index[name] for name in RUN_PARAMETERS}
        if value is not None:
            settings[self.sweep] = value
            if self.drafters:
                settings["drafter"] = self.drafters[self.values.index(value)]
        if baseline:
            return {name: settings[name] for name in BASELINE_PARAMETERS}
        if not needs_draft_model(str(settings["drafter"])):
            settings["draft"] = None
        return settings

    def runs(self) -> list[dict[str, Any]]:
        """Each swept value's run settings, in the sweep's order."""
        return [self.run_settings(value) for value in self.values]

    def experiment_columns(self) -> dict[str, Any]:
        """The experiments row (storage/db/schema.py's columns) that stores this configuration: every parameter's one
        value, the sweep (values as JSON), a grid's batch sizes; a draft sweep's drafts joined by commas, and each
        one's drafter (JSON) when they differ."""
        columns = dict(self._index)
        if self.sweep == "draft":
            columns["draft"] = ",".join(self.values)
        columns["draft_drafters"] = json.dumps(list(self.drafters)) if self.drafters else None
        return {
            "target": self.target,
            "prompts": self.prompts,
            "device": self.device,
            "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code,
            "chat_template": self.chat_template,
            **columns,
            "sweep_variable": self.sweep,
            "sweep_values": json.dumps(list(self.values)),
            "k_auto": self.k_auto,
            "batch_sizes": None if self.batch_sizes is None else json.dumps(list(self.batch_sizes)),
        }

    def enqueue(self) -> dict[str, Any]:
        """enqueue_experiment's keyword arguments for this configuration (labels such as name and notes apart): the
        names (draft, drafter, ...) as keywords of their own, the numbers under `sampling`."""
        names = {name: value for name, value in self.settings if PARAMETERS[name].categorical}
        if self.drafters:  # none named: each draft takes its own again, as here
            names["drafter"] = None
        return {
            "target": self.target,
            "prompts": self.prompts,
            **names,
            "draft": self.experiment_columns()["draft"],
            "sampling": {
                name: self._index[name] for name in RUN_PARAMETERS if name != "k" and not PARAMETERS[name].categorical
            },
            "device": self.device,
            "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code,
            "chat_template": self.chat_template,
            "sweep_variable": self.sweep,
            "sweep_values": list(self.values),
            "k": self._index["k"],
            "repeats": self._index["repeats"],
            "k_auto": self.k_auto,
            **({"batch_sizes": list(self.batch_sizes)} if self.batch_sizes else {}),
        }  # a grid only

    def sampling(self, value: Any = None) -> SamplingConfig:
        """The engine's SamplingConfig (engine/decoding/sampling.py) of a run of swept value `value`: every parameter
        that is one of its fields."""
        settings = self.run_settings(value)
        return SamplingConfig(**{f.name: settings[f.name] for f in fields(SamplingConfig) if f.name in settings})

    def key(self) -> tuple[Any, ...]:
        """What makes two launches the same experiment (a second Launch of it links to the first): everything
        but its labels."""
        return (
            self.target,
            self.prompts,
            self.sweep,
            self.values,
            self.k_auto,
            self.batch_sizes,
            self.device,
            self.dtype,
            self.trust_remote_code,
            self.chat_template,
            self.settings,
            self.drafters,
        )

    def to_url(self) -> dict[str, str]:
        """The link parameters of this configuration (every parameter by name; the swept one's as `values`, a
        grid's batch sizes as `batch_sizes`), read back by `from_url` and by the form's prefill:
        `from_url(cfg.to_url()) == cfg`."""
        params = {"target": self.target, "prompts": self.prompts, "device": self.device, "dtype": self.dtype}
        params.update(
            {
                name: exact_text(PARAMETERS[name], value)
                for name, value in self.settings
                if name != self.sweep
                and not (name == "draft" and value == "")
                and not (name == "batch_size" and self.batch_sizes is not None)
                and not (name == "drafter" and self.drafters)
            }
        )
        if self.k_auto is not None:
            params.update(sweep="auto", k_auto=str(self.k_auto))
        else:
            params.update(sweep=self.sweep, values=",".join(exact_text(self.swept, v) for v in self.values))
        if self.batch_sizes is not None:
            params["batch_sizes"] = ",".join(str(b) for b in self.batch_sizes)
        return params

    def to_cli(self) -> list[str]:
        """`draftlab run`'s arguments for this configuration (read back by the CLI's parser and `from_args`)."""
        # `--flag=value`: a value that starts with "-" (a model path) is then never read as an option
        argv = [
            f"--target={self.target}",
            f"--prompts={self.prompts}",
            f"--device={self.device}",
            f"--dtype={self.dtype}",
        ]
        for name, value in self.settings:
            v = PARAMETERS[name]
            if name == self.sweep:
                text = (
                    f"auto:{self.k_auto}"
                    if self.k_auto is not None
                    else ",".join(exact_text(v, item) for item in self.values)
                )
            elif name == "batch_size" and self.batch_sizes is not None:
                text = ",".join(str(b) for b in self.batch_sizes)
            elif name == "draft" and value == "" or name == "drafter" and self.drafters:
                continue
            else:
                text = exact_text(v, value)
            argv.append(f"{v.flag}={text}")
        if self.chat_template != "auto":
            argv.append(f"--chat-template={self.chat_template}")
        if self.trust_remote_code:
            argv.append("--trust-remote-code")
        return argv


def default_drafter(draft: str) -> str:
    """The drafter a draft drafts with when none is named (the one place that decides it: the CLI, the form and the
    queue all build a RunConfig): the hidden-state drafter (eagle3) for an EAGLE-3 head directory (either layout,
    engine/config/head_format.py), else `model`. A draft sweep takes each draft's own, so one sweep compares a head with
    causal LMs (RunConfig.drafters)."""
    if not is_head(draft):
        return DEFAULT_DRAFTER
    return next(spec.name for spec in SPECS.values() if spec.needs_hidden_states)


def _stored_drafters(drafters: Sequence[str] | None, sweep: str, drafts: Sequence[Any]) -> tuple[str, ...] | None:
    """A stored draft sweep's drafter per draft (experiments.draft_drafters, read back), checked against its drafts;
    None for any other sweep or when there is none."""
    if not drafters:
        return None
    if sweep != "draft" or len(drafters) != len(drafts):
        raise DraftLabError(
            f"{len(drafters)} drafters stored for a {sweep} sweep of {len(drafts)} values; each draft "
            f"of a draft sweep names one drafter"
        )
    return tuple(canonical_drafter(d) for d in drafters)


def check_drafters(specs: Iterable[str], drafts: Iterable[str]) -> None:
    """Refuse, before anything loads, a drafter named for a draft of the other kind: a causal-LM drafter (model,
    heuristic, confidence) with an EAGLE-3 head, or a hidden-state drafter (eagle3) with a local causal LM."""
    readers = ", ".join(spec.name for spec in SPECS.values() if spec.needs_hidden_states)
    for text in specs:
        spec = drafter_spec(text)
        if not spec.needs_model:
            continue
        for draft in drafts:
            _check_draft_layers(text, spec, draft)
            if not spec.needs_hidden_states and is_head(draft):
                raise DraftLabError(
                    f"drafter {text!r} drafts with a causal LM, but the draft {draft!r} is an EAGLE-3 "
                    f"head; leave the drafter out (a head drafts as {readers}) or name {readers}"
                )
            if spec.needs_hidden_states and is_causal_lm_dir(draft):
                raise DraftLabError(
                    f"drafter {text!r} drafts with an EAGLE-3 head, but the draft {draft!r} is a "
                    f"causal LM; pass a head directory (vLLM's speculators or SGLang's layout) as "
                    f"the draft, or leave the drafter out (a causal LM drafts as {DEFAULT_DRAFTER})"
                )


def _check_draft_layers(text: str, spec: DrafterSpec, draft: str) -> None:
    """Refuse a drafter whose parameter counts the draft's decoder layers (Parameter.below_draft_layers) at or above
    their number, read from a local draft's config.json (an HF id not on disk is checked when it loads)."""
    if spec.parameter is None or not spec.parameter.below_draft_layers:
        return
    config = read_config(draft)
    layers = None if config is None else config.get("num_hidden_layers", config.get("n_layer"))
    value = parse_drafter(text)[1]
    if isinstance(layers, int) and isinstance(value, int) and value >= layers:
        symbol = spec.parameter.symbol
        raise DraftLabError(
            f"drafter {text!r} keeps {value} decoder layers, but the draft {draft!r} has {layers}; use "
            f"{spec.name}:{symbol} with {symbol} below {layers}, or a deeper draft (the target itself for self-"
            "speculation)"
        )


def exact_text(v: Variable, value: Any) -> str:
    """A value as text that its parser reads back as the same value: show's `%g` where it is exact (0.7, 4),
    else the float's shortest exact text (0.1234567: %g keeps 6 digits)."""
    shown = v.show(value)
    if v.kind is float and float(shown) != float(value):
        return repr(float(value))
    return shown


def _k_auto(value: object) -> int:
    from engine.config.variables import MAX_K

    text = str(value).strip()
    if not text.isascii() or not text.isdigit() or not 2 <= int(text) <= MAX_K:
        raise DraftLabError(f"k auto's largest k {text[:40]!r} is not a whole number from 2 to {MAX_K}; use e.g. 8")
    return int(text)


def _present(value: object) -> bool:
    """A value a stored cell really holds: not None, NaN or pandas.NA."""
    if value is None:
        return False
    try:
        return bool(value == value)
    except (TypeError, ValueError):
        return False


__all__ = [
    "BASELINE_PARAMETERS",
    "DEFAULTS",
    "PARAMETERS",
    "RUN_PARAMETERS",
    "RunConfig",
    "URL_KEYS",
    "check_drafters",
    "default_drafter",
]
