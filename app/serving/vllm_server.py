"""A vLLM OpenAI-compatible server that `draftlab confirm` measures: started here (its own process group, a free
loopback port, a log file) or attached to (`--server URL`, a team's GPU box), asked for /health, /version, /v1/models
and /metrics, and stopped with its whole process group.

The command is COMMAND (`--vllm`, else $DRAFTLAB_VLLM, else the CPU build scripts/install_vllm.sh puts in
.vllm-venv, else `python -m vllm.entrypoints.openai.api_server`) followed by `--model TARGET --host 127.0.0.1
--port P` and, for a speculative server, `--speculative-config JSON`: exactly the JSON `draftlab export --format
deploy` holds. The CPU build's own `vllm` console script fails (it looks up the distribution "vllm"), hence the
module form; the CPU defaults add `--dtype float32 --enforce-eager` (its half-precision and graph paths are what
fails on a plain x86 CPU) and VLLM_CPU_KVCACHE_SPACE=1 GiB unless set.

A server never outlives DraftLab: `stop()` ends its whole process tree (engine/serving/process_tree.py: the group, and
every descendant seen while it ran) even when the server process itself has died, and a watchdog beside it does the same
when the process that started it dies, even by SIGKILL (the server also gets SIGTERM then: PR_SET_PDEATHSIG). Its log is
removed when it stops, unless DraftLab quoted it in an error (a failure the user is pointed to).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from engine.errors import DraftLabError
from engine.serving import process_tree

ROOT = Path(__file__).resolve().parents[2]
LOCAL_VENV_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CPU_FLAGS = ("--dtype", "float32", "--enforce-eager")
STOP_GRACE_SECONDS = 15.0
BIND_ATTEMPTS = 3  # a port chosen free can be taken before the server binds it: start again on another
PORT_TAKEN = "Address already in use"
ERROR_WORDS = ("Error", "error:", "Exception", "Address already in use")
# A log line at a level below ERROR (vLLM's `(APIServer pid=1) WARNING 05-10 16:31:45 [file.py:12] …`, uvicorn's
# `INFO:     …`) or a Python warning says nothing about why a server stopped, even when it names an error (vLLM's
# ulimit warning quotes `OSError: [Errno 24] Too many open files`).
QUIET = re.compile(r"(?:^|[\s)])(?:DEBUG|INFO|WARNING)(?::\s|\s+\d\d-\d\d \d\d:\d\d:\d\d)|\b[A-Z]\w*Warning:")
LOUD = re.compile(r"(?:^|[\s)])(?:ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d")
EXCEPTION = re.compile(r"(?:^|[\s\].])[A-Z]\w*(?:Error|Exception)(?::|$)")  # a traceback's last line: `RuntimeError: …`
POINTERS = ("See root cause above", "Traceback (most recent call last)")  # a line that points at the real error


def default_command() -> str:
    """The vLLM command when --vllm is not given: $DRAFTLAB_VLLM, else .vllm-venv's CPU build, else `python -m …`."""
    if os.environ.get("DRAFTLAB_VLLM", "").strip():
        return os.environ["DRAFTLAB_VLLM"]
    if LOCAL_VENV_PYTHON.is_file():
        return shlex.join([str(LOCAL_VENV_PYTHON), "-m", SERVER_MODULE, *CPU_FLAGS])
    return f"python -m {SERVER_MODULE}"


def command_argv(command: str, source: str = "--vllm") -> list[str]:
    """The argv of the command that starts vLLM's server (--vllm, or $DRAFTLAB_VLLM: `source` names it), or a
    DraftLabError when it does not split as one shell line or is empty."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise DraftLabError(
            f"{source} {command[:80]!r} is not a command line ({exc}); quote it as one shell string, "
            f'e.g. --vllm "python -m {SERVER_MODULE}"'
        ) from None
    if not argv:
        raise DraftLabError(
            f'{source} is empty; give the command that starts vLLM\'s server, e.g. --vllm "python -m {SERVER_MODULE}"'
        )
    return argv


def free_port() -> int:
    """A loopback port nobody listens on now (the server binds it a moment later; a race shows in its log)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a URL the user gave or ours
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, TimeoutError, OSError):
        return 0, b""


def last_error(log: str) -> str:
    """The line of a server log that says why it stopped, lines below ERROR level left out (QUIET): the last
    exception (`RuntimeError: …`), else the last ERROR line or line naming an error, else a line pointing at one
    (vLLM's "See root cause above"); else it says there is none, quoting the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    said = [line for line in lines if not QUIET.search(line)]
    erring = [line for line in said if LOUD.search(line) or any(word in line for word in ERROR_WORDS)]
    for tier in ([x for x in said if EXCEPTION.search(x)], erring):
        found = [line for line in tier if not any(p in line for p in POINTERS)]
        if found:
            return found[-1][-300:]
    if erring:
        return erring[-1][-300:]
    return f"its log names no error (its last line: {lines[-1][-200:]})" if lines else "its log is empty"


class VllmServer:
    """One server, started here (`start`) or attached to (`attach`); `url` is its base (http://HOST:PORT)."""

    def __init__(
        self, name: str, url: str, model: str, process: subprocess.Popen | None = None, log_path: Path | None = None
    ):
        self.name, self.url, self.model, self.process, self.log_path = name, url.rstrip("/"), model, process, log_path
        self.started_at = process_tree.start_time(process.pid) if process is not None else None
        self.keep_log = False  # an error quoted its log: the user is pointed to it
        self.watchdog: subprocess.Popen | None = None
        self._watchdog_pipe: int | None = None
        self._stopped = False

    @classmethod
    def start(
        cls,
        name: str,
        command: str,
        model: str,
        speculative_config: str | None = None,
        extra: tuple[str, ...] = (),
        startup_timeout: float = 600.0,
        env: dict | None = None,
        on_launch=None,
    ) -> VllmServer:
        """Launch COMMAND on a free loopback port and wait for /health; DraftLabError (one line, with the last error
        of its log) if it exits or is not ready within `startup_timeout` seconds. `on_launch(server)` is called as
        soon as its process exists (to record it, before it is ready)."""
        argv = command_argv(command)
        environment = {**os.environ, **(env or {})}
        environment.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        for attempt in range(1, BIND_ATTEMPTS + 1):
            server = cls._launch(name, argv, model, speculative_config, extra, environment)
            try:
                if on_launch is not None:
                    on_launch(server)
                server._wait_ready(startup_timeout)
                return server
            except DraftLabError:
                retry = server.port_taken() and attempt < BIND_ATTEMPTS
                server.keep_log = not retry  # a port taken and tried again: nobody is pointed to that log
                server.stop()
                if not retry:
                    raise
            except BaseException:
                server.stop()
                raise
        raise AssertionError("unreachable")  # the loop returns or raises

    @classmethod
    def _launch(
        cls,
        name: str,
        argv: list[str],
        model: str,
        speculative_config: str | None,
        extra: tuple[str, ...],
        environment: dict,
    ) -> VllmServer:
        port = free_port()
        argv = [*argv, "--model", model, "--host", "127.0.0.1", "--port", str(port), *extra]
        if speculative_config is not None:
            argv += ["--speculative-config", speculative_config]
        fd, log_name = tempfile.mkstemp(
            prefix=f"draftlab-vllm-{name.replace(' ', '_').replace('/', '_')}-", suffix=".log"
        )
        # SIGTERM when this thread's process dies (the parent, for PR_SET_PDEATHSIG, is the thread that forks: only
        # the main thread's lasts as long as the process); the watchdog covers every thread, and what forks from it.
        main = threading.current_thread() is threading.main_thread()
        try:
            process = subprocess.Popen(
                argv,
                stdout=fd,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,
                preexec_fn=process_tree.parent_death_signal(signal.SIGTERM) if main else None,
            )
        except OSError as exc:
            Path(log_name).unlink(missing_ok=True)
            raise DraftLabError(
                f"cannot start vLLM ({argv[0]}: {exc.strerror or exc}); install it with "
                f"scripts/install_vllm.sh or point --vllm / $DRAFTLAB_VLLM at your vLLM"
            ) from None
        finally:
            os.close(fd)
        server = cls(name, f"http://127.0.0.1:{port}", model, process, Path(log_name))
        server._watch()
        return server

    def _watch(self) -> None:
        """Start the watchdog (engine/serving/process_tree.py) that ends this server's tree when `stop` closes the pipe
        to it or this process dies; without one (it could not start), `stop` ends the tree itself."""
        assert self.process is not None, "the server is started before its watchdog"
        read, write = os.pipe()
        try:
            self.watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    process_tree.__file__,
                    str(self.process.pid),
                    str(self.started_at or ""),
                    str(STOP_GRACE_SECONDS),
                    str(self.log_path),
                    str(os.getpid()),
                    str(process_tree.start_time(os.getpid()) or 0),
                ],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._watchdog_pipe = write
        except OSError:
            os.close(write)
        finally:
            os.close(read)

    def tree_id(self) -> tuple[int, int | None] | None:
        """(pid, start time) of the server process, the leader of its process group; None when attached to."""
        return (self.process.pid, self.started_at) if self.process is not None else None

    @classmethod
    def attach(cls, name: str, url: str, flag: str = "--server") -> VllmServer:
        """A server already running at `url` (given as `flag`, app/serving/urls.py's check): checked with /health, its
        model read from /v1/models."""
        from app.serving.urls import http_url

        base = http_url(url, flag).rstrip("/").removesuffix("/v1")
        status, _ = http_get(base + "/health")
        if status != 200:
            raise DraftLabError(
                f"the {name} server at {base} does not answer /health (status {status or 'none'}); "
                f"check the address and that vLLM is up"
            )
        status, body = http_get(base + "/v1/models")
        try:
            model = json.loads(body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise DraftLabError(
                f"the {name} server at {base} lists no model at /v1/models; is it vLLM's OpenAI server?"
            ) from None
        return cls(name, base, model)

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None, "the server is started before it is waited for"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None and self.port_taken():
                raise DraftLabError(
                    f"the vLLM server for {self.name} could not bind "
                    f"{self.url.removeprefix('http://')} ({PORT_TAKEN}), the last of {BIND_ATTEMPTS} "
                    f"free ports DraftLab chose; another program takes loopback ports as they free "
                    f"up: stop it, or start vLLM yourself and pass --server / --baseline-server "
                    f"(log: {self.log_path})"
                )
            if code is not None:
                raise DraftLabError(
                    f"the vLLM server for {self.name} exited with status {code} before it was ready: "
                    f"{last_error(self.log())} (log: {self.log_path})"
                )
            if http_get(self.url + "/health", timeout=2.0)[0] == 200:
                return
            time.sleep(0.5)
        raise DraftLabError(
            f"the vLLM server for {self.name} was not ready after {timeout:g} s: "
            f"{last_error(self.log())} (log: {self.log_path}); raise --startup-timeout"
        )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def port_taken(self) -> bool:
        """Whether it exited because its port was taken (it binds a moment after DraftLab chose the port free)."""
        return self.process is not None and self.process.poll() is not None and PORT_TAKEN in self.log()

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def died(self, wait: float = 0.0) -> str | None:
        """None while it runs (or is not ours); else one line: its exit status and the last error of its log.
        `wait`: seconds to let it finish exiting (a request cut off mid-answer can be seen before the exit is)."""
        if self.process is None:
            return None
        try:
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None
        code = self.process.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        self.keep_log = True
        return f"the vLLM server for {self.name} died ({how}): {last_error(self.log())} (log: {self.log_path})"

    def version(self) -> str:
        status, body = http_get(self.url + "/version")
        try:
            return str(json.loads(body)["version"]) if status == 200 else ""
        except (ValueError, KeyError, TypeError):
            return ""

    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def stop(self) -> None:
        """End the server's whole process tree, also when the server process has exited already (vLLM's EngineCore
        and workers outlive it, with parent PID 1): SIGTERM to its group and to every descendant its watchdog saw,
        SIGKILL after STOP_GRACE_SECONDS. Its log is removed unless an error quoted it (`keep_log`)."""
        if self.process is None or self._stopped:
            return
        self._stopped = True
        if not self._stop_watchdog():
            process_tree.Tree(self.process.pid, self.started_at).end(STOP_GRACE_SECONDS)
        try:
            self.process.wait(timeout=5.0)  # reaped (it has ended; a zombie until now)
        except subprocess.TimeoutExpired:
            pass
        if not self.keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def _stop_watchdog(self) -> bool:
        """Have the watchdog end the tree (it knows the descendants that left the group); False if there is none."""
        watchdog, pipe = self.watchdog, self._watchdog_pipe
        if watchdog is None or pipe is None:
            return False
        self._watchdog_pipe = None
        alive = watchdog.poll() is None
        try:
            if self.keep_log:
                os.write(pipe, process_tree.KEEP_LOG)
        except OSError:
            pass
        finally:
            os.close(pipe)  # end of file: the watchdog ends the tree and exits
        if not alive:
            return False
        try:
            watchdog.wait(timeout=STOP_GRACE_SECONDS + 10.0)
            return True
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()
            return False
