"""Where a worker's job runs: an experiment's device against the worker's pinned one, what the loader is given,
which timing leases (one per physical device) the job needs, and how the device is named in the results.

    place()         an experiment's device (auto / cpu / cuda / cuda:N) on a pinned worker (cuda:N, cpu:N, a + group)
    load_device()   the device string the loader gets for it
    lease_key()     the timing lease of one device on this host; group_members(): the devices of a + group
    pin_cuda()      CUDA_VISIBLE_DEVICES for a worker pinned to GPUs
    device_name()   what runs.device_name and a training job record
    lease_devices() the devices a job leases (the fewest GPUs its pair fits, engine/models/placement.py's plan)
    acquire_leases() / release_device_lease(): take all of a job's leases or none; give one back
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch

from app.db_errors import transient_db_error
from app.runtime.db_retry import DbRetry
from engine.errors import DraftLabError
from engine.models.loading import ModelPair, plan_pair, resolve_dtype
from storage import Store
from storage.jobs.leases import acquire_lease, release_lease


def gpus_of(pair: ModelPair) -> list[torch.device]:
    """The GPUs the pair's weights are on (several for a target placed over them); none for a CPU pair."""
    return [d for d in pair.devices if d.type == "cuda"] if pair.device.type == "cuda" else []


def group_members(device: str) -> list[str]:
    """The devices of a `+` group (`cuda:0+cuda:1`: one worker owning both GPUs), in index order; a plain device
    is a group of one."""
    return sorted(device.split("+"), key=lambda d: (d.split(":")[0], int(d.split(":")[1]) if ":" in d else -1))


def lease_key(device: str) -> str:
    """The timing lease a job on `device` (auto / cpu / cuda / cuda:N, or cpu:N: a CPU worker slot of
    `draftlab worker --devices cpu:0,cpu:1`, its own lease so such workers time side by side) needs: one per
    physical device (per slot for cpu:N)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = "cuda:0"
    return f"{socket.gethostname()}:{device}"


def place(experiment_device: str, pinned: str | None) -> str:
    """Where a pinned worker (`draftlab worker --devices`: cuda:N or cpu:N) times an experiment: an experiment
    on auto/cuda goes to the worker's device; one that names a device (cpu, cuda:N) keeps it (and its lease)."""
    if pinned is None or experiment_device not in ("auto", "cuda"):
        return experiment_device
    if experiment_device == "cuda" and pinned.startswith("cpu"):
        return "cuda"  # asked for a GPU: a CPU slot does not quietly time it on the CPU
    return pinned


def load_device(device: str) -> str:
    """The device string the loader gets: a cpu:N slot (or a cpu:0+cpu:1 group) loads on the CPU; a worker pinned
    to cuda:N sees only that GPU (CUDA_VISIBLE_DEVICES=N, set by the supervisor or by pin_cuda()), so it loads on
    "cuda"; a cuda:0+cuda:1 group sees its GPUs only and loads on "auto" (over as many of them as the target
    needs)."""
    if "+" in device:
        return "auto" if device.startswith("cuda") else "cpu"
    return device.split(":")[0] if ":" in device else device


def pin_cuda(device: str | None) -> None:
    """A worker pinned to cuda:N (or a group cuda:0+cuda:1) sees only its GPUs: CUDA_VISIBLE_DEVICES=N (0,1)
    unless set already (the supervisor sets it). Call before CUDA is initialised. The leases and the worker id keep
    the physical names."""
    if device and device.startswith("cuda:") and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(d.split(":", 1)[1] for d in group_members(device))


def device_name(device: torch.device, pinned: str | None = None, leased: list[str] | None = None) -> str:
    """What runs.device_name records: the GPU's name and which one (the physical cuda:N of a pinned worker),
    or cpu (cpu:N for a CPU slot of `--devices cpu:0,cpu:1`). A job over several devices (`leased`, their
    physical names) names them all: `NVIDIA H200 ×2 (cuda:0, cuda:1)` (`cpu ×2 (cpu:0, cpu:1)` for fake slots)."""
    if leased and len(leased) > 1:
        kinds = [torch.cuda.get_device_name(i) for i in range(len(leased))] if device.type == "cuda" else ["cpu"]
        return f"{' + '.join(dict.fromkeys(kinds))} ×{len(leased)} ({', '.join(leased)})"
    if leased and pinned and "+" in pinned:
        pinned = leased[0]  # one device of a + group
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        which = pinned if pinned and pinned.startswith("cuda:") else f"cuda:{index}"
        return f"{torch.cuda.get_device_name(device)} ({which})"
    return pinned if pinned and pinned.startswith("cpu:") else "cpu"


# --- leases: one timed job per physical device ---------------------------------------------------------------


def lease_devices(
    placed: str,
    target: str,
    draft: str | None,
    dtype: str,
    trust: bool,
    *,
    loaded,
    release: Callable[[], None],
    plans: dict,
    free_memory: Callable[[], list[int]],
) -> tuple[list[str], int | DraftLabError | None]:
    """The devices a job placed on `placed` leases, physical names in index order: that one device, or, where the
    worker sees several GPUs (a `cuda:0+cuda:1` group, or plain `draftlab worker` on auto), the fewest of them the
    pair fits (engine.models.placement: config-only, before any lease; a cpu:0+cpu:1 group is the fake equivalent,
    planned on `free_memory`). Also the job's plan for the load: the GPU count, or the DraftLabError saying the pair
    fits none (the job then fails with it under its first device's lease), or None. `loaded`: the worker's held pair
    (app/model_cache.LoadedPair or None), `release` drops it; `plans` caches (target, draft, dtype, trust) -> GPUs."""
    if "+" in placed:
        visible = group_members(placed)
    elif placed == "auto" and torch.cuda.is_available():
        visible = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    else:
        visible = []
    if len(visible) < 2:
        return [visible[0] if visible else placed], None
    on_gpu = visible[0].startswith("cuda")
    if (
        on_gpu
        and loaded is not None
        and (loaded.key[0], *loaded.key[2:5]) == (target, load_device(placed), dtype, trust)
    ):
        used = [d.index or 0 for d in gpus_of(loaded.pair)]  # already loaded here (draftlab run adopts it)
        return [visible[i] for i in used], len(used)
    plan_key = (target, draft, dtype, trust)
    if plan_key not in plans:
        if on_gpu:
            release()  # this worker's own loaded pair is not free memory, but it is about to go
        free = free_memory()
        if not free:
            return visible[:1], None
        try:
            dt = resolve_dtype(dtype, torch.device("cuda" if on_gpu else "cpu"))
            plans[plan_key] = plan_pair(target, draft, dt, trust, free=free[: len(visible)]).gpus
        except DraftLabError as exc:
            return visible[:1], exc
    return visible[: plans[plan_key]], plans[plan_key]


def acquire_leases(
    db: DbRetry, store: Store, keys: list[str], worker_id: str, experiment_id: int | None, stale_seconds: float
) -> None | tuple[str, str]:
    """Take every lease in `keys` (index order) or none: on the first held by another live worker, give back those
    taken here and return (that lease, its holder); None when all are this worker's."""
    taken: list[str] = []
    for key in keys:
        holder = db.retry(acquire_lease, store, key, worker_id, experiment_id, stale_seconds)
        if holder is not None:
            for mine in reversed(taken):
                release_device_lease(store, mine, worker_id)
            return key, holder
        taken.append(key)
    return None


def release_device_lease(store: Store, key: str, worker_id: str) -> None:
    """Give a lease back: one attempt (a lease left behind ends with this worker: unregister, or the next sweep)."""
    try:
        release_lease(store, key, worker_id)
    except Exception as exc:  # noqa: BLE001
        if not transient_db_error(exc):
            raise
