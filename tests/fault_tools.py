"""Fault injection shared by tests/test_faults.py and benchmarks/bench_faults.py.

- SqliteWriteFault: every connection of this process to one SQLite file refuses writes while the
  fault is on, from its next statement (`PRAGMA query_only`, so SQLite itself answers "attempt to write a readonly
  database", the error a read-only file gives). Portable: works as root and as any user.
- chmod_read_only / DiskFull: the real thing where the platform allows it (a read-only file needs a
  non-root user; a full tmpfs needs root and a mount).
- OwnPostgres: a PostgreSQL server of our own (initdb + pg_ctl in a temp dir, as user `postgres` when run
  as root), to stop and start under a running worker; never the shared server.
- audit(): what the fault left behind: runs done / failed with a reason / stuck, duplicated rows, integrity.
- FakeServers: the processes of the stand-in vLLM servers (tests/fake_vllm.py) a confirm started, read from their
  pid files, to kill and to look for after a fault; ConfirmProcess: `draftlab confirm` in a process of its own, to
  signal.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from glob import glob
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.engine import Engine


class SqliteWriteFault:
    """While `on`, connections of this process to `path` refuse writes, from the next statement on: the flag is
    set on the connection before every statement, so a transaction that checked out its connection before the
    fault began is refused too (a fault flipped only at checkout let such a write through mid-outage, which the
    worker rightly read as the outage's end: two log lines for one outage)."""

    def __init__(self, path: str | Path):
        self.path = str(Path(path).resolve())
        self.on = False
        self.installed = False

    def _before_execute(self, conn, cursor, statement, parameters, context, executemany):
        dbapi_connection = getattr(cursor, "connection", None)
        if not isinstance(dbapi_connection, sqlite3.Connection):
            return
        if "draftlab_path" not in conn.info:  # the connection's own dict (its pool record's)
            rows = dbapi_connection.execute("PRAGMA database_list").fetchall()
            conn.info["draftlab_path"] = str(Path(rows[0][2]).resolve()) if rows and rows[0][2] else ""
        if conn.info["draftlab_path"] == self.path:
            dbapi_connection.execute(f"PRAGMA query_only = {1 if self.on else 0}")

    def __enter__(self):
        event.listen(Engine, "before_cursor_execute", self._before_execute)
        self.installed = True
        return self

    def __exit__(self, *exc):
        self.on = False
        if self.installed:
            event.remove(Engine, "before_cursor_execute", self._before_execute)
            self.installed = False


def chmod_read_only(path: str | Path, read_only: bool) -> None:
    """The database file and its -wal/-shm files read-only (or writable again). Root ignores file modes."""
    for name in [str(path), f"{path}-wal", f"{path}-shm"]:
        if os.path.exists(name):
            os.chmod(name, 0o444 if read_only else 0o644)


class DiskFull:
    """A tiny tmpfs (root only) holding the database; fill() takes its free space, free() gives it back."""

    def __init__(self, size_kb: int = 2048):
        self.dir = Path(tempfile.mkdtemp(prefix="draftlab-tmpfs-"))
        self.mounted = False
        self.size_kb = size_kb

    def mount(self) -> str | None:
        """None when mounted, else why not."""
        if os.geteuid() != 0:
            return "needs root (mount -t tmpfs)"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_kb}k", "tmpfs", str(self.dir)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return f"mount failed: {done.stderr.strip()}"
        self.mounted = True
        return None

    def fill(self) -> None:
        with open(self.dir / "ballast", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass

    def free(self) -> None:
        try:
            os.remove(self.dir / "ballast")
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.dir)], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- PostgreSQL of our own ---------------------------------------------------------------------------------


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


class OwnPostgres:
    """A temporary PostgreSQL server to stop and start. start_first() returns None or why it cannot run."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="draftlab-ownpg-"))
        self.data = self.base / "data"
        self.port = 0
        self.url = ""
        self.as_user: list[str] = []

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*self.as_user, *argv], capture_output=True, text=True, timeout=timeout)

    def start_first(self) -> str | None:
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not (initdb and pg_ctl):
            return "no initdb/pg_ctl (PATH or /usr/lib/postgresql/*/bin)"
        self.pg_ctl = pg_ctl
        if os.geteuid() == 0:  # initdb refuses root: run the server as user postgres
            import pwd

            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                return "running as root and there is no user `postgres` to run initdb as"
            runuser = shutil.which("runuser") or shutil.which("su")
            if not runuser:
                return "running as root without runuser"
            os.chmod(self.base, 0o755)
            os.chown(self.base, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"] if runuser.endswith("runuser") else []
            if not self.as_user:
                return "running as root without runuser"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        done = self._run(initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        if done.returncode != 0:
            return f"initdb failed: {(done.stderr.strip().splitlines() or [''])[-1]}"
        reason = self.start()
        if reason:
            return reason
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        return None

    def start(self) -> str | None:
        done = self._run(
            self.pg_ctl,
            "-D",
            str(self.data),
            "-l",
            str(self.base / "pg.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )
        return None if done.returncode == 0 else f"pg_ctl start failed: {done.stderr.strip()[-300:]}"

    def stop(self, mode: str = "fast") -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop", timeout=60)

    def close(self) -> None:
        if self.data.exists():
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


# --- what a fault left behind ---------------------------------------------------------------------------------

DUPLICATES = {
    "rounds": "run_id, prompt_index, round_index",
    "timings": "run_id, prompt_index, repeat",
    "prompt_results": "run_id, prompt_index",
    "draft_tokens": "run_id, prompt_index, round_index, position",
    "output_tokens": "run_id, prompt_index, position",
}


def audit(store) -> dict:
    """Runs done / failed with a reason / failed without one / stuck (queued or running, or interrupted),
    duplicated rows per table, prompts missing from done runs, and SQLite's integrity check."""
    with store.read() as conn:
        runs = conn.execute(text("SELECT id, status, error, prompts_total, prompts_done FROM runs")).all()
        dups = {
            t: conn.execute(
                text(f"SELECT COUNT(*) FROM (SELECT {key} FROM {t} GROUP BY {key} HAVING COUNT(*) > 1) d")
            ).scalar()
            for t, key in DUPLICATES.items()
        }
        stored = dict(conn.execute(text("SELECT run_id, COUNT(*) FROM prompt_results GROUP BY run_id")).all())
        integrity = conn.execute(text("PRAGMA integrity_check")).scalar() if store.dialect == "sqlite" else "ok"
    done = [r for r in runs if r.status == "done"]
    return {
        "runs": len(runs),
        "done": len(done),
        "failed_with_reason": sum(1 for r in runs if r.status == "failed" and (r.error or "").strip()),
        "failed_without_reason": sum(1 for r in runs if r.status == "failed" and not (r.error or "").strip()),
        "stuck": sum(1 for r in runs if r.status in ("queued", "running")),
        "interrupted": sum(1 for r in runs if r.status == "interrupted"),
        "other": sum(1 for r in runs if r.status not in ("done", "failed", "queued", "running", "interrupted")),
        "missing_prompts": sum((r.prompts_total or 0) - stored.get(r.id, 0) for r in done),
        "duplicates": sum(dups.values()),
        "stored": stored,
        "integrity": integrity,
    }


class CommitWatcher:
    """Polls, from its own thread, how many prompts each run has committed (the most it ever saw), so a row
    that disappears later counts as lost."""

    def __init__(self, store, interval: float = 0.05):
        self.store, self.interval = store, interval
        self.seen: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.wait(self.interval):
            try:
                with self.store.read() as conn:
                    for rid, n in conn.execute(text("SELECT run_id, COUNT(*) FROM prompt_results GROUP BY run_id")):
                        self.seen[rid] = max(self.seen.get(rid, 0), n)
            except Exception:  # noqa: BLE001 - the database is down: nothing to see right now
                pass

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(5)

    def lost(self, stored: dict[int, int]) -> int:
        return sum(max(0, n - stored.get(rid, 0)) for rid, n in self.seen.items())


# --- processes a confirm started --------------------------------------------------------------------------------


def wait_until(condition, timeout: float, what: str, step: float = 0.1):
    """condition()'s first true value within `timeout` seconds; AssertionError naming `what` if none."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            assert value, f"{what}: not within {timeout:g} s"
            return value
        time.sleep(step)


class FakeServers:
    """The stand-in vLLM servers started with $FAKE_VLLM_PIDS = `folder`: {"server", "engine", "k"} each."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def started(self) -> list[dict]:
        found = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except ValueError:  # being written
                pass
        return found

    def wait_for(self, n: int, timeout: float = 120.0) -> list[dict]:
        return wait_until(
            lambda: (lambda s: s if len(s) >= n else None)(self.started()),
            timeout,
            f"{n} stand-in vLLM servers started",
        )

    def alive(self) -> list[str]:
        """Each server or engine process still running (zombies count as ended), e.g. "engine 1234 (k=1)"."""
        from engine.serving.process_tree import running

        return [
            f"{role} {s[role]} (k={s['k']})"
            for s in self.started()
            for role in ("server", "engine")
            if running(s[role])
        ]


class ConfirmProcess:
    """`draftlab confirm ARGS` in a process of its own, Ctrl-C raising KeyboardInterrupt in it as in a terminal (a
    process started in the background inherits SIGINT ignored)."""

    LAUNCH = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from app.cli import main; sys.exit(main(sys.argv[1:]))"
    )

    def __init__(self, args: list[str], env: dict):
        root = Path(__file__).resolve().parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.LAUNCH, "confirm", *args],
            cwd=root,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def watchdogs(self) -> list[int]:
        """The pids of its servers' watchdogs (engine/serving/process_tree.py run as a script, its children)."""
        found = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == self.proc.pid and b"process_tree.py" in cmdline:
                found.append(int(name))
        return found

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err
