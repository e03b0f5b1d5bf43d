"""Confirms queued from the dashboard ("Confirm in vLLM" on the experiment detail page): a `server_confirms` row in
status `queued` that a worker claims with one conditional UPDATE (as training jobs are), runs with
app/serving/confirm.py's one measuring loop and closes with storage/records/confirms.py's `finish_confirm`. While it
runs, the worker writes its phase and the requests done of the whole confirm in writes fenced to itself, and its
heartbeat keeps the confirm's fresh; a confirm whose worker is gone is swept to `interrupted` with the measurements it
stored (each configuration is stored whole or not at all) by storage/jobs/liveness.py's sweep, which also ends the vLLM
servers it left running (recorded by `record_servers`).

Everything a confirm needs is checked when it is queued, with the CLI's words: the experiment ran (its prompts are
stored), the configurations exist (the verdict chose one; a k grid has a schedule; a lossless run for `all`),
concurrency and repeats are in range, no other confirm of the experiment is unfinished, and the launcher's cap
(a queued confirm counts as one unfinished run, storage/jobs/experiments.py's check_launcher_cap).

A server cost profile (`draftlab profile`, configs = "profile") is queued the same way, with the lab run whose drafter
it serves and its ks on the row (`profile_runs` chooses and checks the run as app/serving/profile.py does; the worker
builds its configurations there, exactly as the CLI).
"""

from __future__ import annotations

import json
import re

import pandas as pd
from sqlalchemy import insert, text

from storage.db.errors import QueueError
from storage.db.schema import QUEUED, RUNNING, server_confirms, utcnow
from storage.db.store import Store, new_id
from storage.jobs.liveness import confirm_processes
from storage.serving.tree_settings import confirm_refusal

CONFIGS = ("chosen", "schedule", "all")
PROFILE = "profile"  # a server cost profile: one run's drafter at each k of a list (storage/serving/profiles.py)
DEFAULT_PROFILE_KS = (1, 2, 3, 4)  # `draftlab profile --ks`'s default
DEFAULT_PROFILE_REPEATS = 5  # `draftlab profile --repeats`'s default: a profile's interval narrows with passes
MAX_K = 64  # `draftlab profile --ks`'s bound
ACTIVE = (QUEUED, RUNNING)
MAX_CONCURRENCY = 4096  # the CLI's --concurrency bound (app/serving/confirm.py)
MAX_REPEATS = 1000  # the CLI's --repeats bound
DEFAULT_REPEATS = 3  # the fewest passes that give the paired speedup an interval (app/serving/confirm.py's default)
REPORTED = ("phase", "requests_done", "requests_total", "engine_version")


def _whole(value, low: int, high: int, what: str, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise QueueError(f"{what} {value!r} is not a whole number from {low} to {high}; use e.g. {example}")
    return value


def confirm_documents(store: Store, experiment_id: int, configs: str) -> list[tuple[str, dict]]:
    """What a confirm of `configs` serves, as (label, deploy document): the one selection `draftlab confirm`
    (app/serving/confirm.py) and the dashboard's queue both make. `chosen`: the verdict's run (a grid's chosen run
    alone, one k); `schedule`: a k grid's schedule; `all`: every run storage/serving/deploy.py's refusal lets through;
    each one vLLM can serve. Raises QueueError naming what is missing, DeployError (deploy's refusal: the verdict serves
    the target alone, a run is not lossless), KeyError (no such experiment)."""
    from storage.serving.deploy import deploy_document, deployable_runs

    if configs not in CONFIGS:
        raise QueueError(f"configurations {configs!r} is not one of {', '.join(CONFIGS)}; use e.g. chosen")
    if configs == "all":
        runs = deployable_runs(store, experiment_id)
        if not runs:
            raise QueueError(f"experiment {experiment_id} has no finished lossless speculative run to confirm")
        documents = [(f"run {r}", deploy_document(store, experiment_id, r)) for r in runs]
    else:
        document = deploy_document(store, experiment_id)
        if document["answer"]["from"] == "server":  # the server's answer: its k per concurrency, or its one k
            return _server_documents(document, configs)
        if configs == "schedule" and "schedule" not in document:
            raise QueueError(
                f"experiment {experiment_id} has no k schedule (not a batch size × k grid, or one k "
                f"everywhere); confirm `chosen` instead"
            )
        if configs == "chosen" and "schedule" in document:  # a grid's chosen run alone: one k, not the schedule
            document = deploy_document(store, experiment_id, int(document["run_id"]))
        documents = [(configs, document)]
    if configs == "all":  # vLLM serves chains: every token-tree run is left out (tree_settings.confirm_refusal)
        documents = [(label, d) for label, d in documents if confirm_refusal(d) is None] or _only_trees(documents)
    for _, document in documents:
        vllm = document["engines"]["vllm"]
        if not vllm.get("speculative_config"):
            raise QueueError(
                f"run {document['run_id']}: vLLM cannot serve its drafter ({vllm['notes'][0]}); confirm another run"
            )
        if why := confirm_refusal(document):
            raise QueueError(why)
    return documents


def _only_trees(documents: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """`all` over runs that all draft token trees: nothing vLLM serves as measured (QueueError, the first's reason)."""
    reason = confirm_refusal(documents[0][1]) if documents else None
    raise QueueError(f"every run drafts a token tree: {reason}" if reason else "no run to confirm")


def _server_documents(document: dict, configs: str) -> list[tuple[str, dict]]:
    """`chosen` / `schedule` where the server answered (storage/serving/deploy.py: a server cost profile fits):
    `schedule` serves its k per concurrency (num_speculative_tokens_per_batch_size), `chosen` one k, the one it
    serves at the smallest concurrency that speculates. QueueError for a schedule the server's answer does not
    have (one k everywhere)."""
    vllm = document["engines"]["vllm"]
    spec = json.loads(vllm["speculative_config"])
    ranges = spec.pop("num_speculative_tokens_per_batch_size", None)
    if configs == "schedule" and not ranges:
        raise QueueError(
            f"experiment {document['experiment_id']}: the server's answer ({document['answer']['label']}) is one k "
            f"at every concurrency profiled (k={spec['num_speculative_tokens']}); confirm `chosen` instead"
        )
    if configs == "chosen" and ranges:
        spec["num_speculative_tokens"] = next(k for _, _, k in ranges if k)
        vllm = {**vllm, "speculative_config": json.dumps(spec)}
        document = {**document, "engines": {**document["engines"], "vllm": vllm}}
    return [(configs, document)]


def check_configurations(store: Store, experiment_id: int, configs: str) -> None:
    """Refuse (QueueError, the CLI's words: confirm_documents) configurations the experiment cannot give: no
    verdict yet, no k schedule, no lossless speculative run, a drafter vLLM cannot serve."""
    from storage.serving.deploy import DeployError

    try:
        confirm_documents(store, experiment_id, configs)
    except DeployError as exc:
        raise QueueError(str(exc)) from None


def configurations_refusal(store: Store, experiment_id: int, configs: str) -> str | None:
    """Why queuing a confirm of `configs` would be refused (check_configurations' one line), None when it would
    not: the dashboard offers only what it would queue, and says why beside its button."""
    try:
        check_configurations(store, experiment_id, configs)
    except QueueError as exc:
        return str(exc)
    return None


def profile_ks(ks) -> list[int]:
    """A profile's ks, from "1,2,3,4" or a list: each a whole number from 1 to MAX_K, each once; sorted. QueueError
    (one line) otherwise."""
    parts = [p.strip() for p in ks.split(",")] if isinstance(ks, str) else list(ks)
    values = []
    for part in parts:
        value = int(part) if isinstance(part, str) and re.fullmatch("[0-9]{1,6}", part) else part
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_K:
            raise QueueError(
                f"ks {str(ks)[:40]!r}: {str(part)[:20]!r} is not a whole number from 1 to {MAX_K}; list the ks to "
                f"serve, e.g. 1,2,3,4 (k = 0, the target alone, is always measured)"
            )
        values.append(value)
    if not values:
        raise QueueError("no k chosen; list the ks to serve, e.g. 1,2,3,4")
    if len(set(values)) != len(values):
        raise QueueError(f"ks {str(ks)[:40]!r} repeats a value; list each once, e.g. 1,2,3,4")
    return sorted(values)


def profile_runs(store: Store, experiment_id: int) -> list[int]:
    """The lab runs whose drafter a profile may serve, the default first (app/serving/profile.py's choice: the
    verdict's run, else the first finished lossless speculative run). QueueError (one line, the confirm's words) where
    there is none, or where vLLM cannot serve one of them (`draftlab profile` refuses the experiment then too)."""
    from storage.serving.deploy import DeployError

    try:
        runs = [int(document["run_id"]) for _, document in confirm_documents(store, experiment_id, "all")]
    except DeployError as exc:
        raise QueueError(str(exc)) from None
    try:
        ((_, chosen),) = confirm_documents(store, experiment_id, "chosen")
    except (QueueError, DeployError):  # the verdict serves the target alone, or chose none: the first servable run
        return runs
    first = int(chosen["run_id"])
    return [first, *(r for r in runs if r != first)] if first in runs else runs


def profile_run(store: Store, experiment_id: int, run_id: int | None) -> int:
    """The run a profile serves: `run_id` checked (one of `profile_runs`), or the default. QueueError (one line)."""
    runs = profile_runs(store, experiment_id)
    if run_id is None:
        return runs[0]
    if isinstance(run_id, bool) or not isinstance(run_id, int) or run_id not in runs:
        raise QueueError(
            f"run {str(run_id)[:20]} is not a finished lossless speculative run of experiment {experiment_id} that "
            f"vLLM can serve (those: {', '.join(map(str, runs))}); profile one of them"
        )
    return run_id


def profile_refusal(store: Store, experiment_id: int) -> str | None:
    """Why no profile of the experiment can be queued (`profile_runs`' one line), None when one can."""
    try:
        profile_runs(store, experiment_id)
    except QueueError as exc:
        return str(exc)
    return None


def enqueue_confirm(
    store: Store,
    experiment_id: int,
    *,
    configs: str = "chosen",
    concurrency,
    repeats: int = DEFAULT_REPEATS,
    launched_by: str | None = None,
    run_id: int | None = None,
    ks=None,
) -> int:
    """Queue a confirm of the experiment for a worker; return its id. Refused (QueueError, nothing stored) as the
    module docstring lists. configs = PROFILE queues a server cost profile of `run_id`'s drafter (default: as
    `profile_runs` orders them) at each k of `ks` (default DEFAULT_PROFILE_KS); the row holds the run and the ks."""
    profile = configs == PROFILE
    if not profile and (run_id is not None or ks is not None):
        raise QueueError(f"a run and ks are a profile's; configurations {configs!r} serve what the lab chose")
    chosen_ks = profile_ks(DEFAULT_PROFILE_KS if ks is None else ks) if profile else None
    concurrency = list(concurrency or [])
    if not concurrency:
        raise QueueError("no concurrency chosen; pick one or more, e.g. 1 and 4")
    for c in concurrency:
        _whole(c, 1, MAX_CONCURRENCY, "concurrency", "1, 4 or 16")
    if len(set(concurrency)) != len(concurrency):
        raise QueueError(f"concurrency {concurrency} repeats a value; list each once, e.g. 1, 4, 16")
    _whole(repeats, 1, MAX_REPEATS, "passes per server and concurrency", str(DEFAULT_REPEATS))
    with store.read() as conn:
        if conn.execute(text("SELECT 1 FROM experiments WHERE id = :e"), {"e": experiment_id}).first() is None:
            raise QueueError(f"no experiment {experiment_id}; pick one from the Experiments list")
        if (
            conn.execute(
                text("SELECT 1 FROM experiment_prompts WHERE experiment_id = :e"), {"e": experiment_id}
            ).first()
            is None
        ):
            raise QueueError(f"experiment {experiment_id} has no stored prompts yet (it never ran): let it run first")
    if profile:
        run_id = profile_run(store, experiment_id, run_id)
    else:
        check_configurations(store, experiment_id, configs)
    with store.write() as conn:
        from storage.jobs.experiments import check_launcher_cap

        busy = conn.execute(
            text(
                "SELECT id, status FROM server_confirms WHERE experiment_id = :e AND status IN "
                "(:q, :r) ORDER BY id LIMIT 1"
            ),
            {"e": experiment_id, "q": QUEUED, "r": RUNNING},
        ).first()
        if busy is not None:
            raise QueueError(
                f"confirm {busy[0]} of experiment {experiment_id} is {busy[1]}; wait for it to end (one "
                f"confirm of an experiment at a time: both would start servers on the same machine)"
            )
        check_launcher_cap(conn, launched_by, 1)
        return int(
            new_id(
                conn.execute(
                    insert(server_confirms).values(
                        experiment_id=experiment_id,
                        engine="vllm",
                        configs=configs,
                        repeats=repeats,
                        status=QUEUED,
                        concurrency=",".join(map(str, sorted(concurrency))),
                        phase="queued",
                        requests_done=0,
                        launched_by=launched_by[:200] if launched_by else None,
                        profile_run_id=run_id if profile else None,
                        profile_ks=",".join(map(str, chosen_ks)) if chosen_ks else None,
                    )
                )
            )
        )


def next_confirm(store: Store) -> int | None:
    """The oldest queued confirm."""
    with store.read() as conn:
        return conn.execute(
            text("SELECT id FROM server_confirms WHERE status = :q ORDER BY id LIMIT 1"), {"q": QUEUED}
        ).scalar()


def get_confirm(store: Store, confirm_id: int) -> dict | None:
    with store.read() as conn:
        row = (
            conn.execute(text("SELECT * FROM server_confirms WHERE id = :c"), {"c": int(confirm_id)}).mappings().first()
        )
    return dict(row) if row else None


def claim_confirm(store: Store, confirm_id: int, worker_id: str) -> bool:
    """Atomically move a queued confirm to running for worker_id; False if another worker got it first."""
    with store.write() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE server_confirms SET status = :running, worker_id = :w, heartbeat = :now, phase = :phase, "
                    "processes = :processes WHERE id = :id AND status = :queued"
                ),
                {
                    "running": RUNNING,
                    "w": worker_id,
                    "now": utcnow(),
                    "id": int(confirm_id),
                    "queued": QUEUED,
                    "phase": "claimed by a worker",
                    "processes": confirm_processes(),
                },
            ).rowcount
            == 1
        )


def record_servers(store: Store, confirm_id: int, servers) -> None:
    """The vLLM servers this process started for a running confirm ([pid, start time] each), written as soon as each
    exists: a sweep ends them if this process dies with its watchdogs (storage/jobs/liveness.py)."""
    with store.write() as conn:
        conn.execute(
            text("UPDATE server_confirms SET processes = :p WHERE id = :id AND status = :running"),
            {"p": confirm_processes(servers), "id": int(confirm_id), "running": RUNNING},
        )


def report_confirm(store: Store, confirm_id: int, worker_id: str | None, **fields) -> bool:
    """Write a running confirm's progress (REPORTED fields) and heartbeat; with worker_id only while that worker
    owns it. Returns whether it was written (False: swept as stale, no longer this worker's)."""
    unknown = set(fields) - set(REPORTED)
    if unknown:
        raise ValueError(f"unknown confirm fields {sorted(unknown)}")
    if "engine_version" in fields:
        fields["engine_version"] = str(fields["engine_version"])[:200]
    owned = " AND worker_id = :w" if worker_id is not None else ""
    sets = "".join(f", {k} = :{k}" for k in fields)
    with store.write() as conn:
        return (
            conn.execute(
                text(f"UPDATE server_confirms SET heartbeat = :now{sets} WHERE id = :id AND status = :running{owned}"),
                {**fields, "now": utcnow(), "id": int(confirm_id), "running": RUNNING, "w": worker_id},
            ).rowcount
            == 1
        )


# --- reads for the dashboard -------------------------------------------------------------------------------

JOB_COLUMNS = [
    "confirm_id",
    "status",
    "configs",
    "concurrency",
    "repeats",
    "phase",
    "requests_done",
    "requests_total",
    "error",
    "wall_seconds",
    "launched_by",
    "created",
    "profile_run_id",
    "profile_ks",
    "measurements",
]


def confirm_jobs(store: Store, experiment_id: int) -> pd.DataFrame:
    """The experiment's confirms, newest first, with how many measurements each stored (SQL GROUP BY)."""
    from storage.records.frames import _frame

    with store.read() as conn:
        return _frame(
            conn,
            """
            SELECT c.id AS confirm_id, c.status, c.configs, c.concurrency, c.repeats, c.phase, c.requests_done,
                   c.requests_total, c.error, c.wall_seconds, c.launched_by, c.created, c.profile_run_id,
                   c.profile_ks, COUNT(m.id) AS measurements
            FROM server_confirms c LEFT JOIN server_measurements m ON m.confirm_id = c.id
            WHERE c.experiment_id = :e
            GROUP BY c.id, c.status, c.configs, c.concurrency, c.repeats, c.phase, c.requests_done, c.requests_total,
                     c.error, c.wall_seconds, c.launched_by, c.created, c.profile_run_id, c.profile_ks
            ORDER BY c.id DESC""",
            {"e": experiment_id},
            columns=JOB_COLUMNS,
        )


def confirms_version(store: Store, experiment_id: int) -> tuple:
    """A cheap stamp that changes whenever one of the experiment's confirms is queued, moves or stores a
    measurement (the panel's cache key)."""
    with store.read() as conn:
        row = conn.execute(
            text(
                "SELECT COUNT(*), MAX(c.id), MAX(c.heartbeat), SUM(c.requests_done), "
                "SUM(CASE WHEN c.status IN ('queued', 'running') THEN 1 ELSE 0 END), "
                "(SELECT COUNT(*) FROM server_measurements m WHERE m.experiment_id = :e), "
                "MAX(c.status), MIN(c.status) FROM server_confirms c WHERE c.experiment_id = :e"
            ),
            {"e": experiment_id},
        ).one()
    return tuple(str(v) for v in row)
