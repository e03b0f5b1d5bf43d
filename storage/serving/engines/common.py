"""The settings each serving engine takes for one measured run: `deploy_settings(run, experiment)` turns a stored
speculative run (target, draft, k, drafter spec, sampling) into what vLLM, SGLang, llama.cpp and transformers take,
each as a string to paste (a command line or a Python snippet) plus `notes`: what the engine cannot express and what
to check; `refusal` says why a run cannot be deployed. Which run to deploy, and the document around its settings, is
storage/serving/deploy.py's (the verdict's choice, or the server's: storage/serving/profiles.py fits a server cost
profile to a run by these vLLM settings, so they live below both).

Every flag below was checked against the engine's own source or documentation (stored public copies of the
upstream repositories; the files and commits are named next to each mapping). Engines change their flags between
releases; the notes say where a flag is recent.

Drafter specs are described once in engine/config/drafter_specs.py: `model` (constant k), `heuristic` (transformers'
+2/-1 schedule, k restarting at every prompt), `confidence:T` (a round stops after the first draft whose top probability
is below T, that draft kept), `prompt-lookup:N` (longest n-gram n <= N ending the sequence, continuation of its
earliest occurrence; no draft model), `suffix:D` (suffix decoding, no draft model), `eagle3` (an EAGLE-3 head: each
engine is given the head in the layout it loads, engine/config/head_format.py, or the `draftlab convert-head` command
that writes it, `prepare`), `early-exit:L` (the draft's first L layers: transformers runs it with the target as its
own assistant, `Serving.call`). Each declaration carries its
mapping per engine (`DrafterSpec.serving`: the engine's name for the drafting, its settings, what differs); the
engine functions below assemble a command from it and never look at a drafter's name. An engine that cannot express
a drafter gets a tab that says so.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from engine.config.drafter_specs import DEFAULT_DRAFTER, SPECS
from engine.config.drafter_specs import parse_drafter as _parse_spec
from engine.config.head_format import serving_dir
from engine.config.run_config import PARAMETERS, RunConfig
from engine.errors import DraftLabError
from storage.serving.tree_settings import no_tree_note, sglang_tree
from storage.serving.verify_settings import no_block_note, vllm_verify
from storage.serving.vocab_settings import no_intersection_note, transformers_vocab, vllm_vocab

ENGINES = ("vllm", "sglang", "llama_cpp", "transformers")
DRAFTER_NAMES = tuple(SPECS)  # each declares its mapping per engine (DrafterSpec.serving; tests/test_deploy.py)


class DeployError(ValueError):
    """No settings can be derived (no run to choose, a baseline, an unknown drafter): the message says why and
    what to do."""


class NoChosenRun(DeployError):
    """The verdict chooses no run: `reason` says why; the message adds `hint`, what `export` can do about it (its
    --run, --batch-size), which another command (confirm) replaces with its own."""

    def __init__(self, reason: str, hint: str = ""):
        super().__init__(f"{reason}; {hint}" if hint else reason)
        self.reason = reason


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


def _num(value: float) -> str:
    """A float as a flag value: shortest exact text (0.7, 1.0, 0.95)."""
    return repr(float(value))


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


# --- vLLM ------------------------------------------------------------------------------------------------------
# Checked: vllm-project/vllm main, vllm/config/speculative.py @ 002e77c1 (SpeculativeConfig: `method` incl.
# "draft_model" and "ngram", `model`, `num_speculative_tokens` (> 0), `prompt_lookup_max` / `prompt_lookup_min`
# (when only max is given, min is set EQUAL to max in __post_init__, although docs/.../configuration.md says it
# defaults to 1 — so min is always passed here), `draft_sample_method` "greedy" (default: argmax drafts, treated as
# one-hot) | "probabilistic", `num_speculative_tokens_per_batch_size` (dynamic k keyed on batch size));
# docs/features/speculative_decoding/draft_model.md (`vllm serve T --speculative-config '{"model": D,
# "num_speculative_tokens": 5, "method": "draft_model"}'`), n_gram.md, dynamic_speculative_decoding.md;
# vllm/sampling_params.py @ 00388f65 (temperature 0 = greedy, top_k "0 (or -1)" = all tokens, min_p,
# repetition_penalty, seed).


def _drafting(cfg: dict, engine: str):
    """(the drafter's declaration, its Serving on `engine`, parameter) for the run's drafter."""
    name, param = cfg["_drafter"]
    spec = SPECS[name]
    return spec, spec.serving[engine], param


def _not_expressible(cfg: dict, serving) -> dict:
    """The tab of an engine that cannot run the drafter: what it lacks, and no command."""
    notes = serving.texts(cfg["_drafter"][1], cfg["k"])
    return {"language": "text", "command": "", "snippet": f"# {notes[0]}\n", "notes": notes}


def _vllm(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "vllm")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    notes: list[str] = []
    spec = {"method": serving.how}
    prepare = None
    if drafter.needs_model:
        spec["model"], prepare, notes = _draft_for(cfg, serving)
    spec["num_speculative_tokens"] = cfg["k"]
    spec.update(serving.settings(param, cfg["k"]))
    notes += serving.texts(param, cfg["k"])
    verify_spec, verify_notes = vllm_verify(cfg)  # a block run's rejection_sample_method
    spec.update(verify_spec)
    notes += verify_notes
    if drafter.needs_model:
        if not cfg["greedy"] and cfg["draft_sampling"] == "greedy":
            spec["draft_sample_method"] = "greedy"
            notes.append(
                'draft_sample_method "greedy": the drafts are the draft\'s argmax, verified as one-hot, '
                "as DraftLab measured (--draft-sampling greedy); it is vLLM's default, so an older vLLM "
                "without the key behaves the same — drop the key there."
            )
        elif not cfg["greedy"]:
            spec["draft_sample_method"] = "probabilistic"
            notes.append(
                'draft_sample_method "probabilistic" samples the drafts and verifies with their '
                "probabilities, as DraftLab measured; it is recent (vllm/config/speculative.py on main): an "
                "older vLLM rejects the key — drop it there, its drafts are then the draft's argmax "
                "(verified as one-hot), still lossless but with a different acceptance rate than measured: "
                "measure that with --draft-sampling greedy."
            )
    notes += vllm_vocab(cfg, spec)
    notes += _vllm_server_schedule(cfg, spec) if cfg.get("_server") else _vllm_schedule(cfg, spec)
    notes += no_tree_note(cfg, "vllm")
    config_json = json.dumps(spec)
    groups = [["vllm", "serve", _model_ref(cfg["target"])], ["--speculative-config", config_json]]
    if cfg["dtype"] != "auto":
        groups.append(["--dtype", cfg["dtype"]])
    if cfg["trust_remote_code"]:
        groups.append(["--trust-remote-code"])
    command, snippet = _command(groups)
    request = _openai_request(cfg, top_k_off=-1)
    if not cfg["greedy"]:
        request["seed"] = cfg["seed"]
    notes.append(
        "Send the sampling settings with every request (the `request` fields of /v1/completions): by "
        "default vLLM takes missing ones from the model's generation_config.json."
    )
    notes += _length_note(cfg, "Send max_tokens with each request (/v1/completions otherwise stops at 16)")
    notes += _same_distribution_note(cfg)
    return _with_prepare(
        {
            "language": "bash",
            "command": command,
            "snippet": snippet,
            "speculative_config": config_json,
            "request": request,
            "notes": notes,
        },
        prepare,
    )


def _vllm_schedule(cfg: dict, spec: dict) -> list[str]:
    """A grid's k schedule as vLLM's `num_speculative_tokens_per_batch_size` (checked: vllm-project/vllm
    vllm/v1/spec_decode/dynamic/utils.py @ 14b450ca: entries [bs_lo, bs_hi, k], sorted, non-overlapping, the first
    from 1, k >= 0; a gap takes the k of the range before it, batch sizes past the last range take its k, and
    every k is capped at num_speculative_tokens, which must be > 0): num_speculative_tokens becomes the schedule's
    largest k. No schedule (not a grid, or one k everywhere): nothing changes."""
    grid = cfg.get("_schedule")
    if not grid or not grid["ranges"]:
        return []
    ranges = grid["ranges"]
    if len(ranges) == 1:
        return [
            f"The k schedule measured one k at every batch size ({grid['sizes_text']}): "
            f"num_speculative_tokens={ranges[0][2]} alone expresses it."
        ]
    spec["num_speculative_tokens"] = max(k for _, _, k in ranges)
    spec["num_speculative_tokens_per_batch_size"] = ranges
    notes = [
        f"num_speculative_tokens_per_batch_size carries the k schedule measured at batch sizes "
        f"{grid['sizes_text']} ([start_bs, end_bs, k]; k = 0 turns speculation off in that range); "
        f"num_speculative_tokens={spec['num_speculative_tokens']} is its largest k (vLLM caps every entry at it). "
        f"Batch sizes between two measured ones take the k of the smaller one; above {grid['largest']} vLLM "
        f"keeps the last entry's k, which was not measured there."
    ]
    if grid["smallest"] > 1:
        notes.append(
            f"The first range starts at batch size 1 as vLLM requires; batch sizes below "
            f"{grid['smallest']} were not measured."
        )
    notes.append(
        "num_speculative_tokens_per_batch_size is recent (vLLM's dynamic speculative decoding): an older "
        "vLLM rejects the key: drop it there and serve the k of your usual batch size."
    )
    notes.append(
        "vLLM's batch size is the number of requests in a decode step, which changes as requests arrive "
        "and finish; DraftLab's is B prompts decoded together from their start: check the schedule "
        "against vLLM's spec-decode metrics at your traffic."
    )
    return notes


def server_ranges(schedule: dict[int, int]) -> list[list[int]]:
    """{concurrency: k} as vLLM's `num_speculative_tokens_per_batch_size` entries [start_bs, end_bs, k]: the first
    from 1, each concurrency's k until the next one's, equal neighbours joined (storage/analysis/schedule.py's rule)."""
    known = sorted(schedule.items())
    out: list[list[int]] = []
    for i, (c, k) in enumerate(known):
        start = 1 if i == 0 else c
        end = known[i + 1][0] - 1 if i + 1 < len(known) else c
        if out and out[-1][2] == k:
            out[-1][1] = end
        else:
            out.append([start, end, k])
    return out


def schedule_text(predicted: dict) -> str:
    """A prediction's k to serve per concurrency in words, each with its predicted speedup and interval:
    "concurrency 1: k=2 (1.31×, 1.20–1.44); concurrency 4: off"."""

    def cell(c: int, k: int) -> str:
        if k == 0:
            return f"concurrency {c}: off"
        p = predicted["concurrency"][str(c)][str(k)]
        return f"concurrency {c}: k={k} ({p['speedup']:.2f}×, {p['speedup_ci'][0]:.2f}–{p['speedup_ci'][1]:.2f})"

    return "; ".join(cell(int(c), int(k)) for c, k in sorted(predicted["schedule"].items(), key=lambda x: int(x[0])))


def _vllm_server_schedule(cfg: dict, spec: dict) -> list[str]:
    """The k to serve at each concurrency, predicted for the server from the run's acceptance and a server cost
    profile (storage/serving/profiles.py): vLLM's num_speculative_tokens (the largest k) and, where the k changes
    with concurrency, num_speculative_tokens_per_batch_size. Where no concurrency's prediction gains, the run's own
    k stays, with the prediction's word against it."""
    predicted = cfg["_server"]["predicted"]
    schedule = {int(c): int(k) for c, k in predicted["schedule"].items()}
    said = schedule_text(predicted)
    source = f"{predicted['profile']['label']}, from run {predicted['run_id']}'s acceptance and the server's step costs"
    if all(k == 0 for k in schedule.values()):
        return [
            f"The server's answer ({source}): no k's predicted speedup has its interval above 1 at any concurrency "
            f"profiled ({said}). These settings keep the lab's k={cfg['k']}; serve the target alone, or confirm "
            f"(`draftlab confirm`) before serving it."
        ]
    ranges = server_ranges(schedule)
    spec["num_speculative_tokens"] = max(k for _, _, k in ranges)
    if len(ranges) > 1:
        spec["num_speculative_tokens_per_batch_size"] = ranges
    return [
        f"k per concurrency is the server's answer, {source}: {said}. "
        + (
            f"num_speculative_tokens_per_batch_size carries it ([start_bs, end_bs, k]; k = 0 turns speculation off "
            f"there), num_speculative_tokens={spec['num_speculative_tokens']} is its largest k."
            if len(ranges) > 1
            else f"One k at every concurrency profiled: num_speculative_tokens={spec['num_speculative_tokens']}."
        )
    ]


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


# --- SGLang ----------------------------------------------------------------------------------------------------
# Checked: sgl-project/sglang python/sglang/srt/server_args.py @ 001067ff (`--speculative-algorithm` builtins EAGLE,
# EAGLE3, NEXTN, STANDALONE, NGRAM, ...; `--speculative-draft-model-path`; `--speculative-num-steps`;
# `--speculative-eagle-topk`; `--speculative-num-draft-tokens`; ngram: `--speculative-ngram-max-bfs-breadth`
# (default 10), no match-window flags any more); its speculative handler: with topk == 1, num_draft_tokens is
# forced to num_steps + 1 (the count includes the root, the last verified token; cpp_ngram/ngram.cpp passes
# `suffix.back()` as the root for NGRAM too), `--speculative-use-rejection-sampling` raises NotImplementedError
# for anything but EAGLE/EAGLE3; docs/advanced_features/speculative_decoding.md @ 067ad4d3 (STANDALONE = a
# smaller draft LLM; NGRAM = a cache of earlier tokens); adaptive_speculative_decoding.md (`--speculative-adaptive`
# is EAGLE with topk 1 only); sampling_params.py (top_k -1 = whole vocabulary); `--sampling-defaults` ("model":
# defaults from the model's generation_config.json).


def _sglang(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "sglang")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    groups = [
        ["python", "-m", "sglang.launch_server"],
        ["--model-path", _model_ref(cfg["target"])],
        ["--speculative-algorithm", serving.how],
    ]
    prepare: str | None = None
    notes: list[str] = []
    if drafter.needs_model:
        draft, prepare, notes = _draft_for(cfg, serving)
        groups.append(["--speculative-draft-model-path", draft])
    shaped, tree_notes = sglang_tree(cfg, serving.settings(param, cfg["k"]))  # a token tree's topk and nodes
    groups += [[flag, str(value)] for flag, value in shaped]
    notes = serving.texts(param, cfg["k"]) + tree_notes + notes
    if drafter.needs_model and not cfg["greedy"] and serving.sampled is not None:
        flags, sampled_notes = serving.sampled(cfg["draft_sampling"])
        groups += [[flag] if value is None else [flag, str(value)] for flag, value in flags]
        notes += list(sampled_notes)
    elif drafter.needs_model and not cfg["greedy"]:
        notes.append(
            f"At temperature > 0 {serving.how} drafts the draft's argmax and verifies target-only "
            "(--speculative-use-rejection-sampling is EAGLE/EAGLE3 only): lossless, but its acceptance "
            "rate differs from DraftLab's measured alpha."
        )
    if cfg["dtype"] != "auto":
        groups.append(["--dtype", cfg["dtype"]])
    if cfg["trust_remote_code"]:
        groups.append(["--trust-remote-code"])
    command, snippet = _command(groups)
    notes.append(
        "Send the sampling settings with every request (`request`); by default (--sampling-defaults "
        "model) SGLang fills missing ones from the model's generation_config.json."
    )
    notes += _length_note(cfg, "Send max_tokens with each request")
    notes += _same_distribution_note(cfg)
    notes += _schedule_note(cfg, "SGLang (--speculative-adaptive moves k on the accept length, not the batch size)")
    notes += no_block_note(cfg, "sglang")
    notes += no_intersection_note(cfg, "sglang")
    return _with_prepare(
        {
            "language": "bash",
            "command": command,
            "snippet": snippet,
            "request": _openai_request(cfg, top_k_off=-1),
            "notes": notes,
        },
        prepare,
    )


# --- llama.cpp -------------------------------------------------------------------------------------------------
# Checked: ggml-org/llama.cpp common/arg.cpp (the index holds several revisions; these flags read the same in each:
# `-md, --model-draft FNAME`; `--draft-max, --draft, --draft-n N`;
# `--draft-min, --draft-n-min N`; `--draft-p-min P` "minimum speculative decoding probability (greedy)", all for
# llama-server; `--temp`, `--top-k` (0 = disabled), `--top-p` (1.0 = disabled), `--min-p` (0.0 = disabled)),
# common/common.h defaults n_max 16, n_min 0, p_min 0.75 (common/speculative.cpp stops a draft when the top
# candidate's probability < p_min, dropping that token), sampling defaults top_k 40, top_p 0.95, min_p 0.05;
# docs/speculative.md @ 067318e6 (`--spec-type ngram-simple`: the m tokens after the last match of the current
# n-gram; `--spec-ngram-size-n N`, `--spec-ngram-size-m M`).


def _gguf(name: str) -> str:
    return f"{Path(str(name).rstrip('/')).name}.gguf"


def _llama_cpp(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "llama_cpp")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    groups = [["llama-server"], ["-m", _gguf(cfg["target"])]]
    convert = [cfg["target"]]
    if drafter.needs_model:
        convert.append(cfg["draft"])
        groups.append(["-md", _gguf(cfg["draft"])])
    groups += [
        [flag, _num(value) if isinstance(value, float) else str(value)]
        for flag, value in serving.settings(param, cfg["k"])
    ]
    notes = serving.texts(param, cfg["k"])
    if drafter.needs_model:
        notes.append(
            "llama.cpp drafts the draft's most likely tokens and accepts those the target's own sample "
            "matches: lossless, but at temperature > 0 the acceptance rate differs from DraftLab's alpha."
            if not cfg["greedy"]
            else "Greedy: llama.cpp accepts drafts that equal the target's argmax, as DraftLab does."
        )
    if cfg["greedy"]:
        groups.append(["--temp", "0.0"])
    else:
        groups += [
            ["--temp", _num(cfg["temperature"])],
            ["--top-k", str(max(cfg["top_k"], 0))],
            ["--top-p", _num(cfg["top_p"])],
            ["--min-p", "0.0"],
            ["--repeat-penalty", "1.0"],
            ["--seed", str(cfg["seed"])],
        ]
        notes.append(
            "Sampling flags are set explicitly: llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05) "
            "would change the distribution DraftLab measured."
        )
    command, snippet = _command(groups)
    notes.append(
        "llama.cpp loads GGUF files: convert each model with llama.cpp's convert_hf_to_gguf.py ("
        + "; ".join(f"{_model_ref(m)} -> {_gguf(m)}" for m in convert)
        + "). Quantizing the draft or the target changes alpha and c: re-measure before relying on the "
        "speedup."
    )
    notes += _same_distribution_note(cfg)
    notes += _schedule_note(cfg, "llama.cpp")
    notes += no_tree_note(cfg, "llama_cpp")
    notes += no_block_note(cfg, "llama_cpp")
    notes += no_intersection_note(cfg, "llama_cpp")
    return {"language": "bash", "command": command, "snippet": snippet, "notes": notes}


# --- transformers ----------------------------------------------------------------------------------------------
# Checked: transformers 5.24.0 (the version DraftLab's engine tests run), generation/configuration_utils.py
# (num_assistant_tokens, num_assistant_tokens_schedule "heuristic" | "heuristic_transient" | "constant",
# assistant_confidence_threshold, prompt_lookup_num_tokens, max_matching_ngram_size; global defaults 20,
# "constant", 0.4, top_k 50), generation/candidate_generator.py (AssistedCandidateGenerator reads
# num_assistant_tokens, the schedule and the threshold from the ASSISTANT's generation_config — passing them to
# target.generate() does nothing, verified on the demo pair — and re-fits the threshold by ROC when scikit-learn is
# installed; PromptLookupCandidateGenerator takes prompt_lookup_num_tokens / max_matching_ngram_size from the
# call), generation/stopping_criteria.py (ConfidenceCriteria: stop after a drafted token whose probability < T,
# the token kept), generation/utils.py (the criterion only when the threshold > 0); transformers 5.25
# EarlyExitCandidateGenerator: generate(assistant_early_exit=L) makes the target its own assistant, so the schedule
# and threshold are read from the TARGET's generation_config (checked on a tiny Llama: k per round as set there).


OBJECTS = ("assistant_model", "tokenizer", "assistant_tokenizer")  # generate() arguments the snippet names, not values


def _greedy_drafts_note(cfg: dict) -> list[str]:
    """What transformers cannot do with a run that drafted the argmax under sampling (--draft-sampling greedy)."""
    if cfg["greedy"] or cfg["draft_sampling"] != "greedy":
        return []
    return [
        "Not expressible: transformers' assisted generation samples the assistant's drafts from "
        "its distribution when do_sample=True; DraftLab measured argmax drafts "
        "(--draft-sampling greedy), so expect the acceptance of a probabilistic run instead."
    ]


def _transformers(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "transformers")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    notes: list[str] = []
    load = {"dtype": "auto" if cfg["dtype"] == "auto" else cfg["dtype"]}
    if cfg["trust_remote_code"]:
        load["trust_remote_code"] = True
    load_args = ", ".join(f"{key}={value!r}" for key, value in load.items())
    target = _model_ref(cfg["target"])
    lines = [
        "import torch",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({target!r})",
        f"target = AutoModelForCausalLM.from_pretrained({target!r}, {load_args})",
    ]
    kwargs: dict = {}
    assistant: dict = {}
    if not drafter.needs_model:  # a model-free drafter: its settings are generate() arguments
        kwargs.update(serving.settings(param, cfg["k"]))
        notes += serving.texts(param, cfg["k"])
    elif serving.call is not None:  # the target drafts for itself (assistant_early_exit): no assistant model
        notes += _greedy_drafts_note(cfg)
        assistant = serving.settings(param, cfg["k"])
        lines.append("# the target is its own assistant: assisted generation reads these from its generation_config")
        lines += [f"target.generation_config.{key} = {value!r}" for key, value in assistant.items()]
        kwargs.update(serving.call(param, cfg["k"]))
        notes += serving.texts(param, cfg["k"])
        if _model_ref(cfg["draft"]) != target:
            notes.append(
                f"Not expressible: transformers drafts with the target's own layers; this run drafted with another "
                f"model's ({cfg['draft']}), so the served drafts differ from those measured: measure the drafter "
                f"with --draft {cfg['target']} to serve it here."
            )
    else:
        notes += _greedy_drafts_note(cfg)
        assistant = serving.settings(param, cfg["k"])
        draft = _model_ref(cfg["draft"])
        lines.append(f"draft = AutoModelForCausalLM.from_pretrained({draft!r}, {load_args})")
        lines.append("# assisted generation reads these from the draft's generation_config, not from generate()")
        lines += [f"draft.generation_config.{key} = {value!r}" for key, value in assistant.items()]
        kwargs["assistant_model"] = "draft"
        notes += transformers_vocab(cfg, lines, kwargs)
        notes.append(
            "num_assistant_tokens, num_assistant_tokens_schedule and assistant_confidence_threshold are "
            "set on draft.generation_config: transformers' AssistedCandidateGenerator reads them there "
            "(given to generate() they are ignored, leaving the defaults k=20 and threshold 0.4)."
        )
        notes += serving.texts(param, cfg["k"])
    if cfg["greedy"]:
        kwargs["do_sample"] = False
    else:
        kwargs.update(do_sample=True, temperature=cfg["temperature"], top_k=max(cfg["top_k"], 0), top_p=cfg["top_p"])
        notes.append(
            "top_k=0 disables top-k (transformers' default is 50); the model's generation_config.json "
            "still supplies any other sampling setting it names."
        )
    if cfg["max_new_tokens"] is not None:
        kwargs["max_new_tokens"] = cfg["max_new_tokens"]
    notes += _length_note(
        cfg,
        "Pass max_new_tokens to generate() (without it the model's generation_config "
        "decides, 20 tokens in total by default)",
    )
    rendered = ", ".join(f"{key}={value}" if key in OBJECTS else f"{key}={value!r}" for key, value in kwargs.items())
    lines += [
        "",
        f"torch.manual_seed({cfg['seed']})",
        'inputs = tokenizer("def fibonacci(n):", return_tensors="pt").to(target.device)',
        f"output = target.generate(**inputs, {rendered})",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
    ]
    notes += _same_distribution_note(cfg)
    if cfg.get("_schedule"):
        notes.append(
            f"transformers' assisted generation decodes one request at a time: these settings take the "
            f"schedule's batch {cfg['_schedule']['for_batch']} entry (k={cfg['k']})."
        )
    notes += no_tree_note(cfg, "transformers")
    notes += no_block_note(cfg, "transformers")
    generate_kwargs = {key: value for key, value in kwargs.items() if key not in OBJECTS}
    return {
        "language": "python",
        "snippet": "\n".join(lines) + "\n",
        "generate_kwargs": generate_kwargs,
        "assistant_generation_config": assistant,
        "notes": notes,
    }


# --- public API ------------------------------------------------------------------------------------------------


def deploy_settings(
    run: dict,
    experiment: dict,
    with_max_new_tokens: bool = False,
    schedule: dict | None = None,
    for_batch: int | None = None,
    server: dict | None = None,
) -> dict:
    """{"vllm": ..., "sglang": ..., "llama_cpp": ..., "transformers": ...} for one speculative run.

    Each engine: `snippet` (what to paste: a command with one flag per line, or Python), `language`, `notes`
    (what it cannot express, what to check); commands also as one line (`command`); vLLM's JSON
    (`speculative_config`); vLLM/SGLang request sampling fields (`request`); transformers' literal generate()
    arguments (`generate_kwargs`) and the draft's generation_config (`assistant_generation_config`).
    `run`: a row of queries.runs() as a dict (draft / drafter optional), `experiment`: queries.experiment();
    with_max_new_tokens: carry the test's max_new_tokens (a measurement budget) as the length. schedule: a k
    grid's storage/analysis/schedule.py Schedule.as_dict() (vLLM takes it as num_speculative_tokens_per_batch_size, the
    other engines say they cannot); for_batch: the batch size whose entry the one-k engines take (default the
    smallest). server: a run's prediction for the server (storage/serving/profiles.run_prediction, with a profile):
    vLLM's k per concurrency comes from it instead of the lab's grid (the other engines keep the lab's figures)."""
    cfg = configuration(run, experiment or {}, with_max_new_tokens)
    if server is not None:
        cfg["_server"] = {"predicted": server}
    if schedule and schedule.get("num_speculative_tokens_per_batch_size"):
        sizes = [step["batch_size"] for step in schedule["steps"] if step["k"] is not None]
        cfg["_schedule"] = {
            "ranges": schedule["num_speculative_tokens_per_batch_size"],
            "smallest": min(sizes),
            "for_batch": for_batch if for_batch is not None else min(sizes),
            "largest": max(sizes),
            "sizes_text": ", ".join(map(str, sizes)),
            "steps_text": "; ".join(
                f"batch {step['batch_size']}: " + (f"k={step['k']}" if step["k"] else "off")
                for step in schedule["steps"]
                if step["k"] is not None
            ),
        }
    engines = {
        "vllm": _vllm(cfg),
        "sglang": _sglang(cfg),
        "llama_cpp": _llama_cpp(cfg),
        "transformers": _transformers(cfg),
    }
    for settings in engines.values():  # what no engine does as measured, whatever its flags
        settings["notes"] = [*settings["notes"], *cfg["_notes"]]
    return engines


# What a run that did not finish needs before it can be deployed, by its status (a failed one: nothing).
_UNFINISHED_FIX = {
    "queued": "wait for it to run",
    "running": "wait for it to finish",
    "interrupted": "`draftlab resume {eid}` finishes it",
    "cancelled": "`draftlab resume {eid}` finishes it",
}


def refusal(row) -> str | None:
    """Why a run (a queries.runs() row) cannot be deployed or confirmed, None when it can: the one check that
    `draftlab export --format deploy` (a named --run and the verdict's choice alike), the "Use these settings" panel
    and `draftlab confirm` (every --configs) run. A baseline; a run that did not finish (queued, running,
    interrupted, cancelled or failed: what it measured is partial, or nothing); one that is not lossless (its greedy
    outputs differ from its baseline's: queries.lossy, which the verdict never chooses either)."""
    rid, eid = int(row["run_id"]), int(row["experiment_id"])
    if row["kind"] != "speculative":
        return f"run {rid} is the target-only baseline; pick a speculative run of experiment {eid}"
    error = row.get("error")
    why = f": {error}" if isinstance(error, str) and error.strip() else ""
    if row["status"] != "done":
        state = "failed" if row["status"] == "failed" else f"is {row['status']}, not finished"
        fix = _UNFINISHED_FIX.get(row["status"], "").format(eid=eid)
        return (
            f"run {rid} {state}{why}; {fix + ', or ' if fix else ''}pick a finished run of experiment {eid} "
            f"(`draftlab list` shows them)"
        )
    if row["outputs_match_baseline"] is False:
        return (
            f"run {rid} is not lossless (its greedy outputs differ from its baseline's{why}); pick a run whose "
            f"outputs match"
        )
    return None


def deployable_runs(store, experiment_id: int) -> list[int]:
    """The experiment's runs that `refusal` lets through (`draftlab confirm --configs all`), in queries.runs() order."""
    from storage.records import queries as q

    runs = q.runs(store, experiment_id)
    return [int(row["run_id"]) for _, row in runs.iterrows() if refusal(row) is None]


def named_run(store, experiment_id: int, run_id: int):
    """The runs row (queries.runs()) of a run named to deploy; DeployError when it is not the experiment's or
    `refusal` refuses it."""
    from storage.records import queries as q

    runs = q.runs(store, experiment_id)
    rows = runs[runs["run_id"] == int(run_id)]
    if rows.empty:
        raise DeployError(
            f"run {run_id} is not a run of experiment {experiment_id}; `draftlab list` shows each experiment's runs"
        )
    row = rows.iloc[0]
    if why := refusal(row):
        raise DeployError(why)
    return row


def run_vllm_settings(store, experiment_id: int, run_id: int) -> tuple[str, dict]:
    """(the target as the experiment names it, vLLM's deploy settings) of one named run, without the verdict or the
    grid (what a server cost profile is fitted by: storage/serving/profiles.py). KeyError: no such experiment;
    DeployError: deploy_document's refusal of a named run."""
    from storage.records import queries as q
    from storage.serving.plain import plain

    experiment = q.experiment(store, experiment_id)
    if experiment is None:
        raise KeyError(experiment_id)
    row = named_run(store, experiment_id, run_id)
    stored = {key: value for key, value in q.run_row(store, run_id).items() if key != "id"}
    cfg = configuration(plain({**stored, **row.to_dict()}), experiment)
    return str(cfg["target"]), _vllm(cfg)
