"""What a job (an experiment's timed group, a training job) may use of the worker that runs it: the store and the
worker's id (writes are fenced on it), retried database calls, the log, the model cache, where the job was placed
(the worker's pinned device, the devices it leased, the GPU count of its placement plan) and the live progress
the worker's heartbeat thread writes. Public, so that app/worker/timing.py and app/training/training.py never reach into
the Worker's own members.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from app.runtime.db_retry import DbRetry
from app.runtime.model_cache import ModelCache
from engine.errors import DraftLabError
from storage import Store

ProgressHook = Callable[[dict, int, int, int], None]  # (run row, prompt index, new tokens so far, repeat)


@dataclass
class JobContext:
    store: Store
    worker_id: str
    db: DbRetry
    log: Callable[[str], None]
    models: ModelCache
    device: str | None = None  # the worker's pinned device (cuda:N / cpu:N or a + group), None: each job's own
    leased: list[str] = field(default_factory=list)  # the physical devices this job's leases are for, index order
    gpus: int | DraftLabError | None = None  # the job's placement plan: a GPU count, why none fits, or no plan
    progress_hook: ProgressHook | None = None
    live_progress: dict[int, float] = field(default_factory=dict)  # run id -> 0..1 (the heartbeat thread writes it)
    cancelled: set[int] = field(default_factory=set)  # runs whose cancel was requested (the heartbeat thread reads it)
    # Writes one prompt's rows of a run in the caller's transaction (None: app/timing.record); the Worker passes its
    # own `record`, which a subclass may extend (tests keep the engine's results).
    record: Callable | None = None

    def retry(self, fn: Callable, *args, write: bool = True, **kwargs):
        """fn(*args, **kwargs) with the worker's database retry (app/runtime/db_retry.py)."""
        return self.db.retry(fn, *args, write=write, **kwargs)

    def spread(self, load_device: str) -> dict:
        """The loader's keyword for the GPU count this job leased (its placement plan), so a load on "auto" spreads
        over exactly those GPUs; the DraftLabError of a plan that found none is raised."""
        if isinstance(self.gpus, DraftLabError):
            raise self.gpus
        return {"gpus": self.gpus} if isinstance(self.gpus, int) and load_device == "auto" else {}
