"""Is the measured speedup stable enough to choose by? Runs the same `draftlab run ... --json` several times
(fresh database each) and reports, per invocation, every k's speedup with its 95 % interval, the refined
prediction and its error, timing warnings and the wall time of the command; then the spread of the best
speedup across invocations (issue "Speedup you can trust": goal within 10 % of the median).

    python benchmarks/bench_protocol.py                          # 3 invocations, the issue's command
    python benchmarks/bench_protocol.py --invocations 3 --repeats 1 --extra "--k auto"

Each invocation is a separate process, as a user would run it; the machine's load is whatever it is, so
quote the spread, not one number.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = (
    "draftlab run --target demo-target --draft demo-draft --prompts code:validation --k 1,2,4 "
    "--temperature 0 --max-new-tokens 48 --json"
)


def invoke(command: str, db: Path) -> tuple[dict, float]:
    start = time.perf_counter()
    out = subprocess.run([*shlex.split(command), "--db", f"sqlite:///{db}"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"command failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout), wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--invocations", type=int, default=3)
    ap.add_argument("--command", default=COMMAND)
    ap.add_argument("--repeats", type=int, default=None, help="pass --repeats R (default: the CLI's default)")
    ap.add_argument("--extra", default="", help="more arguments for the command")
    args = ap.parse_args(argv)
    command = (
        args.command + (f" --repeats {args.repeats}" if args.repeats else "") + (f" {args.extra}" if args.extra else "")
    )
    print(f"command: {command}")
    bests, errors, warnings, walls = [], [], 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.invocations):
            doc, wall = invoke(command, Path(tmp) / f"run{n}.db")
            walls.append(wall)
            print(f"invocation {n + 1}: {wall:.1f} s, baseline {doc['baseline']['tokens_per_second']:.1f} tok/s")
            for r in doc["runs"]:
                ci = r.get("speedup_ci") or [float("nan")] * 2
                refined = r.get("predicted_speedup_refined")
                error = refined / r["speedup"] - 1 if refined and r.get("speedup") else None
                errors += [error] if error is not None else []
                warnings += bool(r.get("timing_warning"))
                print(
                    f"  k={r['k']}: speedup {r['speedup']:.3f} ({ci[0]:.3f}-{ci[1]:.3f})  tok/round "
                    f"{r['tokens_per_round']:.2f}  refined "
                    + ("-" if refined is None else f"{refined:.3f}")
                    + ("" if error is None else f" ({100 * error:+.1f} %)")
                    + "  formula "
                    f"{r['predicted_speedup']:.3f}  verify_cost {r['verify_cost']:.2f}  c {r['c']:.2f}  "
                    f"alpha {r['alpha']:.3f}" + ("  WARNING" if r.get("timing_warning") else "")
                )
                if r.get("prediction_error") is not None:
                    print(f"      --k auto: predicted {r['predicted']:.3f}, error {100 * r['prediction_error']:+.1f} %")
            if doc.get("predicted_curve"):
                print("  predicted curve: " + ", ".join(f"k={k} {v:.3f}" for k, v in doc["predicted_curve"].items()))
            print(f"  {doc['verdict']['text']}")
            bests.append(doc["verdict"]["speedup"] or float("nan"))
    median = statistics.median(bests)
    spread = max(abs(b / median - 1) for b in bests)
    print(
        f"best speedups: {', '.join(f'{b:.3f}' for b in bests)}; median {median:.3f}; "
        f"largest deviation from the median {100 * spread:.1f} %"
    )
    if errors:
        print(
            f"refined prediction error: max |error| {100 * max(abs(e) for e in errors):.1f} % over {len(errors)} runs"
        )
    print(
        f"timing warnings: {warnings}; wall time per invocation: median {statistics.median(walls):.1f} s "
        f"(min {min(walls):.1f}, max {max(walls):.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
