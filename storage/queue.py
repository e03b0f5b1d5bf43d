"""The run queue: enqueue experiments, claim runs atomically, heartbeats, progress, cancel and resume.

Claiming is one conditional UPDATE (`... WHERE id = :id AND status = 'queued'`) whose row count says who won,
so two workers never take the same run, on SQLite (writes serialise) and PostgreSQL (row locks; claims are
also serialised by an advisory lock so "one running run per experiment" holds under READ COMMITTED).
"""
from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from typing import Iterable, Sequence

from sqlalchemy import insert, select, text

from .schema import (BASELINE, CANCELLED, DONE, FAILED, INTERRUPTED, QUEUED, RUNNING, SPECULATIVE, Experiment,
                     Run, experiment_prompts, experiments, runs, utcnow,
                     verify_profile, workers)
from .errors import QueueError
from .settings import DEFAULT_STALE_SECONDS, STALE_ENV, STALE_HELP, seconds_setting, stale_window  # noqa: F401
from .store import Store

SWEEPABLE = ("k", "temperature", "top_k", "top_p", "draft", "drafter")
CATEGORICAL = ("draft", "drafter")  # swept values are names; runs of one sweep share a baseline
# Drafters that propose without a draft model: their runs record no draft (engine.drafting.needs_draft_model
# decides; storage cannot import the engine, and a test holds the two equal).
NO_MODEL_DRAFTERS = ("prompt-lookup",)
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "seed", "max_new_tokens")
_CLAIM_LOCK = 704202  # PostgreSQL advisory-lock key for claims

def _normalize_tags(tags: Iterable[str] | str) -> str:
    items = tags.split(",") if isinstance(tags, str) else list(tags)
    cleaned = [t.strip() for t in items if t and t.strip()]
    return ",".join(dict.fromkeys(cleaned))


def enqueue_experiment(store: Store, *, name: str | None, target: str, draft: str, prompts: str, sampling: dict,
                       device: str = "auto", dtype: str = "auto", sweep_variable: str = "k",
                       sweep_values: Sequence[float] = (1, 2, 4), k: int = 4, notes: str = "",
                       tags: Iterable[str] | str = (), prompt_texts: Sequence[str] | None = None,
                       trust_remote_code: bool = False, reserved_for: str | None = None, repeats: int = 1,
                       k_auto: int | None = None, drafter: str = "model", validates: int | None = None,
                       chat_template: str = "auto") -> int:
    """Create an experiment with its target-only baseline(s) and one speculative run per sweep value, all
    queued; return the experiment id. A k sweep shares one baseline; a sampling sweep gets one per value
    (speedup compares equal sampling configs); a draft or drafter sweep shares one baseline, each run naming its
    draft model and drafter spec. prompt_texts freezes the prompts now (else the worker loads
    the `prompts` spec when the first run starts). reserved_for: only that worker may claim the runs.
    repeats: timed decodes per prompt and arm (medians used). k_auto: "predict, then confirm" up to that k —
    only the baseline and k = k_auto are queued; the worker predicts the curve and queues the best k values.
    chat_template: how conversation prompts become text (engine/chat.py): auto, none, or a template's text."""
    if int(repeats) < 1:
        raise QueueError(f"repeats must be >= 1 (got {repeats}); use e.g. --repeats 3")
    if k_auto is not None:
        if int(k_auto) < 2:
            raise QueueError(f"--k auto needs a largest k of at least 2 (got {k_auto}); use e.g. --k auto or auto:8")
        sweep_variable, sweep_values, k = "k", [int(k_auto)], int(k_auto)
    if sweep_variable not in SWEEPABLE:
        raise QueueError(f"cannot sweep {sweep_variable!r}; sweep one of {', '.join(SWEEPABLE)}")
    values = list(sweep_values)
    if not values:
        raise QueueError("sweep_values is empty; give at least one value, e.g. k = 1, 2, 4")
    unknown = set(sampling) - set(SAMPLING_KEYS)
    if unknown:
        raise QueueError(f"unknown sampling settings {sorted(unknown)}; use {', '.join(SAMPLING_KEYS)}")
    config = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "max_new_tokens": 128, **sampling}
    if sweep_variable == "k":
        values = [int(v) for v in values]
        if any(v <= 0 for v in values):
            raise QueueError(f"k values must be >= 1 (got {values})")
    if sweep_variable in CATEGORICAL:
        values = [str(v).strip() for v in values]
        if any(not v for v in values) or len(set(values)) < len(values):
            raise QueueError(f"{sweep_variable} values must be distinct and non-empty (got {values})")
    drafter_of = lambda v: v if sweep_variable == "drafter" else drafter  # noqa: E731

    def draft_of(v):
        if str(drafter_of(v)).split(":")[0] in NO_MODEL_DRAFTERS:
            return None
        return v if sweep_variable == "draft" else draft
    name = name or f"{','.join(values) if sweep_variable == 'draft' else draft} → {target} on {prompts}"
    with store.session() as s:
        exp = Experiment(name=name, notes=notes or "", tags=_normalize_tags(tags), target=target, drafter=drafter,
                         validates=validates, chat_template=chat_template or "auto",
                         draft=",".join(values) if sweep_variable == "draft" else draft,
                         prompts=prompts, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                         k=int(k), sweep_variable=sweep_variable, sweep_values=json.dumps(values), repeats=int(repeats),
                         k_auto=int(k_auto) if k_auto is not None else None, **config)
        s.add(exp)
        s.flush()
        common = {"experiment_id": exp.id, "status": QUEUED, "reserved_for": reserved_for}
        if sweep_variable in ("k", *CATEGORICAL):
            baseline = Run(kind=BASELINE, k=None, sweep_value=None, **common, **config)
            s.add(baseline)
            s.flush()
            for i, v in enumerate(values):
                s.add(Run(kind=SPECULATIVE, k=v if sweep_variable == "k" else int(k),
                          sweep_value=v if sweep_variable == "k" else i, sweep_label=str(v), draft=draft_of(v),
                          drafter=drafter_of(v), baseline_run_id=baseline.id, **common, **config))
        else:
            for v in values:
                run_config = {**config, sweep_variable: v}
                baseline = Run(kind=BASELINE, k=None, sweep_value=v, **common, **run_config)
                s.add(baseline)
                s.flush()
                s.add(Run(kind=SPECULATIVE, k=int(k), sweep_value=v, sweep_label=f"{v:g}", draft=draft, drafter=drafter,
                          baseline_run_id=baseline.id, **common, **run_config))
        if prompt_texts is not None:
            s.flush()
            s.execute(insert(experiment_prompts), [{"experiment_id": exp.id, "prompt_index": i, "prompt": p}
                                                   for i, p in enumerate(prompt_texts)])
        return exp.id


def add_k_runs(store: Store, experiment_id: int, ks: Sequence[int]) -> list[int]:
    """Queue a new timed pass of an experiment: a fresh baseline and one speculative run per k, paired with
    it (the confirmation step of `--k auto`); reserved like the experiment's first runs. Returns run ids."""
    exp = get_experiment(store, experiment_id)
    with store.read() as conn:
        reserved = conn.execute(text("SELECT reserved_for FROM runs WHERE experiment_id = :eid ORDER BY id LIMIT 1"),
                                {"eid": experiment_id}).scalar()
    config = {key: exp[key] for key in SAMPLING_KEYS}
    common = {"experiment_id": experiment_id, "status": QUEUED, "reserved_for": reserved}
    with store.session() as s:
        baseline = Run(kind=BASELINE, k=None, sweep_value=None, **common, **config)
        s.add(baseline)
        s.flush()
        added = [Run(kind=SPECULATIVE, k=int(k), sweep_value=int(k), sweep_label=str(int(k)), draft=exp["draft"],
                     drafter=exp["drafter"], baseline_run_id=baseline.id, **common, **config) for k in ks]
        s.add_all(added)
        s.flush()
        return [baseline.id] + [r.id for r in added]


def set_predicted_curve(store: Store, experiment_id: int, curve: dict, confirmed: Sequence[int]) -> None:
    with store.write() as conn:
        conn.execute(text("UPDATE experiments SET predicted_curve = :c WHERE id = :eid"),
                     {"c": json.dumps({"curve": {str(k): v for k, v in curve.items()}, "confirmed": list(confirmed)}),
                      "eid": experiment_id})


def store_prompts(store: Store, experiment_id: int, prompts: Sequence[str]) -> list[str]:
    """Freeze an experiment's prompt texts (first writer wins); return the stored ones."""
    with store.write() as conn:
        existing = load_experiment_prompts(conn, experiment_id)
        if existing is None:
            conn.execute(insert(experiment_prompts), [{"experiment_id": experiment_id, "prompt_index": i, "prompt": p}
                                                      for i, p in enumerate(prompts)])
            return list(prompts)
        return existing


def load_experiment_prompts(conn, experiment_id: int) -> list[str] | None:
    rows = conn.execute(text("SELECT prompt FROM experiment_prompts WHERE experiment_id = :eid ORDER BY prompt_index"),
                        {"eid": experiment_id}).scalars().all()
    return list(rows) if rows else None


# --- cancel / resume -------------------------------------------------------------------------------------

def _cancel(store: Store, where: str, params: dict) -> int:
    now = utcnow()
    with store.write() as conn:
        n = conn.execute(text(f"UPDATE runs SET status = :cancelled, finished = :now "
                              f"WHERE {where} AND status IN (:queued, :interrupted)"),
                         {**params, "cancelled": CANCELLED, "now": now, "queued": QUEUED, "interrupted": INTERRUPTED}).rowcount
        n += conn.execute(text(f"UPDATE runs SET cancel_requested = :yes WHERE {where} AND status = :running"),
                          {**params, "yes": True, "running": RUNNING}).rowcount
    return n


def cancel_run(store: Store, run_id: int) -> bool:
    """Cancel a queued run now, or ask its worker to stop a running one between rounds (rows kept)."""
    return _cancel(store, "id = :rid", {"rid": run_id}) > 0


def cancel_experiment(store: Store, experiment_id: int) -> int:
    """Cancel every queued or running run of an experiment; return how many."""
    return _cancel(store, "experiment_id = :eid", {"eid": experiment_id})


def interrupt_queued(store: Store, experiment_id: int, reason: str) -> int:
    """Mark an experiment's still-queued runs `interrupted` (its foreground `draftlab run` was stopped)."""
    with store.write() as conn:
        return conn.execute(text("UPDATE runs SET status = :interrupted, error = :reason, reserved_for = NULL "
                                 "WHERE experiment_id = :eid AND status = :queued"),
                            {"interrupted": INTERRUPTED, "reason": reason, "eid": experiment_id,
                             "queued": QUEUED}).rowcount


def _resume(store: Store, where: str, params: dict) -> int:
    with store.write() as conn:
        # Queued runs reserved for a (gone) foreground worker become claimable by any worker.
        conn.execute(text(f"UPDATE runs SET reserved_for = NULL WHERE {where} AND status = :queued"),
                     {**params, "queued": QUEUED})
        return conn.execute(text(
            f"UPDATE runs SET status = :queued, error = NULL, error_detail = NULL, cancel_requested = :no, "
            f"reserved_for = NULL, finished = NULL WHERE {where} AND status IN (:interrupted, :failed, :cancelled)"),
            {**params, "queued": QUEUED, "no": False, "interrupted": INTERRUPTED, "failed": FAILED,
             "cancelled": CANCELLED}).rowcount


def resume_run(store: Store, run_id: int) -> bool:
    """Requeue an interrupted, failed or cancelled run; a worker continues it from its first unfinished
    prompt, keeping every committed row."""
    return _resume(store, "id = :rid", {"rid": run_id}) > 0


def resume_experiment(store: Store, experiment_id: int) -> int:
    return _resume(store, "experiment_id = :eid", {"eid": experiment_id})


# --- workers ---------------------------------------------------------------------------------------------

def register_worker(store: Store, worker_id: str, host: str = "", pid: int = 0) -> None:
    now = utcnow()
    with store.write() as conn:
        conn.execute(text("DELETE FROM workers WHERE id = :w"), {"w": worker_id})
        conn.execute(text("INSERT INTO workers (id, host, pid, started, heartbeat) VALUES (:w, :h, :p, :now, :now)"),
                     {"w": worker_id, "h": host, "p": pid, "now": now})


def unregister_worker(store: Store, worker_id: str) -> None:
    with store.write() as conn:
        conn.execute(text("DELETE FROM workers WHERE id = :w"), {"w": worker_id})
        conn.execute(text("DELETE FROM device_leases WHERE worker_id = :w"), {"w": worker_id})


def heartbeat(store: Store, worker_id: str, run_id: int | None, group: Sequence[int] = ()) -> None:
    """The worker is alive (and so are the runs it executes: run_id and the group timed with it)."""
    now = utcnow()
    ids = sorted({int(i) for i in group} | ({int(run_id)} if run_id is not None else set()))
    with store.write() as conn:
        conn.execute(text("UPDATE workers SET heartbeat = :now, run_id = :rid WHERE id = :w"),
                     {"now": now, "rid": run_id, "w": worker_id})
        conn.execute(text("UPDATE device_leases SET heartbeat = :now WHERE worker_id = :w"), {"now": now, "w": worker_id})
        conn.execute(text("UPDATE training_jobs SET heartbeat = :now WHERE worker_id = :w AND status = :running"),
                     {"now": now, "w": worker_id, "running": RUNNING})
        if ids:
            conn.execute(text(f"UPDATE runs SET heartbeat = :now WHERE id IN ({','.join(map(str, ids))}) "
                              "AND status = :running"), {"now": now, "running": RUNNING})


def cancel_requested(store: Store, run_ids: Sequence[int]) -> set[int]:
    """Which of these runs have a cancel request pending."""
    if not run_ids:
        return set()
    with store.read() as conn:
        return set(conn.execute(text(f"SELECT id FROM runs WHERE id IN ({','.join(str(int(i)) for i in run_ids)}) "
                                     "AND cancel_requested = :yes"), {"yes": True}).scalars().all())


def store_verify_profile(store: Store, experiment_id: int, profile: dict[int, float]) -> None:
    with store.write() as conn:
        conn.execute(text("DELETE FROM verify_profile WHERE experiment_id = :eid"), {"eid": experiment_id})
        conn.execute(insert(verify_profile), [{"experiment_id": experiment_id, "n": int(n), "seconds": float(t)}
                                              for n, t in sorted(profile.items())])


def load_verify_profile(store: Store, experiment_id: int) -> dict[int, float]:
    with store.read() as conn:
        return {int(n): float(t) for n, t in conn.execute(
            text("SELECT n, seconds FROM verify_profile WHERE experiment_id = :eid ORDER BY n"), {"eid": experiment_id})}


def live_workers(store: Store, max_age_seconds: float = 30) -> int:
    """Workers whose heartbeat is fresher than max_age_seconds."""
    with store.read() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM workers WHERE heartbeat >= :cutoff"),
                                {"cutoff": utcnow() - timedelta(seconds=max_age_seconds)}).scalar())


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists here (a process of another user counts as alive)."""
    if pid is None or int(pid) <= 0:
        return True  # unknown: let the heartbeat decide
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def host_identity() -> str:
    """What a worker registers as its host: the host name, plus the PID namespace where there is one (Linux),
    so that a process id is only ever checked in the namespace it belongs to (a container sharing the host
    name, e.g. with --network host, is another host here)."""
    host = socket.gethostname()
    try:
        return f"{host}#{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return host


def dead_workers(conn, cutoff) -> list[str]:
    """Registered workers that are gone: no heartbeat since `cutoff`, or (on this host) no process."""
    rows = conn.execute(select(workers.c.id, workers.c.host, workers.c.pid, workers.c.heartbeat)).all()  # typed
    here = host_identity()
    return [r.id for r in rows if r.heartbeat is None or r.heartbeat < cutoff
            or (r.host == here and not _pid_alive(r.pid))]


_STALE_RUNS = """SELECT id FROM runs WHERE
    (status = :running AND (heartbeat IS NULL OR heartbeat < :cutoff OR worker_id IN ({dead})))
 OR (status = :queued AND reserved_for IS NOT NULL AND (reserved_for IN ({dead})
     OR (created < :cutoff AND reserved_for NOT IN (SELECT id FROM workers WHERE heartbeat >= :cutoff))))"""


def stale_runs(conn, cutoff, dead: Sequence[str]) -> list[int]:
    """Runs left `running` by a dead worker (see dead_workers) or with no heartbeat since cutoff, and queued
    runs reserved for a dead worker."""
    names = {f"dead{i}": w for i, w in enumerate(dead)}
    placeholders = ", ".join(f":{n}" for n in names) or "NULL"
    return list(conn.execute(text(_STALE_RUNS.format(dead=placeholders)),
                             {"cutoff": cutoff, "running": RUNNING, "queued": QUEUED, **names}).scalars().all())


TRAINING_STALE_ERROR = ("its worker stopped (its process is gone or it sent no heartbeat for {seconds:g}s); "
                        "resume the job to continue from its last checkpoint")
STALE_ERROR = ("its worker stopped (its process is gone or it sent no heartbeat for {seconds:g}s); "
               "resume the run to continue from its first unfinished prompt")


def mark_stale(store: Store, stale_seconds: float | None = None) -> list[int]:
    """Runs left `running` by a worker that is gone (killed, crashed, machine gone) become `interrupted`,
    keeping every committed row; so do queued runs reserved for a dead worker. A worker is gone when it sent
    no heartbeat for the stale window (see stale_window()), or at once when it ran on this host and its
    process no longer exists; training jobs of such workers too. Looks first and writes only when there is
    something to sweep. Returns run ids."""
    seconds = stale_window(stale_seconds)
    cutoff = utcnow() - timedelta(seconds=seconds)
    from .training import interrupt_stale, stale_jobs

    with store.read() as conn:
        dead = dead_workers(conn, cutoff)
        stale = stale_runs(conn, cutoff, dead)
        jobs = stale_jobs(conn, cutoff, dead)
        leases = conn.execute(text("SELECT COUNT(*) FROM device_leases WHERE heartbeat < :cutoff"),
                              {"cutoff": cutoff}).scalar()
    if not (dead or stale or jobs or leases):
        return []
    params = {"cutoff": cutoff, "interrupted": INTERRUPTED, "now": utcnow(),
              "error": STALE_ERROR.format(seconds=seconds)}
    with store.write() as conn:
        dead = dead_workers(conn, cutoff)
        stale = stale_runs(conn, cutoff, dead)
        interrupt_stale(conn, stale_jobs(conn, cutoff, dead), TRAINING_STALE_ERROR.format(seconds=seconds))
        if stale:
            conn.execute(text(
                "UPDATE runs SET status = :interrupted, finished = :now, reserved_for = NULL, error = :error "
                f"WHERE id IN ({','.join(str(int(i)) for i in stale)})"), params)
        for worker_id in dead:
            conn.execute(text("DELETE FROM device_leases WHERE worker_id = :w"), {"w": worker_id})
            conn.execute(text("DELETE FROM workers WHERE id = :w"), {"w": worker_id})
        conn.execute(text("DELETE FROM device_leases WHERE heartbeat < :cutoff"), params)
    return stale


# --- claiming and run state ------------------------------------------------------------------------------

_ELIGIBLE = """
runs.status = 'queued'
AND (runs.reserved_for IS NULL OR runs.reserved_for = :worker)
AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.experiment_id = runs.experiment_id AND o.status = 'running')
AND (runs.baseline_run_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM runs b WHERE b.id = runs.baseline_run_id AND b.status IN ('queued', 'running')))
"""


def claim_next(store: Store, worker_id: str, experiment_id: int | None = None, prefer_experiment: int | None = None) -> int | None:
    """Claim the next runnable run and return its id (None when nothing is runnable). Order: the experiment
    whose models the worker holds, then oldest experiment first; a baseline before its speculative runs;
    at most one running run per experiment (its timings are not shared with another run's)."""
    only = "AND runs.experiment_id = :eid" if experiment_id is not None else ""
    select = text(f"""SELECT runs.id FROM runs WHERE {_ELIGIBLE} {only}
        ORDER BY CASE WHEN runs.experiment_id = :prefer THEN 0 ELSE 1 END, runs.experiment_id,
                 CASE WHEN runs.kind = 'baseline' THEN 0 ELSE 1 END, runs.id LIMIT 5""")
    params = {"worker": worker_id, "eid": experiment_id, "prefer": prefer_experiment if prefer_experiment is not None else -1}
    for _attempt in range(20):
        with store.read() as conn:
            candidates = conn.execute(select, params).scalars().all()
        if not candidates:
            return None
        for run_id in candidates:
            if claim(store, run_id, worker_id):
                return run_id
    return None


def next_experiment(store: Store, worker_id: str, experiment_id: int | None = None,
                    prefer_experiment: int | None = None) -> int | None:
    """The experiment whose queued runs this worker should time next (see claim_next for the order)."""
    only = "AND runs.experiment_id = :eid" if experiment_id is not None else ""
    sql = text(f"""SELECT runs.experiment_id FROM runs
        WHERE runs.status = 'queued' AND (runs.reserved_for IS NULL OR runs.reserved_for = :worker) {only}
          AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.experiment_id = runs.experiment_id AND o.status = 'running')
        ORDER BY CASE WHEN runs.experiment_id = :prefer THEN 0 ELSE 1 END, runs.experiment_id LIMIT 1""")
    with store.read() as conn:
        return conn.execute(sql, {"worker": worker_id, "eid": experiment_id,
                                  "prefer": prefer_experiment if prefer_experiment is not None else -1}).scalar()


def claim_group(store: Store, experiment_id: int, worker_id: str) -> list[int]:
    """Atomically move every queued run of an experiment that this worker may take to running: they are
    timed together, prompt-major (timing protocol v2). Empty if another worker is running the experiment."""
    now = utcnow()
    with store.write() as conn:
        if store.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CLAIM_LOCK})
        busy = conn.execute(text("SELECT COUNT(*) FROM runs WHERE experiment_id = :eid AND status = 'running'"),
                            {"eid": experiment_id}).scalar()
        if busy:
            return []
        ids = conn.execute(text("SELECT id FROM runs WHERE experiment_id = :eid AND status = 'queued' "
                                "AND (reserved_for IS NULL OR reserved_for = :worker) ORDER BY id"),
                           {"eid": experiment_id, "worker": worker_id}).scalars().all()
        if ids:
            conn.execute(text(
                "UPDATE runs SET status = 'running', worker_id = :worker, started = COALESCE(started, :now), "
                "heartbeat = :now, finished = NULL, error = NULL, error_detail = NULL, cancel_requested = :no "
                f"WHERE id IN ({','.join(str(int(i)) for i in ids)})"), {"worker": worker_id, "now": now, "no": False})
    return list(ids)


def acquire_lease(store: Store, device: str, worker_id: str, experiment_id: int | None,
                  stale_seconds: float) -> str | None:
    """Take the device's timing lease (one timed job per device). None when this worker holds it now, else
    the id of the live worker holding it. A lease whose holder stopped heartbeating is taken over."""
    now = utcnow()
    cutoff = now - timedelta(seconds=stale_seconds)
    with store.write() as conn:
        conn.execute(text("DELETE FROM device_leases WHERE device = :d AND (heartbeat < :cutoff "
                          "OR worker_id NOT IN (SELECT id FROM workers))"), {"d": device, "cutoff": cutoff})
        holder = conn.execute(text("SELECT worker_id FROM device_leases WHERE device = :d"), {"d": device}).scalar()
        if holder is not None and holder != worker_id:
            conn.execute(text("UPDATE workers SET waiting_for = :d WHERE id = :w"), {"d": device, "w": worker_id})
            return holder
        if holder is None:
            conn.execute(text("INSERT INTO device_leases (device, worker_id, experiment_id, acquired, heartbeat) "
                              "VALUES (:d, :w, :eid, :now, :now)"),
                         {"d": device, "w": worker_id, "eid": experiment_id, "now": now})
        else:
            conn.execute(text("UPDATE device_leases SET experiment_id = :eid, heartbeat = :now WHERE device = :d"),
                         {"d": device, "eid": experiment_id, "now": now})
        conn.execute(text("UPDATE workers SET waiting_for = NULL WHERE id = :w"), {"w": worker_id})
    return None


def release_lease(store: Store, device: str, worker_id: str) -> None:
    with store.write() as conn:
        conn.execute(text("DELETE FROM device_leases WHERE device = :d AND worker_id = :w"), {"d": device, "w": worker_id})


def claim(store: Store, run_id: int, worker_id: str) -> bool:
    """Atomically move one queued run to running for worker_id; False if someone else got it first."""
    now = utcnow()
    with store.write() as conn:
        if store.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CLAIM_LOCK})
        n = conn.execute(text(
            f"UPDATE runs SET status = 'running', worker_id = :worker, started = COALESCE(started, :now), "
            f"heartbeat = :now, finished = NULL, error = NULL, error_detail = NULL, cancel_requested = :no "
            f"WHERE id = :rid AND {_ELIGIBLE}"),
            {"worker": worker_id, "now": now, "rid": run_id, "no": False}).rowcount
    return n == 1


def get_run(store: Store, run_id: int) -> dict | None:
    """A run's row as a dict (typed: datetimes, booleans)."""
    with store.read() as conn:
        row = conn.execute(select(runs).where(runs.c.id == run_id)).mappings().first()
        return dict(row) if row else None


def get_experiment(store: Store, experiment_id: int) -> dict | None:
    with store.read() as conn:
        row = conn.execute(select(experiments).where(experiments.c.id == experiment_id)).mappings().first()
        return dict(row) if row else None


def start_run(store: Store, run_id: int, prompts_total: int, device_name: str,
              draft_parameters: int | None = None) -> None:
    with store.write() as conn:
        conn.execute(text("UPDATE runs SET prompts_total = :n, device_name = :dev, draft_parameters = :dp, "
                          "progress = CAST(prompts_done AS DOUBLE PRECISION) / :n WHERE id = :rid"),
                     {"n": prompts_total, "dev": device_name, "dp": draft_parameters, "rid": run_id})


def report_progress(store: Store, run_id: int, progress: float) -> bool:
    """Store progress (0..1) and a heartbeat; return True when a cancel was requested."""
    with store.write() as conn:
        conn.execute(text("UPDATE runs SET progress = :p, heartbeat = :now WHERE id = :rid AND status = :running"),
                     {"p": min(max(progress, 0.0), 1.0), "now": utcnow(), "rid": run_id, "running": RUNNING})
        return bool(conn.execute(text("SELECT cancel_requested FROM runs WHERE id = :rid"), {"rid": run_id}).scalar())


def finish_run(store: Store, run_id: int, status: str, error: str | None = None, error_detail: str | None = None,
               peak_memory_mb: float | None = None, worker_id: str | None = None) -> bool:
    """Close a run as done / failed / cancelled / interrupted (its committed rows stay). With worker_id, only
    while that worker still owns it (`running`, its worker_id): a worker whose runs were swept as stale and
    taken over must not close them. Returns whether the run was closed."""
    assert status in (DONE, FAILED, CANCELLED, INTERRUPTED), status
    owned = " AND status = :running AND worker_id = :worker" if worker_id is not None else ""
    with store.write() as conn:
        return conn.execute(text(
            "UPDATE runs SET status = :status, error = :error, error_detail = :detail, finished = :now, "
            "peak_memory_mb = COALESCE(:peak, peak_memory_mb), cancel_requested = :no"
            + (", progress = 1.0" if status == DONE else "") + " WHERE id = :rid" + owned),
            {"status": status, "error": error, "detail": error_detail, "now": utcnow(), "peak": peak_memory_mb,
             "no": False, "rid": run_id, "running": RUNNING, "worker": worker_id}).rowcount == 1


def fence(conn, run_ids: Sequence[int], worker_id: str) -> dict[int, bool]:
    """In the caller's write transaction: which of these runs this worker still owns (`running` with its
    worker_id), each with its cancel request; their heartbeat is refreshed. A run swept as stale and taken
    over by another worker is missing, so its new owner's rows are never written twice."""
    if not run_ids:
        return {}
    ids = ",".join(str(int(i)) for i in run_ids)
    owned = {int(rid): bool(cancel) for rid, cancel in conn.execute(text(
        f"SELECT id, cancel_requested FROM runs WHERE id IN ({ids}) AND status = :running AND worker_id = :w"),
        {"running": RUNNING, "w": worker_id}).all()}
    if owned:
        conn.execute(text(f"UPDATE runs SET heartbeat = :now WHERE id IN ({','.join(map(str, owned))})"),
                     {"now": utcnow()})
    return owned


def committed_prompts(conn, run_ids: Sequence[int], prompt_index: int) -> set[int]:
    """Which of these runs already have prompt_index committed (a commit whose answer was lost, then retried)."""
    if not run_ids:
        return set()
    return set(conn.execute(text(f"SELECT run_id FROM prompt_results WHERE prompt_index = :i "
                                 f"AND run_id IN ({','.join(str(int(i)) for i in run_ids)})"),
                            {"i": prompt_index}).scalars().all())


def fail_queued_runs(store: Store, experiment_id: int, error: str) -> int:
    """Fail an experiment's remaining queued runs with an error they would all hit (bad model or prompts)."""
    with store.write() as conn:
        return conn.execute(text("UPDATE runs SET status = :failed, error = :error, finished = :now "
                                 "WHERE experiment_id = :eid AND status = :queued"),
                            {"failed": FAILED, "error": error, "now": utcnow(), "eid": experiment_id,
                             "queued": QUEUED}).rowcount
