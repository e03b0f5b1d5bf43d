"""The demo pair measured in the lab and confirmed in vLLM: `draftlab run` at k 1–4 (greedy, code:validation), then
`draftlab confirm --configs all` (every lossless run's k served by vLLM beside the target alone) at concurrency 1
and 4. Prints the lab's speedup at batch 1 beside the server's at each concurrency, acceptance (overall and by
position) lab vs server, whether outputs are equal, the wall time of each step and the load average around them.

    python benchmarks/bench_confirm.py [--concurrency 1,4] [--repeats 2] [--lab-repeats 3] [--max-new-tokens 32]
                                       [--vllm "COMMAND"] [--out results.json]

Rerunnable: a fresh SQLite database in a temporary directory each time. Needs vLLM (scripts/install_vllm.sh, or
--vllm / $DRAFTLAB_VLLM); one server pair at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _cli(argv: list[str]) -> tuple[int, dict | None]:
    """`draftlab ARGV --json` in this process: (exit status, its JSON document)."""
    from app.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    text = out.getvalue().strip()
    return status, json.loads(text.splitlines()[-1]) if text else None


def _interval(ci) -> str:
    return f"({ci[0]:.2f}–{ci[1]:.2f})" if ci else "(no interval)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--repeats", default="2", help="passes per server and concurrency")
    parser.add_argument("--lab-repeats", default="3")
    parser.add_argument("--max-new-tokens", default="32")
    parser.add_argument("--prompts", default="code:validation")
    parser.add_argument("--vllm", default=None)
    parser.add_argument("--out", default=None, help="also write every figure as JSON here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-confirm-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'confirm.db'}"
        load = {"before": os.getloadavg()[0]}
        started = time.monotonic()
        status, lab = _cli(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft-distilled",
                "--prompts",
                args.prompts,
                "--k",
                "1,2,3,4",
                "--repeats",
                args.lab_repeats,
                "--max-new-tokens",
                args.max_new_tokens,
                "--device",
                "cpu",
                "--db",
                db,
                "--json",
            ]
        )
        lab_seconds = time.monotonic() - started
        load["after_lab"] = os.getloadavg()[0]
        if status != 0 or lab is None:
            print(f"error: the lab run exited with status {status}", file=sys.stderr)
            return 1
        confirm_args = [
            "confirm",
            str(lab["experiment_id"]),
            "--configs",
            "all",
            "--concurrency",
            args.concurrency,
            "--repeats",
            args.repeats,
            "--db",
            db,
            "--json",
        ]
        if args.vllm:
            confirm_args += ["--vllm", args.vllm]
        started = time.monotonic()
        status, confirm = _cli(confirm_args)
        confirm_seconds = time.monotonic() - started
        load["after_confirm"] = os.getloadavg()[0]
    if confirm is None:
        print(f"error: the confirm printed no JSON document (exit {status})", file=sys.stderr)
        return 1
    runs = {r["run_id"]: r for r in lab["runs"]}
    print(
        f"lab: {lab_seconds:.0f} s; confirm: {confirm_seconds:.0f} s (exit {status}); load average (1 min) "
        f"{load['before']:.1f} before, {load['after_lab']:.1f} after the lab, {load['after_confirm']:.1f} after "
        f"the confirm; vLLM {confirm['engine_version']}"
    )
    print(
        "\n| k | lab speedup, batch 1 (95 %) | "
        + " | ".join(
            f"vLLM speedup, concurrency {b['concurrency']} (95 %)" for b in confirm["baseline"]["per_concurrency"]
        )
        + " | outputs = vLLM target alone | outputs = lab |"
    )
    print("|---|---|" + "---|" * len(confirm["baseline"]["per_concurrency"]) + "---|---|")
    for config in confirm["configs"]:
        run = runs[config["lab_run_id"]]
        cells = [f"{m['speedup']:.2f}× {_interval(m['speedup_ci'])}" for m in config["per_concurrency"]]
        same_base = sorted({m["outputs_match_server_baseline"] for m in config["per_concurrency"]})
        same_lab = sorted({m["outputs_match_lab"] for m in config["per_concurrency"]})
        print(
            f"| {config['k']} | {run['speedup']:.2f}× {_interval(run.get('speedup_ci'))} | "
            + " | ".join(cells)
            + f" | {', '.join(f'{v:.2f}' for v in same_base if v is not None)} | "
            f"{', '.join(f'{v:.2f}' for v in same_lab if v is not None)} |"
        )
    print("\n| k | concurrency | acceptance lab / vLLM | by position, lab | by position, vLLM |")
    print("|---|---|---|---|---|")
    for config in confirm["configs"]:
        for m in config["per_concurrency"]:
            lab_pos = " ".join(f"{v:.2f}" for v in m["lab_per_position_acceptance"] or [])
            server_pos = " ".join(f"{v:.2f}" for v in m["server_per_position_acceptance"] or [])
            server_rate = m["server_draft_acceptance_rate"]
            print(
                f"| {config['k']} | {m['concurrency']} | {m['lab_draft_acceptance_rate']:.3f} / "
                f"{server_rate if server_rate is None else f'{server_rate:.3f}'} | {lab_pos} | {server_pos} |"
            )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "lab": lab,
                    "confirm": confirm,
                    "lab_seconds": lab_seconds,
                    "confirm_seconds": confirm_seconds,
                    "load": load,
                },
                indent=1,
            )
        )
    return 0 if status == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
