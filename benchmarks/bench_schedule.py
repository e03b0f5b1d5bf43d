"""The k schedule of a pair across batch sizes (issue 20 item 8): one `draftlab run --batch-size ... --k ... --json`
grid through the product's CLI (a separate process, as a user runs it), then per batch size a table of the
target-only baseline and every k: speedup with its 95 % interval (paired, resampling batches), throughput over the
batch, tokens per round, c (target step / draft step), verify cost (a verify pass in target steps), TTFT p50,
ITL p50 / p95 and request latency p95; then the schedule (the k to serve at each batch size, k = 0
where speculation measurably loses) and vLLM's `num_speculative_tokens_per_batch_size` ranges; then the wall time
of the whole command and the load average before and after it.

    python benchmarks/bench_schedule.py                       # demo pair, batch 1,2,4,8,16 x k 1-6, 32 prompts
    python benchmarks/bench_schedule.py --batch-sizes 1,4 --k 1,2 --repeats 1 --max-new-tokens 16 --num-prompts 8
    python benchmarks/bench_schedule.py --db sqlite:///schedule.db     # keep the database for `draftlab ui`

Prompts: `--prompts` is any spec the CLI takes; with `--num-prompts N` the first N of them are written to a
temporary .jsonl first (so every batch size divides the set: 32 prompts are 2 batches at batch 16; the last batch
of a set B does not divide is smaller, docs/metrics.md "At batch size B"). The speedup's interval resamples
batches, so at a batch size with few batches it rests on very few units: read it with that in mind.

The load average matters: timing runs on a shared machine compete with whatever else runs there. The experiment
interleaves its arms batch by batch (protocol v2), so ratios survive load better than absolute tokens per second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.text.prompt_sets import load_prompts  # noqa: E402


def load() -> str:
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unavailable"


def ms(seconds) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def prompt_file(spec: str, n: int, folder: Path) -> Path:
    """The first n prompts of a spec as a .jsonl (plain prompts only: conversations would need their template)."""
    prompts = load_prompts(spec)
    if len(prompts) < n:
        sys.exit(
            f"error: {spec} holds {len(prompts)} prompts, fewer than --num-prompts {n}; "
            f"join sets with + (e.g. code:tune+code:validation) or lower --num-prompts"
        )
    if not all(isinstance(p, str) for p in prompts[:n]):
        sys.exit(f"error: {spec} holds conversations; pick plain prompt sets or leave out --num-prompts")
    path = folder / f"prompts_{n}.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts[:n]), encoding="utf-8")
    return path


def command(args, prompts: str, db: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "app.cli",
        "run",
        "--target",
        args.target,
        "--draft",
        args.draft,
        "--prompts",
        prompts,
        "--batch-size",
        args.batch_sizes,
        "--k",
        args.k,
        "--repeats",
        str(args.repeats),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--temperature",
        "0",
        "--device",
        args.device,
        "--db",
        db,
        "--json",
    ]


def table(size: int, baseline: dict | None, runs: list[dict], step: dict | None) -> list[str]:
    lines = [
        f"\nbatch {size}" + (f"  (baseline {fmt(baseline.get('tokens_per_second'), '.1f')} tok/s)" if baseline else ""),
        f"{'k':>6} {'speedup (95% CI)':>19} {'tok/s':>7} {'tok/rnd':>7} {'c':>5} {'verify':>6} {'TTFT p50':>8} "
        f"{'ITL p50':>7} {'ITL p95':>7} {'lat p95':>7}  (ms)",
    ]
    for r in ([baseline] if baseline else []) + runs:
        is_base = r is baseline
        ci = r.get("speedup_ci")
        speed = (
            "1 (baseline)"
            if is_base
            else f"{r['speedup']:.2f} ({ci[0]:.2f}-{ci[1]:.2f})"
            if r.get("speedup") is not None and ci
            else fmt(r.get("speedup"), ".2f")
        )
        mark = "" if is_base or not step or step.get("run_id") != r["run_id"] else " <- serve"
        lines.append(
            f"{'target' if is_base else r['k']:>6} {speed:>19} {fmt(r.get('tokens_per_second'), '.1f'):>7} "
            f"{'1.00' if is_base else fmt(r.get('tokens_per_round'), '.2f'):>7} "
            f"{'-' if is_base else fmt(r.get('c'), '.2f'):>5} "
            f"{'-' if is_base else fmt(r.get('verify_cost'), '.2f'):>6} "
            f"{ms(r.get('ttft_seconds_p50')):>8} {ms(r.get('itl_seconds_p50')):>7} {ms(r.get('itl_seconds_p95')):>7} "
            f"{ms(r.get('request_latency_seconds_p95')):>7}"
            + mark
            + (f"  ({r['status']}: {r.get('error')})" if r.get("status") != "done" else "")
        )
    if step:
        lines.append(step["text"])
    return lines


def report(doc: dict) -> list[str]:
    baselines = {b.get("batch_size"): b for b in (doc.get("baselines") or [doc["baseline"]]) if b}
    grid = doc.get("schedule") or {}
    steps = {s["batch_size"]: s for s in grid.get("steps", [])}
    sizes = sorted({r.get("batch_size") for r in doc["runs"]} | set(baselines))
    lines = []
    for size in sizes:
        runs = sorted((r for r in doc["runs"] if r.get("batch_size") == size), key=lambda r: r["k"])
        lines += table(size, baselines.get(size), runs, steps.get(size))
    lines.append("")
    lines.append(grid.get("text") or "no schedule in the document (not a grid?)")
    ranges = grid.get("num_speculative_tokens_per_batch_size")
    lines.append("vLLM num_speculative_tokens_per_batch_size: " + (json.dumps(ranges) if ranges else "none"))
    warnings = [
        f"batch {r.get('batch_size')} k={r['k']}: {r['timing_warning']}" for r in doc["runs"] if r.get("timing_warning")
    ]
    lines += [f"timing warning: {w}" for w in warnings] or ["timing warnings: none"]
    mismatched = [
        f"batch {r.get('batch_size')} k={r['k']}" for r in doc["runs"] if r.get("outputs_match_baseline") is False
    ]
    lines.append(
        "outputs equal to the baseline's: " + ("every run" if not mismatched else "not in " + ", ".join(mismatched))
    )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo-target")
    ap.add_argument("--draft", default="demo-draft")
    ap.add_argument("--prompts", default="code:tune+code:validation")
    ap.add_argument(
        "--num-prompts",
        type=int,
        default=32,
        help="use the first N prompts of --prompts (0: the whole spec, passed to the CLI as it is)",
    )
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--k", default="1,2,3,4,5,6")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--db", default="", help="SQLAlchemy URL to keep (default: a temporary SQLite file)")
    ap.add_argument("--json", default="", help="also write the run's JSON document to this file")
    ap.add_argument("--from-json", default="", help="print the tables of a document saved by --json; run nothing")
    args = ap.parse_args(argv)
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        print(f"experiment {doc['experiment_id']}, {doc.get('repeats')} repeats (from {args.from_json})")
        print("\n".join(report(doc)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prompts = str(prompt_file(args.prompts, args.num_prompts, folder)) if args.num_prompts else args.prompts
        db = args.db or f"sqlite:///{folder / 'schedule.db'}"
        cmd = command(args, prompts, db)
        shown = " ".join(["draftlab", *cmd[3:]]).replace(
            prompts, args.prompts + (f" (first {args.num_prompts})" if args.num_prompts else "")
        )
        print(f"command: {shown}")
        print(f"machine: {os.cpu_count()} cores, shared with other jobs: load average (1/5/15 min) before {load()}")
        sys.stdout.flush()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)  # progress: our stderr
        wall = time.perf_counter() - start
        after = load()
        if not out.stdout.strip():
            sys.exit(f"error: the run printed no JSON (exit {out.returncode}); see its error line above")
        doc = json.loads(out.stdout)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(
        f"experiment {doc['experiment_id']}, {doc.get('repeats')} repeats, greedy, {args.max_new_tokens} new tokens"
        + (f", database kept: {args.db}" if args.db else "")
    )
    print("\n".join(report(doc)))
    print(
        f"\nwall time of the whole command: {wall:.0f} s ({wall / 60:.1f} min); load average after {after} "
        f"(the machine is shared: absolute tok/s and ms move with its load, the interleaved ratios less)"
    )
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
