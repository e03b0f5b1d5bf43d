"""`draftlab ui`: the dashboard (Streamlit) plus a local worker when no live worker serves the database.

Both run as child processes; stopping the dashboard (Ctrl-C, SIGTERM from `docker stop`) stops the worker too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ENTRY = Path(__file__).resolve().parent / "main.py"
ROOT = ENTRY.parent.parent
DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"  # localhost only unless asked: the dashboard can launch jobs on this machine
INSECURE_HELP = (
    "serve beyond loopback without a login (only behind something that authenticates: a VPN, "
    "an authenticating proxy); otherwise set $DRAFTLAB_PASSWORD or configure OIDC in "
    ".streamlit/secrets.toml [auth]"
)


def streamlit_command(port: int, host: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ENTRY),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
        # Uncaught exceptions: a generic message in the browser, details only in this process's log
        # ("none"; the deprecated False would mean "stacktrace").
        "--client.showErrorDetails",
        "none",
    ]


def worker_command(db: str) -> list[str]:
    """The local worker; a URL with a password travels in $DRAFTLAB_DB only, never on a command line (`ps`)."""
    from storage.db.store import safe_url

    return [sys.executable, "-m", "app.cli", "worker", *(["--db", db] if safe_url(db) == db else [])]


def _needs_worker(db: str) -> bool:
    from storage import open_store
    from storage.jobs import liveness

    store = open_store(db)
    try:
        return liveness.live_workers(store) == 0
    finally:
        store.dispose()


def _stop(process: subprocess.Popen | None, name: str, timeout: float = 10.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"draftlab ui: {name} did not stop in {timeout:g} s; killing it", file=sys.stderr)
        process.kill()
        process.wait()


PORTS = (1, 65535)


def port_refusal(port) -> str | None:
    """Why `port` cannot be served on (checked before a worker or the dashboard starts), else None."""
    low, high = PORTS
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= high:
        return f"--port {port} is not a TCP port; use a whole number from {low} to {high}, e.g. --port {DEFAULT_PORT}"
    return None


def main(db: str | None = None, port: int = DEFAULT_PORT, host: str = DEFAULT_HOST, insecure: bool = False) -> int:
    """Run the dashboard until it exits or is interrupted; returns its exit status.

    Beyond loopback it needs a login (pages/widgets/access.py: OIDC in .streamlit/secrets.toml, or $DRAFTLAB_PASSWORD)
    unless `insecure`; without one it refuses with one `error:` line and status 2, before starting anything."""
    from pages.widgets.access import PASSWORD_ENV, login_mode, serving_refusal
    from storage import resolve_url
    from storage.db.store import safe_url

    refusal = serving_refusal(host, insecure) or port_refusal(port)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    url = resolve_url(db)
    shown = safe_url(url)  # what we print: the password stays out of logs and terminals
    env = dict(os.environ, DRAFTLAB_DB=url)
    # Children must import the project's packages (app, engine, storage, pages) from a plain checkout too.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    worker_env = {k: v for k, v in env.items() if k != PASSWORD_ENV}  # only the dashboard checks it
    try:
        needs_worker = _needs_worker(url)
    except Exception as exc:  # noqa: BLE001 - an unreachable or unreadable database: one line, not a traceback
        from app.db_errors import db_error_reason

        print(
            f"error: cannot open the database {shown} ({db_error_reason(exc, url)}); check --db / $DRAFTLAB_DB",
            file=sys.stderr,
        )
        return 2
    worker = None
    if needs_worker:
        worker = subprocess.Popen(worker_command(url), env=worker_env)
        print(f"draftlab ui: started a local worker (pid {worker.pid}) on {shown}", file=sys.stderr)
    else:
        print(f"draftlab ui: a live worker already serves {shown}; not starting another", file=sys.stderr)
    dashboard = subprocess.Popen(streamlit_command(port, host), env=env)
    print(f"draftlab ui: dashboard on http://{host}:{port} (database {shown}; {login_mode(host)})", file=sys.stderr)

    def _terminate(signum, _frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        while True:
            code = dashboard.poll()
            if code is not None:
                return code
            if worker is not None and worker.poll() is not None:
                print(
                    f"draftlab ui: the local worker exited with status {worker.returncode}; runs stay queued "
                    f"until a worker starts (`draftlab worker --db {shown}`)",
                    file=sys.stderr,
                )
                worker = None
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(dashboard, "the dashboard")
        _stop(worker, "the worker")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="draftlab ui", description=__doc__)
    parser.add_argument("--db", default=None, help="database URL (default: $DRAFTLAB_DB, else sqlite:///draftlab.db)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"{PORTS[0]} to {PORTS[1]}")
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to bind (0.0.0.0 inside a container)")
    parser.add_argument("--insecure", action="store_true", help=INSECURE_HELP)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _parse(sys.argv[1:])
    sys.exit(main(args.db, args.port, args.host, args.insecure))
