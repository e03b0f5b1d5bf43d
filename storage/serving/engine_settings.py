"""The settings each serving engine takes for one measured run: `deploy_settings(run, experiment)` turns a stored
speculative run (target, draft, k, drafter spec, sampling) into what vLLM, SGLang, llama.cpp and transformers take,
each as a string to paste (a command line or a Python snippet) plus `notes`: what the engine cannot express and what
to check; `refusal` says why a run cannot be deployed. Which run to deploy, and the document around its settings, is
storage/serving/deploy.py's (the verdict's choice, or the server's: storage/serving/profiles.py fits a server cost
profile to a run by these vLLM settings, so they live below both). Each engine's tab is built by its module in
storage/serving/engines/ (common.py: the run's configuration and what the tabs share); this module assembles them and
re-exports the names its importers use.

Every flag was checked against the engine's own source or documentation (stored public copies of the upstream
repositories; the files and commits are named in each engine's module). Engines change their flags between
releases; the notes say where a flag is recent.

Drafter specs are described once in engine/config/drafter_specs.py: `model` (constant k), `heuristic` (transformers'
+2/-1 schedule, k restarting at every prompt), `confidence:T` (a round stops after the first draft whose top probability
is below T, that draft kept), `prompt-lookup:N` (longest n-gram n <= N ending the sequence, continuation of its
earliest occurrence; no draft model), `suffix:D` (suffix decoding, no draft model), `eagle3` (an EAGLE-3 head: each
engine is given the head in the layout it loads, engine/config/head_format.py, or the `draftlab convert-head` command
that writes it, `prepare`), `early-exit:L` (the draft's first L layers: transformers runs it with the target as its
own assistant, `Serving.call`). Each declaration carries its mapping per engine (`DrafterSpec.serving`: the
engine's name for the drafting, its settings, what differs); the engine modules assemble a command from it and never
look at a drafter's name. An engine that cannot express a drafter gets a tab that says so.
"""

from __future__ import annotations

from engine.config.drafter_specs import SPECS
from storage.serving.engines.common import DeployError, configuration, parse_drafter
from storage.serving.engines.llama_cpp import _llama_cpp
from storage.serving.engines.sglang import _sglang
from storage.serving.engines.transformers import _transformers
from storage.serving.engines.vllm import _vllm, schedule_text, server_ranges

__all__ = [
    "DRAFTER_NAMES",
    "ENGINES",
    "DeployError",
    "NoChosenRun",
    "configuration",
    "deploy_settings",
    "deployable_runs",
    "named_run",
    "parse_drafter",
    "refusal",
    "run_vllm_settings",
    "schedule_text",
    "server_ranges",
]


ENGINES = ("vllm", "sglang", "llama_cpp", "transformers")
DRAFTER_NAMES = tuple(SPECS)  # each declares its mapping per engine (DrafterSpec.serving; tests/test_deploy.py)


class NoChosenRun(DeployError):
    """The verdict chooses no run: `reason` says why; the message adds `hint`, what `export` can do about it (its
    --run, --batch-size), which another command (confirm) replaces with its own."""

    def __init__(self, reason: str, hint: str = ""):
        super().__init__(f"{reason}; {hint}" if hint else reason)
        self.reason = reason


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
