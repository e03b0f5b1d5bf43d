"""Run state: which experiment a worker times next, claiming its queued runs atomically, start, progress,
finish, the fence of a worker's writes, cancel and resume.

Claiming is one conditional UPDATE (`... WHERE experiment_id = :eid AND status = 'queued'`) in one write
transaction, so two workers never take the same run, on SQLite (writes serialise) and PostgreSQL (claims are
serialised by an advisory lock so "one running run per experiment" holds under READ COMMITTED).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import select, text

from storage.db.schema import CANCELLED, DONE, FAILED, INTERRUPTED, QUEUED, RUNNING, runs, utcnow
from storage.db.store import Store

_CLAIM_LOCK = 704202  # PostgreSQL advisory-lock key for claims


def next_experiment(
    store: Store, worker_id: str, experiment_id: int | None = None, prefer_experiment: int | None = None
) -> int | None:
    """The experiment whose queued runs this worker should time next (None: nothing claimable): the one whose
    models the worker holds (prefer_experiment) first, then the oldest; never one another worker is running;
    runs reserved for another worker are not this one's."""
    only = "AND runs.experiment_id = :eid" if experiment_id is not None else ""
    sql = text(f"""SELECT runs.experiment_id FROM runs
        WHERE runs.status = 'queued' AND (runs.reserved_for IS NULL OR runs.reserved_for = :worker) {only}
          AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.experiment_id = runs.experiment_id AND o.status = 'running')
        ORDER BY CASE WHEN runs.experiment_id = :prefer THEN 0 ELSE 1 END, runs.experiment_id LIMIT 1""")
    with store.read() as conn:
        return conn.execute(
            sql,
            {
                "worker": worker_id,
                "eid": experiment_id,
                "prefer": prefer_experiment if prefer_experiment is not None else -1,
            },
        ).scalar()


def claim_group(store: Store, experiment_id: int, worker_id: str) -> list[int]:
    """Atomically move every queued run of an experiment that this worker may take to running: they are
    timed together, prompt-major (timing protocol v2). Empty if another worker is running the experiment."""
    now = utcnow()
    with store.write() as conn:
        if store.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CLAIM_LOCK})
        busy = conn.execute(
            text("SELECT COUNT(*) FROM runs WHERE experiment_id = :eid AND status = 'running'"), {"eid": experiment_id}
        ).scalar()
        if busy:
            return []
        ids = (
            conn.execute(
                text(
                    "SELECT id FROM runs WHERE experiment_id = :eid AND status = 'queued' "
                    "AND (reserved_for IS NULL OR reserved_for = :worker) ORDER BY id"
                ),
                {"eid": experiment_id, "worker": worker_id},
            )
            .scalars()
            .all()
        )
        if ids:
            conn.execute(
                text(
                    "UPDATE runs SET status = 'running', worker_id = :worker, started = COALESCE(started, :now), "
                    "heartbeat = :now, finished = NULL, error = NULL, error_detail = NULL, cancel_requested = :no "
                    f"WHERE id IN ({','.join(str(int(i)) for i in ids)})"
                ),
                {"worker": worker_id, "now": now, "no": False},
            )
    return list(ids)


def get_run(store: Store, run_id: int) -> dict | None:
    """A run's row as a dict (typed: datetimes, booleans)."""
    with store.read() as conn:
        row = conn.execute(select(runs).where(runs.c.id == run_id)).mappings().first()
        return dict(row) if row else None


def start_run(
    store: Store, run_id: int, prompts_total: int, device_name: str, draft_parameters: int | None = None
) -> None:
    with store.write() as conn:
        conn.execute(
            text(
                "UPDATE runs SET prompts_total = :n, device_name = :dev, draft_parameters = :dp, "
                "progress = CAST(prompts_done AS DOUBLE PRECISION) / :n WHERE id = :rid"
            ),
            {"n": prompts_total, "dev": device_name, "dp": draft_parameters, "rid": run_id},
        )


def report_progress(store: Store, run_id: int, progress: float) -> bool:
    """Store progress (0..1) and a heartbeat; return True when a cancel was requested."""
    with store.write() as conn:
        conn.execute(
            text("UPDATE runs SET progress = :p, heartbeat = :now WHERE id = :rid AND status = :running"),
            {"p": min(max(progress, 0.0), 1.0), "now": utcnow(), "rid": run_id, "running": RUNNING},
        )
        return bool(conn.execute(text("SELECT cancel_requested FROM runs WHERE id = :rid"), {"rid": run_id}).scalar())


# A greedy speculative run's first committed prompt whose output differs from its baseline's (the comparison
# queries.runs' outputs_match_baseline makes; greedy: temperature 0 or unset).
_FIRST_DIFFERENCE_SQL = """
SELECT p.prompt_index, p.output_ids, bp.output_ids AS baseline_ids
FROM prompt_results p
JOIN runs r ON r.id = p.run_id
JOIN prompt_results bp ON bp.run_id = r.baseline_run_id AND bp.prompt_index = p.prompt_index
WHERE p.run_id = :rid AND r.kind = 'speculative' AND COALESCE(r.temperature, 0) <= 0 AND p.output_ids <> bp.output_ids
ORDER BY p.prompt_index LIMIT 1"""


def not_lossless(store: Store, run_id: int) -> str | None:
    """Why a greedy speculative run is not lossless ("not lossless: prompt i differs at token j": the first prompt
    whose output differs from its baseline's, the first new token where they part, both from 0), None when every
    prompt both committed matches (or the run samples, or is a baseline). The worker closes such a run as failed
    with it (SPEC "Lossless at every batch size"), so no verdict, schedule or deploy takes it (queries.CHOOSABLE
    wants done)."""
    with store.read() as conn:
        row = conn.execute(text(_FIRST_DIFFERENCE_SQL), {"rid": run_id}).first()
    if row is None:
        return None
    mine, theirs = json.loads(row.output_ids), json.loads(row.baseline_ids)
    token = next((j for j, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    return f"not lossless: prompt {int(row.prompt_index)} differs at token {token}"


def finish_run(
    store: Store,
    run_id: int,
    status: str,
    error: str | None = None,
    error_detail: str | None = None,
    peak_memory_mb: float | None = None,
    worker_id: str | None = None,
) -> bool:
    """Close a run as done / failed / cancelled / interrupted (its committed rows stay). With worker_id, only
    while that worker still owns it (`running`, its worker_id): a worker whose runs were swept as stale and
    taken over must not close them. Returns whether the run was closed."""
    assert status in (DONE, FAILED, CANCELLED, INTERRUPTED), status
    owned = " AND status = :running AND worker_id = :worker" if worker_id is not None else ""
    with store.write() as conn:
        return (
            conn.execute(
                text(
                    "UPDATE runs SET status = :status, error = :error, error_detail = :detail, finished = :now, "
                    "peak_memory_mb = COALESCE(:peak, peak_memory_mb), cancel_requested = :no"
                    + (", progress = 1.0" if status == DONE else "")
                    + " WHERE id = :rid"
                    + owned
                ),
                {
                    "status": status,
                    "error": error,
                    "detail": error_detail,
                    "now": utcnow(),
                    "peak": peak_memory_mb,
                    "no": False,
                    "rid": run_id,
                    "running": RUNNING,
                    "worker": worker_id,
                },
            ).rowcount
            == 1
        )


def fence(conn, run_ids: Sequence[int], worker_id: str) -> dict[int, bool]:
    """In the caller's write transaction: which of these runs this worker still owns (`running` with its
    worker_id), each with its cancel request; their heartbeat is refreshed. A run swept as stale and taken
    over by another worker is missing, so its new owner's rows are never written twice."""
    if not run_ids:
        return {}
    ids = ",".join(str(int(i)) for i in run_ids)
    owned = {
        int(rid): bool(cancel)
        for rid, cancel in conn.execute(
            text(f"SELECT id, cancel_requested FROM runs WHERE id IN ({ids}) AND status = :running AND worker_id = :w"),
            {"running": RUNNING, "w": worker_id},
        ).all()
    }
    if owned:
        conn.execute(
            text(f"UPDATE runs SET heartbeat = :now WHERE id IN ({','.join(map(str, owned))})"), {"now": utcnow()}
        )
    return owned


def committed_prompts(conn, run_ids: Sequence[int], prompt_index: int) -> set[int]:
    """Which of these runs already have prompt_index committed (a commit whose answer was lost, then retried)."""
    if not run_ids:
        return set()
    return set(
        conn.execute(
            text(
                f"SELECT run_id FROM prompt_results WHERE prompt_index = :i "
                f"AND run_id IN ({','.join(str(int(i)) for i in run_ids)})"
            ),
            {"i": prompt_index},
        )
        .scalars()
        .all()
    )


def fail_queued_runs(store: Store, experiment_id: int, error: str) -> int:
    """Fail an experiment's remaining queued runs with an error they would all hit (bad model or prompts)."""
    with store.write() as conn:
        return conn.execute(
            text(
                "UPDATE runs SET status = :failed, error = :error, finished = :now "
                "WHERE experiment_id = :eid AND status = :queued"
            ),
            {"failed": FAILED, "error": error, "now": utcnow(), "eid": experiment_id, "queued": QUEUED},
        ).rowcount


def cancel_requested(store: Store, run_ids: Sequence[int]) -> set[int]:
    """Which of these runs have a cancel request pending."""
    if not run_ids:
        return set()
    with store.read() as conn:
        return set(
            conn.execute(
                text(
                    f"SELECT id FROM runs WHERE id IN ({','.join(str(int(i)) for i in run_ids)}) "
                    "AND cancel_requested = :yes"
                ),
                {"yes": True},
            )
            .scalars()
            .all()
        )


def _cancel(store: Store, where: str, params: dict) -> int:
    now = utcnow()
    with store.write() as conn:
        n = conn.execute(
            text(
                f"UPDATE runs SET status = :cancelled, finished = :now "
                f"WHERE {where} AND status IN (:queued, :interrupted)"
            ),
            {**params, "cancelled": CANCELLED, "now": now, "queued": QUEUED, "interrupted": INTERRUPTED},
        ).rowcount
        n += conn.execute(
            text(f"UPDATE runs SET cancel_requested = :yes WHERE {where} AND status = :running"),
            {**params, "yes": True, "running": RUNNING},
        ).rowcount
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
        return conn.execute(
            text(
                "UPDATE runs SET status = :interrupted, error = :reason, reserved_for = NULL "
                "WHERE experiment_id = :eid AND status = :queued"
            ),
            {"interrupted": INTERRUPTED, "reason": reason, "eid": experiment_id, "queued": QUEUED},
        ).rowcount


def _resume(store: Store, where: str, params: dict) -> int:
    with store.write() as conn:
        # Queued runs reserved for a (gone) foreground worker become claimable by any worker.
        conn.execute(
            text(f"UPDATE runs SET reserved_for = NULL WHERE {where} AND status = :queued"),
            {**params, "queued": QUEUED},
        )
        return conn.execute(
            text(
                f"UPDATE runs SET status = :queued, error = NULL, error_detail = NULL, cancel_requested = :no, "
                f"reserved_for = NULL, finished = NULL WHERE {where} AND status IN (:interrupted, :failed, :cancelled)"
            ),
            {
                **params,
                "queued": QUEUED,
                "no": False,
                "interrupted": INTERRUPTED,
                "failed": FAILED,
                "cancelled": CANCELLED,
            },
        ).rowcount


def resume_run(store: Store, run_id: int) -> bool:
    """Requeue an interrupted, failed or cancelled run; a worker continues it from its first unfinished
    prompt, keeping every committed row."""
    return _resume(store, "id = :rid", {"rid": run_id}) > 0


def resume_experiment(store: Store, experiment_id: int) -> int:
    return _resume(store, "experiment_id = :eid", {"eid": experiment_id})
