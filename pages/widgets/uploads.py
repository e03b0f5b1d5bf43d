"""Uploaded prompt files (the New-experiment form, the Train page and the validation panel): the file types a form
takes, saved under a content-addressed name for the worker to read, and pruned after limit("upload_days")."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from engine.text import prompt_sets
from pages.widgets.common import NO_DATABASE, store

UPLOAD_TYPES = ["jsonl", "csv", "txt", "parquet", "arrow", "feather"]


def upload_dir() -> Path:
    """Where uploaded prompt files are kept for the worker to read (engine/text/prompt_sets.py's upload_dir)."""
    return prompt_sets.upload_dir()


def save_upload(name: str, data: bytes) -> Path:
    """Save an uploaded prompt file under a content-addressed name (same file → same path) and return it; uploads
    older than limit("upload_days") are removed on the way (prune_uploads)."""
    path = upload_dir() / prompt_sets.upload_file_name(name, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    else:
        os.utime(path)  # uploaded again: its retention starts over
    prune_uploads(keep={path})
    return path


def prune_uploads(keep: Collection[Path] = frozenset(), now: float | None = None) -> list[Path]:
    """Remove uploads last written more than limit("upload_days") days ago, except `keep` and the files an
    unfinished training job still reads (an experiment freezes its uploaded prompts in the database at launch,
    so its file is not needed afterwards). Returns what was removed."""
    import time

    from engine.config.limits import limit
    from storage.jobs.training import unfinished_job_files

    cutoff = (now if now is not None else time.time()) - limit("upload_days") * 86400
    try:
        needed = {Path(p).resolve() for p in unfinished_job_files(store())} | {Path(p).resolve() for p in keep}
    except NO_DATABASE:  # no database to ask: keep everything rather than guess (a bug is raised)
        return []
    removed = []
    for path in upload_dir().glob("*"):
        try:
            if path.is_file() and path.resolve() not in needed and path.stat().st_mtime < cutoff:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed
