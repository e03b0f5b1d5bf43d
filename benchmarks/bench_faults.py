"""Faults and bad input: what DraftLab leaves behind (issue 9, "Nothing lost, nothing stuck").

    python benchmarks/bench_faults.py              # every case, two Markdown tables (about 3 minutes on 2 cores)
    python benchmarks/bench_faults.py --quick      # without the two 30-run soaks

Part 1 injects a fault into a worker timing tiny random models (tests/tiny_models.py; baseline + k=1,2, 6
prompts of 8 new tokens, 1 repeat, unless the case says otherwise) and reports, once the fault is over:

- runs completed: runs `done` with every prompt stored
- failed-with-reason: runs `failed` with a one-line error (a run failed without one would be a bug)
- stuck: runs still `queued` or `running`, or left `interrupted`, at the end of the case
- rows lost: prompt rows seen committed at any moment of the case (polled every 50 ms) that are gone at the
  end, plus prompts missing from `done` runs; `dup` counts duplicated (run, prompt, round), (run, prompt,
  repeat), (run, prompt), draft- and output-token keys

Faults: SQLite writes refused (`PRAGMA query_only` on every connection this process opens: SQLite's own
"attempt to write a readonly database", portable), SQLite on a full tmpfs (root only), SQLite file made
read-only with chmod (non-root only: root ignores file modes), a PostgreSQL server of our own stopped and
started (never the shared one), `draftlab run` killed with SIGKILL or SIGTERM. "Bound" is the worker's retry
window ($DRAFTLAB_DB_RETRY_SECONDS, default 300 s), shortened here so an outage can outlast it.

Part 2 runs each bad input through the real command line and prints its exit status and its one `error:` line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from app.db_errors import DatabaseUnavailable  # noqa: E402
from app.worker.worker import Worker  # noqa: E402
from storage import open_store  # noqa: E402
from storage.jobs.experiments import enqueue_experiment  # noqa: E402
from tests import tiny_models  # noqa: E402
from tests.fault_tools import CommitWatcher, DiskFull, OwnPostgres, SqliteWriteFault, audit, chmod_read_only  # noqa: E402

torch.set_num_threads(1)
PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13", "t30 t31 t32", "t8 t9", "t14 t15 t16"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
ROWS: list[tuple] = []


def make_models(base: Path) -> dict[str, str]:
    target = tiny_models.llama(0, layers=2, sharpness=4.0)
    draft = tiny_models.noisy_copy(target, seed=1, noise=0.3)
    alien = tiny_models.llama(2, layers=1)
    paths = {}
    for name, model, tok in (
        ("target", target, tiny_models.tokenizer()),
        ("draft", draft, tiny_models.tokenizer()),
        ("alien", alien, tiny_models.tokenizer(prefix="w")),
    ):
        model.save_pretrained(base / name)
        tok.save_pretrained(base / name)
        paths[name] = str(base / name)
    return paths


def enqueue(store, models, prompts=PROMPTS, name="bench"):
    return enqueue_experiment(
        store,
        name=name,
        target=models["target"],
        draft=models["draft"],
        prompts="inline",
        sampling={"temperature": 0.0, "max_new_tokens": 8, "seed": 3},
        device="cpu",
        sweep_values=[1, 2],
        prompt_texts=prompts,
    )


def record(fault: str, found: dict, lost: int, note: str = "") -> None:
    ROWS.append(
        (
            fault,
            found["done"],
            found["failed_with_reason"] + found["failed_without_reason"],
            found["stuck"] + found["interrupted"],
            lost + found["missing_prompts"],
            found["duplicates"],
            found["integrity"],
            note,
        )
    )
    print(f"  {fault}: {found['done']} done, {found['failed_with_reason']} failed, lost {lost}", file=sys.stderr)


def skipped(fault: str, why: str) -> None:
    ROWS.append((fault, "-", "-", "-", "-", "-", "-", f"not run: {why}"))
    print(f"  {fault}: not run ({why})", file=sys.stderr)


# --- part 1: in-process worker, fault mid-run -----------------------------------------------------------------


def mid_run(fault: str, url: str, models, on, off, outage: float, bound: float, note: str = "") -> None:
    """The fault starts with the first decode of prompt 3 (so that prompt's commit is the first refused
    write) and lasts `outage` seconds; the worker keeps running until it is over, then stops."""
    store = open_store(url)
    enqueue(store, models)
    over = threading.Event()
    fired = threading.Event()

    def hook(run, index, tokens, repeat):
        if index == 2 and not fired.is_set():
            fired.set()
            on()
            threading.Timer(outage, lambda: (off(), over.set())).start()

    logs: list[str] = []
    worker = Worker(
        store,
        heartbeat_seconds=0.3,
        progress_seconds=0.1,
        poll_seconds=0.1,
        db_retry_seconds=bound,
        progress_hook=hook,
        log=logs.append,
    )
    watcher = CommitWatcher(store).start()
    worker.start()
    try:
        try:
            worker.work(until_idle=True)
        except DatabaseUnavailable:
            pass
        over.wait(outage + 30)
        time.sleep(1.0)  # the heartbeat sees the database back; stop() writes what was refused
    finally:
        worker.stop()
        watcher.stop()
    found = audit(store)
    store.dispose()
    if not fired.is_set():
        note = "fault never fired; " + note
    lines = sum("does not accept writes" in line for line in logs)
    record(fault, found, watcher.lost(found["stored"]), f"{lines} log line(s) for the outage; {note}".rstrip("; "))


def soak_case(fault: str, url: str, models, on, off) -> None:
    from tests.test_faults import soak

    store = open_store(url)
    found, lost, logs, outages = soak(store, models, on, off)
    store.dispose()
    lines = sum("does not accept writes" in line for line in logs)
    record(
        fault, found, lost, f"{len(outages)} outages of 2.5 s, the third past a 1 s bound; {lines} outage log line(s)"
    )


# --- part 1: the command line killed or starved ---------------------------------------------------------------


def cli(*argv, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *argv],
        cwd=ROOT,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_run(url: str, models, prompt_file: Path, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "run",
            "--target",
            models["target"],
            "--draft",
            models["draft"],
            "--prompts",
            str(prompt_file),
            "--k",
            "1,2",
            "--max-new-tokens",
            "24",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--db",
            url,
        ],
        cwd=ROOT,
        env=env or ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_rows(store, proc, n=3, timeout=180) -> None:
    from sqlalchemy import text

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with store.read() as conn:
            if conn.execute(text("SELECT COUNT(*) FROM prompt_results")).scalar() >= n:
                return
        time.sleep(0.05)


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("error:")]
    return " / ".join(lines) if lines else "(no error: line)"


def recover(url: str) -> str:
    """What a user does next: `draftlab resume 1`, then `draftlab worker --until-idle`."""
    resumed = cli("resume", "1", "--db", url)
    requeued = re.search(r"requeued (\d+)", resumed.stdout)
    worked = cli("worker", "--until-idle", "--db", url)
    return (
        f"`resume 1` requeued {requeued.group(1) if requeued else '?'} at once; `worker --until-idle` "
        f"exit {worked.returncode}"
    )


def killed(fault: str, url: str, models, base: Path, sig: int) -> None:
    store = open_store(url)
    prompt_file = base / f"prompts-{sig}.txt"
    prompt_file.write_text("\n".join(f"t{i} t{i + 1} t{i + 2}" for i in range(3, 23)) + "\n")
    watcher = CommitWatcher(store).start()
    proc = start_run(url, models, prompt_file)
    wait_rows(store, proc)
    proc.send_signal(sig)
    code = proc.wait(60)
    assert proc.stderr is not None, "start_run pipes stderr"
    err = proc.stderr.read()
    proc.stderr.close()
    listed = cli("list", "--db", url).stdout
    statuses = sorted({line.split()[3] for line in listed.splitlines() if line.lstrip().startswith("run ")})
    after = recover(url)
    watcher.stop()
    found = audit(store)
    store.dispose()
    message = "" if sig == signal.SIGKILL else f"; message: {shorten(error_line(err), base)}"
    record(
        fault,
        found,
        watcher.lost(found["stored"]),
        f"exit {128 - code if code < 0 else code}; `list` right after: {'/'.join(statuses)}; {after}{message}",
    )


def starved_cli(fault: str, url: str, path: Path, models, base: Path, on, off) -> None:
    """`draftlab run` whose database stops accepting writes for good (bound 2 s): its exit status and line;
    then the space comes back and the user runs list, resume, worker."""
    store = open_store(url)
    prompt_file = base / "prompts-starved.txt"
    prompt_file.write_text("\n".join(f"t{i} t{i + 1} t{i + 2}" for i in range(3, 23)) + "\n")
    watcher = CommitWatcher(store).start()
    proc = start_run(url, models, prompt_file, env={**ENV, "DRAFTLAB_DB_RETRY_SECONDS": "2"})
    wait_rows(store, proc)
    on()
    try:
        code = proc.wait(120)
    finally:
        off()
    assert proc.stderr is not None, "start_run pipes stderr"
    err = proc.stderr.read()
    proc.stderr.close()
    tracebacks = err.count("Traceback")
    listed = cli("list", "--db", url).stdout
    statuses = sorted({line.split()[3] for line in listed.splitlines() if line.lstrip().startswith("run ")})
    after = recover(url)
    watcher.stop()
    found = audit(store)
    store.dispose()
    record(
        fault,
        found,
        watcher.lost(found["stored"]),
        f"exit {code}, {tracebacks} traceback(s), message: {shorten(error_line(err), base)}; then writable again: "
        f"`list`: {'/'.join(statuses)}; {after}",
    )


def shorten(text: str, base: Path) -> str:
    return re.sub(r"/tmp/draftlab-tmpfs-[^/]+", "$TMPFS", text.replace(str(base), "$TMP"))


# --- part 2: bad input ----------------------------------------------------------------------------------------


def bad_inputs(models, base: Path) -> list[tuple[str, str, int | str, str]]:
    good = base / "good.txt"
    good.write_text("t3 t4 t5\nt9 t10\n")
    bad = base / "bad.jsonl"
    bad.write_text('{"prompt": "t3 t4"}\n{"text": "no prompt field"}\n')
    db = f"sqlite:///{base / 'bad-input.db'}"
    ro_path = base / "ro.db"
    open_store(f"sqlite:///{ro_path}").dispose()
    chmod_path = base / "chmod.db"
    open_store(f"sqlite:///{chmod_path}").dispose()

    def run(*extra, target=None, draft=None, prompts=None, db_url=None):
        return (
            "run",
            "--target",
            target or models["target"],
            "--draft",
            draft or models["draft"],
            "--prompts",
            str(prompts or good),
            "--max-new-tokens",
            "8",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--db",
            db_url or db,
            *extra,
        )

    cases = [
        ("unknown model path", run(target=str(base / "no-such-model")), None),
        ("mismatched tokenizers", run(draft=models["alien"]), None),
        ("k <= 0 (`--k 0`)", run("--k", "0"), None),
        ("k <= 0 (`--k 2,-1`)", run("--k", "2,-1"), None),
        ("temperature < 0", run("--temperature", "-0.5"), None),
        ("malformed prompt file (line 2 has no prompt)", run(prompts=bad), None),
        ("bad --db (no such driver)", run(db_url="nosuchdb://x"), None),
        ("bad --db (server unreachable, password in URL)", run(db_url="postgresql://me:hunter22@127.0.0.1:1/x"), None),
        ("read-only database (`?mode=ro` URI)", run(db_url=f"sqlite:///file:{ro_path}?mode=ro&uri=true"), None),
        ("bad $DRAFTLAB_STALE_SECONDS (`list`)", ("list", "--db", db), {"DRAFTLAB_STALE_SECONDS": "soon"}),
        ("unicode digit id (`resume ²`)", ("resume", "²", "--db", db), None),
        ("unicode digit id (`resume １`, fullwidth)", ("resume", "１", "--db", db), None),
    ]
    if os.geteuid() != 0:
        chmod_read_only(chmod_path, True)
        cases.append(("read-only database file (chmod 444)", run(db_url=f"sqlite:///{chmod_path}"), None))
    out: list[tuple[str, str, int | str, str]] = []  # (case, command, exit status or "-", error line)
    for name, argv, extra_env in cases:
        done = cli(*argv, env={**ENV, **(extra_env or {})})
        line = error_line(done.stderr)
        if line == "(no error: line)" and done.stdout.strip():
            line = "stdout: " + done.stdout.strip().splitlines()[0]
        out.append((name, " ".join(argv[:1]), done.returncode, shorten(line, base)))
        print(f"  {name}: {done.returncode}", file=sys.stderr)
    if os.geteuid() == 0:
        out.append(
            (
                "read-only database file (chmod 444)",
                "run",
                "-",
                "not run: root ignores file modes (the `?mode=ro` row is the same check)",
            )
        )
    from pages.widgets.common import parse_id

    out.append(
        (
            "unicode digit id in a dashboard URL (`?experiment=²`)",
            "ui",
            "-",
            f"parse_id('²') = {parse_id('²')!r}: ignored, the page shows its default selection",
        )
    )
    return out


# --- main -----------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip the 30-run soaks")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="draftlab-bench-faults-"))
    os.chmod(base, 0o755)
    models = make_models(base / "models")
    pg = OwnPostgres()
    disk = DiskFull(size_kb=16384)
    try:
        print("part 1: faults", file=sys.stderr)
        path = base / "control.db"
        mid_run("none (control)", f"sqlite:///{path}", models, lambda: None, lambda: None, 0.1, 30)
        for outage, bound in ((2.0, 30.0), (5.0, 1.0)):
            path = base / f"refused-{outage:g}.db"
            fault = SqliteWriteFault(path).__enter__()
            try:
                mid_run(
                    f"SQLite writes refused {outage:g} s mid-run, bound {bound:g} s",
                    f"sqlite:///{path}",
                    models,
                    lambda fault=fault: setattr(fault, "on", True),
                    lambda fault=fault: setattr(fault, "on", False),
                    outage,
                    bound,
                )
            finally:
                fault.__exit__()
        why = disk.mount()
        if why:
            skipped("SQLite disk full (tmpfs) 2 s mid-run, bound 30 s", why)
        else:
            mid_run(
                "SQLite disk full (tmpfs) 2 s mid-run, bound 30 s",
                f"sqlite:///{disk.dir / 'full.db'}",
                models,
                disk.fill,
                disk.free,
                2.0,
                30.0,
            )
        if os.geteuid() == 0:
            skipped("SQLite file chmod 444 for 2 s mid-run", "root ignores file modes (same error as `writes refused`)")
        else:
            path = base / "chmod.db"
            mid_run(
                "SQLite file chmod 444 for 2 s mid-run, bound 30 s",
                f"sqlite:///{path}",
                models,
                lambda: chmod_read_only(path, True),
                lambda: chmod_read_only(path, False),
                2.0,
                30.0,
            )
        why = pg.start_first()
        if why:
            skipped("PostgreSQL server stopped mid-run", why)
        else:
            for outage, bound in ((2.0, 30.0), (5.0, 1.0)):
                schema_url = fresh_schema(pg.url)
                mid_run(
                    f"PostgreSQL server stopped {outage:g} s mid-run, bound {bound:g} s",
                    schema_url,
                    models,
                    lambda: pg.stop("fast"),
                    lambda: pg.start(),
                    outage,
                    bound,
                )
        if not args.quick:
            path = base / "soak.db"
            fault = SqliteWriteFault(path).__enter__()
            try:
                soak_case(
                    "soak, SQLite: 30 runs, writes refused 3 times",
                    f"sqlite:///{path}",
                    models,
                    lambda fault=fault: setattr(fault, "on", True),
                    lambda fault=fault: setattr(fault, "on", False),
                )
            finally:
                fault.__exit__()
            if pg.url:
                soak_case(
                    "soak, PostgreSQL: 30 runs, server stopped 3 times",
                    fresh_schema(pg.url),
                    models,
                    lambda: pg.stop("fast"),
                    lambda: pg.start(),
                )
        killed(
            "`draftlab run` killed with SIGKILL (20 prompts)",
            f"sqlite:///{base / 'kill9.db'}",
            models,
            base,
            signal.SIGKILL,
        )
        killed(
            "`draftlab run` sent SIGTERM (20 prompts)", f"sqlite:///{base / 'term.db'}", models, base, signal.SIGTERM
        )
        if disk.mounted:
            disk.free()
            starved_cli(
                "`draftlab run`, disk full for good (tmpfs), bound 2 s",
                f"sqlite:///{disk.dir / 'cli.db'}",
                disk.dir / "cli.db",
                models,
                base,
                disk.fill,
                disk.free,
            )
        elif os.geteuid() != 0:
            path = base / "cli-chmod.db"
            starved_cli(
                "`draftlab run`, database file chmod 444 for good, bound 2 s",
                f"sqlite:///{path}",
                path,
                models,
                base,
                lambda: chmod_read_only(path, True),
                lambda: chmod_read_only(path, False),
            )
        print("part 2: bad input", file=sys.stderr)
        inputs = bad_inputs(models, base)
    finally:
        pg.close()
        disk.close()
        shutil.rmtree(base, ignore_errors=True)

    print("| fault injected | runs completed | failed-with-reason | stuck | rows lost | dup rows | integrity | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print()
    print("| bad input | command | exit | the one line it prints |")
    print("|---|---|---|---|")
    for name, command, code, line in inputs:
        print(f"| {name} | {command} | {code} | {line.replace('|', '&#124;')} |")
    return 0


def fresh_schema(server_url: str) -> str:
    import uuid
    from urllib.parse import quote

    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{server_url}?options={quote(f'-csearch_path={schema}')}"


if __name__ == "__main__":
    sys.exit(main())
