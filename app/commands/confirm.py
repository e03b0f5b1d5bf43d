"""`draftlab confirm EXPERIMENT_ID`: the experiment's chosen configuration(s) measured in vLLM's server, next to the
lab's figures (the measurement: app/serving/confirm.py, which a worker's queued confirm runs too), with a progress bar
on stderr, this process's heartbeat on the confirm's row, Ctrl-C / SIGTERM closing it, and the result printed."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time

from app.arguments import ID as _id
from app.arguments import whole
from app.commands.common import database_errors_reported, store_command
from app.serving.confirm import DEFAULT_REPEATS, measure, plan, unexpected
from app.worker.sweep import sweep
from engine.errors import DraftLabError

NAME = "confirm"
CONFIG_CHOICES = ("chosen", "schedule", "all")
_repeats = whole(1, 1000, what="a number of passes per server and concurrency", fix="; e.g. --repeats 3")
_seconds = whole(1, 86_400, what="seconds", fix="; e.g. 600")
_concurrency_value = whole(1, 4096, what="a concurrency (requests in flight)", fix="; e.g. --concurrency 1,4,16")
HEARTBEAT_SECONDS = 5.0  # `draftlab confirm`'s heartbeat on its row (a worker's confirm has the worker's)


def whole_list(text: str, flag: str, value, example: str) -> list[int]:
    """`FLAG 1,4,16`: each part checked by `value` (an app/arguments.whole checker), each once; a DraftLabError
    names the bad one, or the repeat."""
    try:
        values = [value(part.strip()) for part in str(text).split(",")]
    except argparse.ArgumentTypeError as exc:
        raise DraftLabError(f"{flag}: {exc}") from None
    if len(set(values)) != len(values):
        raise DraftLabError(f"{flag} {text[:40]!r} repeats a value; list each once, e.g. {example}")
    return values


def concurrency_list(text: str) -> list[int]:
    """`--concurrency 1,4,16`: each a whole number from 1 to 4096, each once (a DraftLabError names the bad one)."""
    return whole_list(text, "--concurrency", _concurrency_value, "1,4,16")


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="measure the chosen configuration in vLLM's server, next to the lab's figures",
        description="Start vLLM's OpenAI server without speculation and with each configuration's exact "
        "--speculative-config (the deploy export's), stream the experiment's prompts at each "
        "concurrency, alternating the two servers pass by pass, and compare throughput, latency, "
        "acceptance and outputs with the lab's. Stored with the experiment; `draftlab export --format "
        "json` carries it.",
    )
    p.add_argument("experiment_id", type=_id)
    p.add_argument(
        "--configs",
        choices=CONFIG_CHOICES,
        default="chosen",
        help="chosen: the verdict's configuration (default); schedule: a k grid's schedule as vLLM's "
        "num_speculative_tokens_per_batch_size; all: every lossless speculative run",
    )
    p.add_argument(
        "--concurrency", default=None, help="requests in flight, one or a list (default: the experiment's batch sizes)"
    )
    p.add_argument(
        "--repeats",
        type=_repeats,
        default=DEFAULT_REPEATS,
        help=f"passes per server and concurrency (default {DEFAULT_REPEATS}; two or more give the speedup an interval)",
    )
    p.add_argument(
        "--vllm",
        default=None,
        metavar="COMMAND",
        help="the command that starts vLLM's OpenAI server, DraftLab appends --model, --host, --port and "
        "--speculative-config (default $DRAFTLAB_VLLM, else .vllm-venv's CPU build from "
        "scripts/install_vllm.sh, else `python -m vllm.entrypoints.openai.api_server`)",
    )
    p.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="a speculative vLLM server already running (needs --baseline-server)",
    )
    p.add_argument(
        "--baseline-server",
        default=None,
        metavar="URL",
        help="the same model served without speculation, already running",
    )
    p.add_argument(
        "--one-server-at-a-time",
        action="store_true",
        default=None,
        help="where the target-only and the speculative server cannot both fit on the device: only one up at a "
        "time, restarted in turn pass by pass (A B B A …), the same passes and storage (default "
        "$DRAFTLAB_ONE_SERVER_AT_A_TIME=1, else both up together)",
    )
    p.add_argument("--startup-timeout", type=_seconds, default=600, help="seconds a server may take to be ready")
    p.add_argument(
        "--request-timeout",
        type=_seconds,
        default=300,
        help="seconds without an answer before a request counts as timed out",
    )
    p.add_argument("--db", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object (SPEC's confirm keys)")
    return p


def run(args) -> int:
    return database_errors_reported(lambda args: store_command(args, _confirm), args)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the servers are stopped and the confirm is closed as interrupted."""


def _raise_terminated(signum, frame):
    raise Terminated()


def _confirm(args, store) -> int:
    """Measure, store, print (a table, or `--json` one JSON object); bad input raises DraftLabError before any
    server starts; a configuration that fails is one `error:` line and exit status 1, the others kept. Ctrl-C and
    SIGTERM are one `error:` line saying what is stored, and exit status 130 / 143 (128 + the signal)."""
    return signalled(lambda: _measure_and_report(args, store))


def signalled(body) -> int:
    """body()'s exit status, Ctrl-C and SIGTERM one `error:` line (what is stored: the KeyboardInterrupt's words)
    and exit status 130 / 143 (128 + the signal)."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    try:
        return body()
    except KeyboardInterrupt as exc:
        status, what = (
            (128 + signal.SIGTERM, "terminated (SIGTERM)")
            if isinstance(exc, Terminated)
            else (128 + signal.SIGINT, "interrupted (Ctrl-C)")
        )
        print(f"error: {what}; {exc.args[0] if exc.args else 'nothing was stored'}", file=sys.stderr)
        return status
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _measure_and_report(args, store) -> int:
    confirm = plan(
        store,
        args.experiment_id,
        args.configs,
        concurrency=concurrency_list(args.concurrency) if args.concurrency is not None else None,
        repeats=args.repeats,
        vllm=args.vllm,
        server=args.server,
        baseline_server=args.baseline_server,
        startup_timeout=args.startup_timeout,
        request_timeout=args.request_timeout,
        one_at_a_time=args.one_server_at_a_time,
    )

    return measure_and_print(
        store, confirm, args.configs, lambda confirm_id, seconds: _printed(args, store, confirm_id, seconds)
    )


def _printed(args, store, confirm_id: int, seconds: float) -> str:
    from storage.analysis.confirm_report import confirm_document

    document = confirm_document(store, confirm_id)
    return json.dumps(document) if args.json else report(document, seconds)


def measure_and_print(store, confirm, configs: str, render, **row) -> int:
    """Store the planned confirm (`configs`: chosen, schedule, all, or profile), measure it with a progress bar and
    this process's heartbeat, print render(confirm id, seconds); 1 when a configuration failed. `row`: more of the
    stored row (a profile's run and ks)."""
    from pages.widgets.access import cli_launcher
    from storage.records.confirms import start_confirm

    sweep(store)  # a confirm killed before (its row closed, the servers it left ended), a dead worker's
    confirm_id = start_confirm(
        store,
        confirm.experiment_id,
        configs=configs,
        concurrency=confirm.concurrency,
        repeats=confirm.repeats,
        launched_by=cli_launcher(),
        requests_total=confirm.requests,
        **row,
    )
    progress = Progress(confirm.requests, configs if configs == "profile" else "confirm")
    started = time.monotonic()
    try:
        with heartbeat(store, confirm_id):
            errors = measure(store, confirm_id, confirm, progress)
    except KeyboardInterrupt as exc:  # measure closed the confirm and stopped its servers
        raise type(exc)(
            f"confirm {confirm_id} is stored as failed with the configurations measured before; its servers are stopped"
        ) from None
    except Exception as exc:  # noqa: BLE001 - measure stored it as the confirm's error: the same line, no traceback
        progress.close()  # the bar's line ends before the error's
        print(f"error: {unexpected(exc)}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    for line in errors:
        if f"error: {line}" not in progress.written:  # one line per fault: a configuration's was shown already
            print(f"error: {line}", file=sys.stderr)
    print(render(confirm_id, time.monotonic() - started))
    return 1 if errors else 0


class Progress:
    """Requests done of the whole confirm on stderr (tqdm, as `draftlab run` shows tokens)."""

    def __init__(self, total: int, what: str = "confirm"):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True, desc=what)
        self.lock = threading.Lock()
        self.written: list[str] = []  # lines shown as they happened, not printed again at the end

    def describe(self, text: str) -> None:
        self.bar.set_description_str(text)

    def request_done(self, _record) -> None:
        with self.lock:
            self.bar.update(1)

    def write(self, line: str) -> None:
        self.written.append(line)
        self.bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


@contextlib.contextmanager
def heartbeat(store, confirm_id: int):
    """The confirm's heartbeat while this process runs it: a sweep (storage/jobs/liveness.py) closes a confirm whose
    process is gone, and ends the servers it left."""
    from storage.serving.confirm_jobs import report_confirm

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                report_confirm(store, confirm_id, None)
            except Exception:  # noqa: BLE001 - a refused beat: the next one, or the stale window, decides
                pass

    thread = threading.Thread(target=beat, name=f"confirm-{confirm_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def report(document: dict, seconds: float) -> str:
    """The confirm as a few lines: per configuration (and the lab runs it stands for) and concurrency, the server's
    speedup and acceptance next to the lab's, the speedup predicted for it and which side moved where the
    measurement falls outside that prediction, and the server's own spread where the configuration was served more
    than once."""

    def num(value, fmt="{:.3f}"):
        return "—" if value is None else fmt.format(value)

    starts = document.get("server_starts")
    how = (
        f"; {starts} server start{'s' if starts != 1 else ''}"
        + (", one at a time" if document.get("one_server_at_a_time") else "")
        if starts is not None
        else ""
    )
    lines = [
        f"confirm of experiment {document['experiment_id']} in {document['engine']} "
        f"{document['engine_version'] or '(version unknown)'}, {seconds:.0f} s{how}"
    ]
    for b in document["baseline"]["per_concurrency"]:
        lines.append(
            f"  target-only  concurrency {b['concurrency']}: {b['tokens_per_second']:.1f} tok/s, "
            f"TTFT p50 {num(b['ttft_seconds_p50'])} s, ITL p50 {num(b['itl_seconds_p50'])} s"
        )
    for config in document["configs"]:
        runs = config.get("runs") or []
        if len(runs) > 1:
            lines.append(
                f"  {config['label']} k={config['k']}: one server for runs {', '.join(map(str, runs))} (the same "
                f"speculative config), measured once for all of them"
            )
        for m in config["per_concurrency"]:
            ci = m["speedup_ci"]
            interval = f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else " (one pass: no interval)"
            speedup = (
                f"no speedup: {m['speedup_warning']}"
                if m["speedup_warning"]
                else f"speedup {num(m['speedup'], '{:.2f}')}×{interval} per generated token"
            )
            lines.append(
                f"  {config['label']} k={config['k']} concurrency {m['concurrency']}: "
                f"{m['tokens_per_second']:.1f} tok/s, {speedup}; "
                f"acceptance server {num(m['server_draft_acceptance_rate'])} vs lab "
                f"{num(m['lab_draft_acceptance_rate'])}; outputs = server baseline "
                f"{num(m['outputs_match_server_baseline'], '{:.0%}')}, = lab "
                f"{num(m['outputs_match_lab'], '{:.0%}')}"
            )
            lines += _prediction_line(m) + _spread_line(config, m)
    return "\n".join(lines)


def _prediction_line(m: dict) -> list[str]:
    """`predicted 1.18× (1.10–1.25) from profile 4: …`, and outside it which side moved; nothing without one."""
    from storage.analysis.prediction_check import moved_words

    if m.get("predicted_speedup") is None:
        return []
    lo, hi = m["predicted_speedup_ci"]
    line = f"    predicted {m['predicted_speedup']:.2f}× ({lo:.2f}–{hi:.2f}) from profile {m['predicted_profile_id']}"
    check = m.get("prediction_check")
    if check is None:
        line += ": no measured speedup to hold against it"
    elif check["outside"]:
        line += f": measured {check['direction']} it; {moved_words(check)}"
    else:
        line += ": measured within it"
    return [line]


def _spread_line(config: dict, m: dict) -> list[str]:
    """The server's own spread where this configuration was served more than once at this concurrency."""
    spread = m.get("server_spread")
    if not spread:
        return []
    servings = spread["servings"]
    confirms = sorted({s["confirm_id"] for s in servings})
    relative = spread["relative"]
    measured = ", ".join(f"{s['speedup']:.2f}×" for s in servings)
    return [
        f"    server's own spread: served {len(servings)} times (confirm{'s' if len(confirms) > 1 else ''} "
        f"{', '.join(map(str, confirms))}): {measured}"
        + (f", {relative:.0%} apart" if relative is not None else "")
        + ": between server starts of the same configuration, not between the lab and the server"
    ]
