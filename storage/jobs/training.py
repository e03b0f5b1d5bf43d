"""Training jobs ("Train a draft"): `draftlab distill` (kind "distill") or `draftlab train-head` (kind "head", an
EAGLE-3 head for a target) as a queued job a worker runs, with live curves, cancel and resume from its checkpoint,
and the trained drafts and heads a team can pick as candidates.

A job is claimed by one conditional UPDATE (as runs are). The worker writes its step, phase, progress and curve
points in one transaction fenced to the worker that owns the job; the answer carries a pending cancel. A cancel
stops the job after its current step with a checkpoint of exactly that step; resume requeues it and the next
worker continues from the checkpoint (curve points past the checkpoint, which only a killed worker leaves, are
dropped first, so no step is ever recorded twice). Where trained drafts are written is one setting,
$DRAFTLAB_MODELS (default ./models): share that directory and the database, and a team uses each other's drafts.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from sqlalchemy import insert, select, text

from storage.db.errors import QueueError
from storage.db.schema import (
    CANCELLED,
    DISTILL,
    DONE,
    FAILED,
    HEAD,
    INTERRUPTED,
    QUEUED,
    RUNNING,
    TRAINING_KINDS,
    TrainingJob,
    training_accuracy,
    training_jobs,
    training_points,
    utcnow,
)
from storage.db.store import Store, new_id

MODELS_ENV, DEFAULT_MODELS_DIR = "DRAFTLAB_MODELS", "models"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CHECKPOINT_DIR = ".checkpoint"  # inside the job's output directory; removed once the job is done
ACTIVE = (QUEUED, RUNNING)


def models_dir() -> Path:
    """Where trained drafts are written: $DRAFTLAB_MODELS, else ./models (absolute)."""
    return Path(os.environ.get(MODELS_ENV) or DEFAULT_MODELS_DIR).expanduser().resolve()


def checkpoint_dir(job: dict) -> Path:
    return Path(job["out"]) / CHECKPOINT_DIR


def _positive(value, name: str, example: str, integer: bool = True):
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if integer and (isinstance(value, float) and not float(value).is_integer()):
        number = float("nan")
    if not (number > 0) or not math.isfinite(number):
        raise QueueError(
            f"{name} must be a positive {'integer' if integer else 'number'} (got {value!r}); use e.g. {example}"
        )
    return number


def _within_columns(**values) -> None:
    """Every number of a job within what its INTEGER column holds on SQLite and PostgreSQL alike (seed and max new
    tokens: their description in engine/config/variables.py, the cap of engine/config/limits.py included)."""
    from engine.config.variables import SETTINGS
    from engine.numbers import DB_INT_MAX

    for key, value in values.items():
        if value is None:
            continue
        setting = SETTINGS.get(key)
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")
        ok = setting.in_range(number) if setting is not None else 0 <= number <= DB_INT_MAX
        if not ok:
            meaning = setting.meaning if setting is not None else f"a whole number up to {DB_INT_MAX}"
            raise QueueError(f"{key.replace('_', ' ')} {value!r} is not {meaning}")


def enqueue_training(
    store: Store,
    *,
    name: str,
    target: str,
    prompts: str,
    validation: str,
    steps: int,
    draft: str = "",
    kind: str = DISTILL,
    lr: float = 3e-4,
    batch_size: int = 8,
    max_new_tokens: int = 128,
    samples: int = 1,
    seed: int = 0,
    focus_from: int | None = None,
    device: str = "auto",
    notes: str = "",
    models: str | Path | None = None,
    launched_by: str | None = None,
    ttt_steps: int | None = None,
    draft_vocab_size: int | None = None,
    aux_layers: str | None = None,
) -> int:
    """Queue a training job writing `models/name` (models: $DRAFTLAB_MODELS unless given); return its id. Refused
    (QueueError, nothing stored) for bad settings, a name that is not a plain directory name, a directory that
    already holds a model, or a name another queued, running or finished job writes.

    kind "distill" trains a copy of `draft`; kind "head" an EAGLE-3 head for `target` (no draft: it is stored as
    ""), with its TTT steps (default 4), draft vocabulary size (0, the default: the whole vocabulary up to 32000)
    and aux layers (`2,6,9`, or None / "auto": vLLM's default for the target), which distillation does not take."""
    if kind not in TRAINING_KINDS:
        raise QueueError(
            f"training kind {str(kind)[:40]!r} is not one of {', '.join(TRAINING_KINDS)}; use "
            f"{DISTILL} (a draft) or {HEAD} (an EAGLE-3 head)"
        )
    head = _head_settings(kind, draft, ttt_steps, draft_vocab_size, aux_layers)
    steps = _positive(steps, "steps", "300")
    lr = _positive(lr, "learning rate", "3e-4", integer=False)
    batch_size = _positive(batch_size, "batch size", "8")
    max_new_tokens = _positive(max_new_tokens, "max new tokens", "128")
    samples = _positive(samples, "samples", "1 (the greedy continuation only)")
    _within_columns(
        steps=steps,
        batch_size=batch_size,
        samples=samples,
        max_new_tokens=max_new_tokens,
        seed=seed,
        focus_from=focus_from,
        draft_vocab_size=head["draft_vocab_size"],
    )
    name = (name or "").strip()
    if not NAME_PATTERN.match(name):
        made, example = ("head", "demo-target-eagle3-2") if kind == HEAD else ("draft", "demo-draft-distilled-2")
        raise QueueError(
            f"{made} name {name!r} is not a plain directory name; use letters, digits, '.', '_' and "
            f"'-' (e.g. {example})"
        )
    needed = (
        ("target", target),
        *((("draft", draft),) if kind == DISTILL else ()),
        ("prompts", prompts),
        ("validation", validation),
    )
    for field, value in needed:
        if not str(value or "").strip():
            raise QueueError(f"{field} is empty; name a model / prompt set")
    out = (Path(models) if models is not None else models_dir()).expanduser().resolve() / name
    if (out / "config.json").exists():
        raise QueueError(f"{out} already holds a model; pick another name (nothing is overwritten)")
    with store.write() as conn:
        if (
            focus_from is not None
            and conn.execute(text("SELECT COUNT(*) FROM experiments WHERE id = :e"), {"e": int(focus_from)}).scalar()
            == 0
        ):
            raise QueueError(f"focus experiment {focus_from} does not exist; pick one from the Experiments list")
        from storage.jobs.experiments import check_launcher_cap

        check_launcher_cap(conn, launched_by, 1)
        taken = conn.execute(
            text("SELECT id FROM training_jobs WHERE out = :out AND status NOT IN (:f, :c)"),
            {"out": str(out), "f": FAILED, "c": CANCELLED},
        ).scalar()
        if taken is not None:
            raise QueueError(f"training job {taken} already writes {out}; pick another name")
        return new_id(
            conn.execute(
                insert(training_jobs).values(
                    name=name,
                    out=str(out),
                    created=utcnow(),
                    notes=notes or "",
                    kind=kind,
                    target=target.strip(),
                    draft=str(draft or "").strip(),
                    prompts=prompts.strip(),
                    validation=validation.strip(),
                    steps=steps,
                    lr=lr,
                    batch_size=batch_size,
                    max_new_tokens=max_new_tokens,
                    samples=samples,
                    seed=int(seed),
                    focus_from=focus_from,
                    device=device,
                    status=QUEUED,
                    step=0,
                    progress=0.0,
                    cancel_requested=False,
                    launched_by=launched_by[:200] if launched_by else None,
                    **head,
                )
            )
        )


def _head_settings(kind: str, draft: str | None, ttt_steps, draft_vocab_size, aux_layers) -> dict:
    """A job's head columns, checked: a head's (defaults filled in, aux layers written `2,6,9` or NULL for auto);
    all NULL for distillation, which refuses them. QueueError for a bad one."""
    from engine.config.head_settings import (
        DEFAULTS,
        aux_layers_text,
        check_draft_vocab_size,
        check_ttt_steps,
        parse_aux_layers,
    )
    from engine.errors import DraftLabError

    given = {"TTT steps": ttt_steps, "draft vocabulary size": draft_vocab_size, "aux layers": aux_layers}
    if kind == DISTILL:
        named = [what for what, value in given.items() if value is not None]
        if named:
            raise QueueError(
                f"{', '.join(named)} set for a distillation job; they are an EAGLE-3 head's settings: "
                f"queue kind {HEAD!r}, or leave them out"
            )
        return {"ttt_steps": None, "draft_vocab_size": None, "aux_layers": None}
    if str(draft or "").strip():
        raise QueueError(
            f"an EAGLE-3 head starts from no draft (got draft {str(draft)[:60]!r}); leave the draft "
            f"empty: the head is built from the target"
        )
    try:
        return {
            "ttt_steps": check_ttt_steps(DEFAULTS["ttt_steps"] if ttt_steps is None else ttt_steps, "TTT steps"),
            "draft_vocab_size": check_draft_vocab_size(
                0 if draft_vocab_size is None else draft_vocab_size, "draft vocabulary size"
            ),
            "aux_layers": aux_layers_text(parse_aux_layers(aux_layers, "aux layers")),
        }
    except DraftLabError as exc:
        raise QueueError(str(exc)) from None


def unfinished_job_files(store: Store) -> set[str]:
    """The prompt specs (file paths among them) that queued or running training jobs will still read."""
    with store.read() as conn:
        rows = conn.execute(
            text("SELECT prompts, validation FROM training_jobs WHERE status IN (:q, :r)"), {"q": QUEUED, "r": RUNNING}
        ).all()
    return {spec for row in rows for value in row for spec in str(value or "").split("+") if spec.strip()}


def get_job(store: Store, job_id: int) -> dict | None:
    with store.read() as conn:
        row = conn.execute(select(training_jobs).where(training_jobs.c.id == int(job_id))).mappings().first()
        return dict(row) if row else None


def next_job(store: Store) -> int | None:
    """The oldest queued training job."""
    with store.read() as conn:
        return conn.execute(
            text("SELECT id FROM training_jobs WHERE status = :q ORDER BY id LIMIT 1"), {"q": QUEUED}
        ).scalar()


def claim_job(store: Store, job_id: int, worker_id: str) -> bool:
    """Atomically move a queued job to running for worker_id; False if another worker got it first."""
    now = utcnow()
    with store.write() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE training_jobs SET status = :running, worker_id = :w, started = COALESCE(started, :now), "
                    "heartbeat = :now, finished = NULL, error = NULL, error_detail = NULL, cancel_requested = :no "
                    "WHERE id = :id AND status = :queued"
                ),
                {"running": RUNNING, "w": worker_id, "now": now, "no": False, "id": int(job_id), "queued": QUEUED},
            ).rowcount
            == 1
        )


def _owned(conn, job_id: int, worker_id: str):
    return conn.execute(
        text("SELECT cancel_requested FROM training_jobs WHERE id = :id AND status = :running AND worker_id = :w"),
        {"id": int(job_id), "running": RUNNING, "w": worker_id},
    ).first()


def report(store: Store, job_id: int, worker_id: str, points: Sequence[dict] = (), **fields) -> dict:
    """Write a job's progress (fields of training_jobs: phase, step, progress, checkpoint_step, device_name, results)
    and new curve points ({step, loss, lr, kl, seconds, acceptance_length}; an existing step is updated, e.g. its
    KL; a head's eval point may carry `per_position` and `accuracy`, lists over draft positions 1..S, written to
    training_accuracy) in one transaction, only while worker_id owns the job. Returns {"owned": bool,
    "cancel": bool}."""
    allowed = {c.name for c in training_jobs.columns} - {"id", "status", "worker_id", "cancel_requested"}
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"unknown training job fields {sorted(unknown)}")
    with store.write() as conn:
        owned = _owned(conn, job_id, worker_id)
        if owned is None:
            return {"owned": False, "cancel": False}
        sets = ", ".join(f"{k} = :{k}" for k in fields)
        conn.execute(
            text(f"UPDATE training_jobs SET heartbeat = :now{', ' + sets if sets else ''} WHERE id = :id"),
            {**fields, "now": utcnow(), "id": int(job_id)},
        )
        if points:
            steps = [int(p["step"]) for p in points]
            have = {
                int(s): None
                for s in conn.execute(
                    text(
                        f"SELECT step FROM training_points WHERE job_id = :id AND step IN ({','.join(map(str, steps))})"
                    ),
                    {"id": int(job_id)},
                ).scalars()
            }
            for p in points:
                row = {
                    "job_id": int(job_id),
                    "step": int(p["step"]),
                    "loss": p.get("loss"),
                    "lr": p.get("lr"),
                    "kl": p.get("kl"),
                    "seconds": p.get("seconds"),
                    "acceptance_length": p.get("acceptance_length"),
                }
                if int(p["step"]) in have:  # an eval point on a step already written: fill in what it adds
                    conn.execute(
                        text(
                            "UPDATE training_points SET loss = COALESCE(:loss, loss), lr = COALESCE(:lr, lr), "
                            "kl = COALESCE(:kl, kl), seconds = COALESCE(:seconds, seconds), "
                            "acceptance_length = COALESCE(:acceptance_length, acceptance_length) "
                            "WHERE job_id = :job_id AND step = :step"
                        ),
                        row,
                    )
                else:
                    conn.execute(insert(training_points).values(**row))
                    have[int(p["step"])] = None
                _write_accuracy(conn, int(job_id), p)
        return {"owned": True, "cancel": bool(owned[0])}


def _write_accuracy(conn, job_id: int, point: dict) -> None:
    """A head's eval point's acceptance and accuracy by draft position (1..S), replacing any of that step."""
    acceptance, accuracy = list(point.get("per_position") or []), list(point.get("accuracy") or [])
    n = max(len(acceptance), len(accuracy))
    if not n:
        return
    at = lambda values, j: _number(values[j]) if j < len(values) else None  # noqa: E731
    conn.execute(
        text("DELETE FROM training_accuracy WHERE job_id = :id AND step = :s"), {"id": job_id, "s": int(point["step"])}
    )
    conn.execute(
        insert(training_accuracy),
        [
            {
                "job_id": job_id,
                "step": int(point["step"]),
                "position": j + 1,
                "acceptance": at(acceptance, j),
                "accuracy": at(accuracy, j),
            }
            for j in range(n)
        ],
    )


def _number(value) -> float | None:
    """A rate as stored: None for a missing or NaN one."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def rewind(store: Store, job_id: int, worker_id: str, step: int) -> bool:
    """The job continues from a checkpoint at `step`: drop curve points after it (left by a killed worker) and
    set its step back. Only while worker_id owns the job."""
    with store.write() as conn:
        if _owned(conn, job_id, worker_id) is None:
            return False
        for table in ("training_points", "training_accuracy"):
            conn.execute(text(f"DELETE FROM {table} WHERE job_id = :id AND step > :s"), {"id": int(job_id), "s": step})
        conn.execute(text("UPDATE training_jobs SET step = :s WHERE id = :id"), {"id": int(job_id), "s": step})
        return True


def finish_job(
    store: Store,
    job_id: int,
    status: str,
    error: str | None = None,
    error_detail: str | None = None,
    worker_id: str | None = None,
    **results,
) -> bool:
    """Close a job (done / failed / cancelled / interrupted) with any result columns; with worker_id only while
    that worker owns it. Returns whether it was closed."""
    assert status in (DONE, FAILED, CANCELLED, INTERRUPTED), status
    owned = " AND status = :running AND worker_id = :w" if worker_id is not None else ""
    sets = "".join(f", {k} = :{k}" for k in results)
    with store.write() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE training_jobs SET status = :status, error = :error, error_detail = :detail, "
                    "finished = :now, "
                    f"cancel_requested = :no{sets}"
                    + (", progress = 1.0" if status == DONE else "")
                    + " WHERE id = :id"
                    + owned
                ),
                {
                    **results,
                    "status": status,
                    "error": error,
                    "detail": error_detail,
                    "now": utcnow(),
                    "no": False,
                    "id": int(job_id),
                    "running": RUNNING,
                    "w": worker_id,
                },
            ).rowcount
            == 1
        )


def cancel_job(store: Store, job_id: int) -> bool:
    """Cancel a queued job now, or ask its worker to stop a running one after its current step (a checkpoint of
    that step is kept, so resume continues from it)."""
    with store.write() as conn:
        n = conn.execute(
            text("UPDATE training_jobs SET status = :c, finished = :now WHERE id = :id AND status IN (:q, :i)"),
            {"c": CANCELLED, "now": utcnow(), "id": int(job_id), "q": QUEUED, "i": INTERRUPTED},
        ).rowcount
        n += conn.execute(
            text("UPDATE training_jobs SET cancel_requested = :yes WHERE id = :id AND status = :r"),
            {"yes": True, "id": int(job_id), "r": RUNNING},
        ).rowcount
    return n > 0


def resume_job(store: Store, job_id: int) -> bool:
    """Requeue a cancelled, interrupted or failed job; a worker continues it from its checkpoint."""
    with store.write() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE training_jobs SET status = :q, error = NULL, error_detail = NULL, cancel_requested = :no, "
                    "finished = NULL WHERE id = :id AND status IN (:c, :i, :f)"
                ),
                {"q": QUEUED, "no": False, "id": int(job_id), "c": CANCELLED, "i": INTERRUPTED, "f": FAILED},
            ).rowcount
            == 1
        )


def stale_jobs(conn, cutoff, dead: Sequence[str]) -> list[int]:
    """Running jobs whose worker is dead (see liveness.dead_workers) or sent no heartbeat since cutoff."""
    names = {f"dead{i}": w for i, w in enumerate(dead)}
    placeholders = ", ".join(f":{n}" for n in names) or "NULL"
    return list(
        conn.execute(
            text(
                f"SELECT id FROM training_jobs WHERE status = :running AND (heartbeat IS NULL OR heartbeat < :cutoff "
                f"OR worker_id IN ({placeholders}))"
            ),
            {"running": RUNNING, "cutoff": cutoff, **names},
        ).scalars()
    )


def interrupt_stale(conn, ids: Sequence[int], error: str) -> None:
    if ids:
        conn.execute(
            text(
                f"UPDATE training_jobs SET status = :i, finished = :now, error = :e "
                f"WHERE id IN ({','.join(str(int(i)) for i in ids)})"
            ),
            {"i": INTERRUPTED, "now": utcnow(), "e": error},
        )


# --- reads for the dashboard -----------------------------------------------------------------------------

JOB_COLUMNS = [c.name for c in TrainingJob.__table__.columns if c.name != "error_detail"]


def jobs(store: Store) -> pd.DataFrame:
    """Every training job, newest first (JOB_COLUMNS)."""
    with store.read() as conn:
        rows = conn.execute(
            select(*[training_jobs.c[c] for c in JOB_COLUMNS]).order_by(training_jobs.c.id.desc())
        ).all()
    return pd.DataFrame([tuple(r) for r in rows], columns=JOB_COLUMNS)


TIMING_COLUMNS = [
    "id",
    "kind",
    "target",
    "draft",
    "prompts",
    "validation",
    "steps",
    "batch_size",
    "max_new_tokens",
    "samples",
    "device_name",
    "train_seconds",
    "wall_seconds",
    "step_seconds",
]


def job_timings(store: Store) -> pd.DataFrame:
    """How long each finished (done) job took, newest first, what the Train form's estimate scales from
    (pages/panels/training_estimate.py): its settings (TIMING_COLUMNS), train_seconds (its optimiser steps and held-out
    evaluations), wall_seconds (claimed to finished: loading, the target's responses, training, measuring) and
    step_seconds, the median time of one optimiser step from its curve's per-step times, leaving out each step
    that follows a held-out evaluation (a point with its KL), whose time holds that evaluation too (NULL without
    per-step times)."""
    deltas = """SELECT job_id, seconds - LAG(seconds, 1, 0) OVER (PARTITION BY job_id ORDER BY step) AS delta,
                       LAG(kl) OVER (PARTITION BY job_id ORDER BY step) AS evaluated
                FROM training_points WHERE step > 0 AND seconds IS NOT NULL AND job_id IN (
                    SELECT id FROM training_jobs WHERE status = :done)"""
    with store.read() as conn:
        rows = conn.execute(
            select(
                *[training_jobs.c[c] for c in TIMING_COLUMNS[:11]],
                training_jobs.c.train_seconds,
                training_jobs.c.started,
                training_jobs.c.finished,
            )
            .where(training_jobs.c.status == DONE)
            .order_by(training_jobs.c.id.desc())
        ).all()
        steps = conn.execute(text(deltas), {"done": DONE}).all()
    frame = pd.DataFrame(
        [tuple(r[:12]) + ((r[13] - r[12]).total_seconds() if r[12] and r[13] else None,) for r in rows],
        columns=TIMING_COLUMNS[:13],
    )
    pure = pd.DataFrame(
        [(job, delta) for job, delta, evaluated in steps if evaluated is None], columns=["id", "step_seconds"]
    )
    medians = pure.groupby("id")["step_seconds"].median()
    frame["step_seconds"] = frame["id"].map(medians).astype(float)
    return frame


POINT_COLUMNS = ["step", "loss", "lr", "kl", "seconds", "acceptance_length"]


def points(store: Store, job_id: int) -> pd.DataFrame:
    """A job's curve: step, loss, lr, kl (NULL where not measured), seconds, acceptance_length (a head's, at its
    eval points)."""
    with store.read() as conn:
        rows = conn.execute(
            text(f"SELECT {', '.join(POINT_COLUMNS)} FROM training_points WHERE job_id = :id ORDER BY step"),
            {"id": int(job_id)},
        ).all()
    return pd.DataFrame([tuple(r) for r in rows], columns=POINT_COLUMNS)


def acceptance_by_position(store: Store, job_id: int) -> pd.DataFrame:
    """A head job's held-out acceptance by draft position at each eval point: step, position, acceptance
    (conditional), accuracy; empty for a distillation job."""
    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT step, position, acceptance, accuracy FROM training_accuracy "
                "WHERE job_id = :id ORDER BY step, position"
            ),
            {"id": int(job_id)},
        ).all()
    return pd.DataFrame([tuple(r) for r in rows], columns=["step", "position", "acceptance", "accuracy"])


def version(store: Store) -> tuple:
    """A cheap stamp that changes whenever any job is added, moves, reports or ends (cache key for pages)."""
    with store.read() as conn:
        row = conn.execute(
            text(
                "SELECT COUNT(*), MAX(id), MAX(heartbeat), MAX(finished), SUM(step), "
                "SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END), "
                "SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END), "
                "SUM(CASE WHEN cancel_requested THEN 1 ELSE 0 END) FROM training_jobs"
            )
        ).one()
    return tuple(str(v) for v in row)


def trained_drafts(store: Store) -> list[dict]:
    """Drafts finished training jobs wrote (newest first): name, out (the path to load: `--draft OUT`), kind
    ("distill": a causal LM; "head": an EAGLE-3 head, drafting for its `target` only, with the eagle3 drafter),
    target, draft ("" for a head), job_id, alpha_before, alpha_after. Offered as draft candidates on the
    New-experiment page."""
    with store.read() as conn:
        rows = (
            conn.execute(
                text(
                    "SELECT id, name, out, kind, target, draft, alpha_before, alpha_after "
                    "FROM training_jobs WHERE status = :done ORDER BY id DESC"
                ),
                {"done": DONE},
            )
            .mappings()
            .all()
        )
    return [
        {
            "job_id": r["id"],
            "name": r["name"],
            "out": r["out"],
            "kind": r["kind"],
            "target": r["target"],
            "draft": r["draft"],
            "alpha_before": r["alpha_before"],
            "alpha_after": r["alpha_after"],
        }
        for r in rows
    ]
