"""The run's configuration as the serving engines read it, and what every engine's tab shares. `configuration` is
engine/config/run_config.py's configuration of the run, its drafter parsed as the engines read it (`DeployError` when
no settings can be derived); the shared parts: the drafter's mapping on an engine (DrafterSpec.serving;
`_not_expressible`, the tab of an engine that cannot run it), the draft an engine loads (`_draft_for`: an EAGLE-3 head
in the layout that engine reads, with the command that writes it), a command's formatting, an OpenAI-style request's
sampling fields, and the notes several engines add (no length set, sampled outputs alike in distribution only, a k
schedule an engine cannot take).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from engine.config.drafter_specs import DEFAULT_DRAFTER, SPECS
from engine.config.drafter_specs import parse_drafter as _parse_spec
from engine.config.head_format import serving_dir
from engine.config.run_config import PARAMETERS, RunConfig
from engine.errors import DraftLabError


class DeployError(ValueError):
    """No settings can be derived (no run to choose, a baseline, an unknown drafter): the message says why and
    what to do."""


# --- inputs ----------------------------------------------------------------------------------------------------


def parse_drafter(spec) -> tuple[str, float | int | None]:
    """(name, parameter) of a stored drafter spec, read as the engine reads it (engine/config/drafter_specs.py).
    Empty/None means `model` (runs stored before drafters existed); a spec no engine mapping knows is a DeployError."""
    text = str(spec).strip() if _present(spec) else ""
    if not text:
        return DEFAULT_DRAFTER, None
    try:
        return _parse_spec(text)
    except DraftLabError as exc:
        raise DeployError(f"{exc} (no serving-engine mapping for {text[:60]!r})") from None


def _present(value) -> bool:
    """A value a stored cell really holds: not None, NaN or pandas.NA."""
    if value is None:
        return False
    try:
        return bool(value == value)  # False for NaN
    except (TypeError, ValueError):  # pandas.NA: its truth is ambiguous
        return False


def _pick(run: dict, experiment: dict, key: str, default=None):
    """A setting: the run's own value (a sweep varies it per run), else the experiment's, else `default`."""
    for source in (run, experiment, experiment.get("sampling") or {}):
        value = source.get(key) if isinstance(source, dict) else None
        if _present(value) and str(value).strip() != "":
            return value
    return default


def _model_ref(name: str) -> str:
    """A model name an engine can load: DraftLab's shipped demo models are directories inside the package."""
    from engine.zoo import resolve  # plain pathlib; no torch

    path = resolve(name)
    return str(path) if path is not None else name


def _draft_for(cfg: dict, serving) -> tuple[str, str | None, list[str]]:
    """(the draft an engine loads, the command that writes it first or None, notes): the draft model, or for an
    EAGLE-3 head the head in the layout the engine reads (Serving.draft_layout, engine/config/head_format.py): the head
    itself, else its `<layout>` subdirectory, which `draftlab convert-head` writes (train-head writes `sglang`)."""
    draft = _model_ref(cfg["draft"])
    if serving.draft_layout is None:
        return draft, None, []
    where, present = serving_dir(draft, serving.draft_layout)
    if present and where == Path(draft).expanduser():
        return draft, None, []
    if present:
        return (
            str(where),
            None,
            [
                f"{where} holds the head in the {serving.draft_layout} layout this engine loads "
                f"(the run drafted with {draft})."
            ],
        )
    convert = shlex.join(["draftlab", "convert-head", draft, "--to", serving.draft_layout, "--out", str(where)])
    return (
        str(where),
        convert,
        [
            f"Write the head in the {serving.draft_layout} layout first: `{convert}` (its aux "
            f"layer ids converted to that layout's convention); the command below serves "
            f"{where}."
        ],
    )


def _with_prepare(settings: dict, prepare: str | None) -> dict:
    """A tab whose command needs a file written first: the command that writes it (`prepare`) heads its snippet."""
    if prepare is not None:
        settings["prepare"] = prepare
        settings["snippet"] = f"# first:\n{prepare}\n\n{settings['snippet']}"
    return settings


def configuration(run: dict, experiment: dict, with_max_new_tokens: bool = False) -> dict:
    """The run's settings that matter to an engine: engine/config/run_config.py's configuration of the run (every
    parameter, the run's own value else the experiment's, else its default for values older databases lack).
    max_new_tokens: the test's budget when `with_max_new_tokens`, else None (each engine's own default or the
    user's length). `_notes`: what the engines do differently with a parameter's value (Variable.serving_note)."""
    name, param = parse_drafter(_pick(run, {}, "drafter") or experiment.get("drafter") or DEFAULT_DRAFTER)
    k = _pick(run, experiment, "k")
    if not _present(k) or int(k) < 1:
        raise DeployError(
            f"run {run.get('run_id')} has no draft length k (a baseline runs the target alone); pick a speculative run"
        )
    try:
        config = RunConfig.of_run({**run, "drafter": SPECS[name].spec(param)}, experiment)
    except DraftLabError as exc:
        raise DeployError(f"run {run.get('run_id')}: {exc}") from None
    needs_model = SPECS[name].needs_model
    draft = config.value("draft")
    if needs_model and not draft:
        raise DeployError(f"run {run.get('run_id')} drafts with a draft model ({name}) but none is stored for it")
    settings = config.run_settings()
    measured_tokens = settings.pop("max_new_tokens")
    notes = [
        note
        for key, value in settings.items()
        if (serving_note := PARAMETERS[key].serving_note) is not None and (note := serving_note(value, settings))
    ]
    return {
        "run_id": int(run["run_id"]) if _present(run.get("run_id")) else None,
        "experiment_id": int(eid) if (eid := _pick(run, experiment, "experiment_id")) is not None else None,
        "target": str(experiment.get("target") or ""),
        **settings,
        "draft": str(draft) if draft and needs_model else None,
        "drafter": name if param is None else f"{name}:{param:g}" if isinstance(param, float) else f"{name}:{param}",
        "max_new_tokens": measured_tokens if with_max_new_tokens else None,
        "_measured_max_new_tokens": measured_tokens,
        "dtype": str(experiment.get("dtype") or "auto"),
        "trust_remote_code": bool(experiment.get("trust_remote_code") or False),
        "greedy": settings["temperature"] <= 0,
        # SPEC "Drafts with another vocabulary": "intersection" when the draft has another tokenizer
        "vocab": run.get("vocab") if isinstance(run.get("vocab"), str) else None,
        "vocab_coverage": float(run["vocab_coverage"]) if _present(run.get("vocab_coverage")) else None,
        "_drafter": (name, param),
        "_notes": notes,
    }


# --- formatting ------------------------------------------------------------------------------------------------


def _command(groups: list[list[str]]) -> tuple[str, str]:
    """(one-line command, the same with one flag per line and `\\` continuations for display)."""
    quoted = [" ".join(shlex.quote(part) for part in group) for group in groups]
    return " ".join(quoted), " \\\n    ".join(quoted)


def _length_note(cfg: dict, how: str) -> list[str]:
    """What an engine does without max_new_tokens (not carried unless asked): `how` says where to set a length."""
    if cfg["max_new_tokens"] is not None:
        return [
            f"The length is the test's budget, {cfg['max_new_tokens']} new tokens (copied as asked); set your "
            f"own for real requests."
        ]
    return [
        f"No length is set: the test stopped at {cfg['_measured_max_new_tokens']} new tokens to measure, not as a "
        f"serving setting. {how} (`draftlab export --format deploy --with-max-new-tokens` copies the test's)."
    ]


def _same_distribution_note(cfg: dict) -> list[str]:
    if cfg["greedy"]:
        return []
    return [
        f"DraftLab draws prompt i from a generator seeded by (seed={cfg['seed']}, i); no engine draws the same "
        f"way, so sampled outputs match DraftLab's in distribution, not token for token."
    ]


# --- an engine's drafting --------------------------------------------------------------------------------------


def _drafting(cfg: dict, engine: str):
    """(the drafter's declaration, its Serving on `engine`, parameter) for the run's drafter."""
    name, param = cfg["_drafter"]
    spec = SPECS[name]
    return spec, spec.serving[engine], param


def _not_expressible(cfg: dict, serving) -> dict:
    """The tab of an engine that cannot run the drafter: what it lacks, and no command."""
    notes = serving.texts(cfg["_drafter"][1], cfg["k"])
    return {"language": "text", "command": "", "snippet": f"# {notes[0]}\n", "notes": notes}


def _schedule_note(cfg: dict, engine: str) -> list[str]:
    """For an engine that cannot take a k per batch size: what the measured schedule says, and which k these
    settings serve."""
    grid = cfg.get("_schedule")
    if not grid or len({k for _, _, k in grid["ranges"]}) < 2:
        return []
    return [
        f"Not expressible: {engine} takes one k for every batch size; these settings serve k={cfg['k']}, the "
        f"schedule's entry for batch {grid['for_batch']} (`--batch-size` / the panel's batch size picks another). "
        f"The measured schedule: {grid['steps_text']}."
    ]


def _openai_request(cfg: dict, top_k_off: int) -> dict:
    """Sampling fields of an OpenAI-style completion request (vLLM and SGLang accept top_k, min_p and
    repetition_penalty there too). top_k_off: the engine's value for "no top-k"."""
    length = {} if cfg["max_new_tokens"] is None else {"max_tokens": cfg["max_new_tokens"]}
    if cfg["greedy"]:
        return {"temperature": 0.0, **length}
    return {
        "temperature": cfg["temperature"],
        "top_p": cfg["top_p"],
        "top_k": cfg["top_k"] if cfg["top_k"] > 0 else top_k_off,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        **length,
    }
