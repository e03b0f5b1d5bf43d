"""demo-draft against demo-draft-distilled, through the real CLI and database (timing protocol v2).

    python benchmarks/bench_distilled.py                       # code:validation + english:validation, T 0 and 0.8
    python benchmarks/bench_distilled.py --sets code:validation --temperatures 0 --k 1,2,4 --repeats 3

For every (prompt set, temperature, k) one experiment `draftlab run --draft demo-draft,demo-draft-distilled --k K`:
a target-only baseline and both drafts, interleaved prompt by prompt in a rotating order, `--repeats` timed decodes
each (medians). Per draft it prints alpha, KL(p_t || p_d), tokens/round and the speedup over the baseline with its
95 % paired bootstrap interval (storage, as the dashboard shows them), then each draft's best k. The head-to-head
column is distilled / plain throughput paired prompt by prompt in the same experiment (same k, same moments), with
its own bootstrap interval: the comparison least exposed to machine drift.
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
sys.path.insert(0, str(ROOT))  # the imports below (noqa: E402) come from the repository root

from sqlalchemy import text  # noqa: E402

from engine.metrics.stats import paired_bootstrap_ci, paired_speedup  # noqa: E402
from storage import open_store  # noqa: E402
from storage.records import queries  # noqa: E402

DRAFTS = ("demo-draft", "demo-draft-distilled")


def run_experiment(db: str, prompts: str, temperature: float, k: int, repeats: int, max_new_tokens: int) -> int:
    cmd = [
        sys.executable,
        "-m",
        "app.cli",
        "run",
        "--target",
        "demo-target",
        "--draft",
        ",".join(DRAFTS),
        "--k",
        str(k),
        "--prompts",
        prompts,
        "--temperature",
        f"{temperature:g}",
        "--repeats",
        str(repeats),
        "--max-new-tokens",
        str(max_new_tokens),
        "--db",
        db,
        "--json",
        "--device",
        "cpu",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return int(json.loads(out.stdout)["experiment_id"])


def prompt_times(store, run_id: int) -> dict[int, tuple[int, float]]:
    with store.read() as conn:
        return {
            int(i): (int(n), float(s))
            for i, n, s in conn.execute(
                text("SELECT prompt_index, new_tokens, wall_seconds FROM prompt_results WHERE run_id = :r"),
                {"r": run_id},
            )
        }


def head_to_head(store, plain_run: int, distilled_run: int) -> tuple[float | None, tuple | None]:
    a, b = prompt_times(store, plain_run), prompt_times(store, distilled_run)
    common = sorted(set(a) & set(b))
    cols = ([a[i][0] for i in common], [a[i][1] for i in common], [b[i][0] for i in common], [b[i][1] for i in common])
    return paired_speedup(*cols), paired_bootstrap_ci(*cols)


def fmt_ci(value, lo, hi) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.2f} ({lo:.2f}-{hi:.2f})" if lo == lo and lo is not None else f"{value:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="code:validation,english:validation")
    ap.add_argument("--temperatures", default="0,0.8")
    ap.add_argument("--k", default="1,2,3,4,6")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--db", default="", help="keep the experiments in this database (default: a temporary one)")
    args = ap.parse_args(argv)
    db = args.db or f"sqlite:///{tempfile.mkdtemp(prefix='bench-distilled-')}/bench.db"
    ks = [int(k) for k in args.k.split(",")]
    print(
        f"demo-target: {' vs '.join(DRAFTS)}; k {args.k}, {args.repeats} repeats, {args.max_new_tokens} new tokens, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}; db {db}",
        flush=True,
    )
    store = None
    summary = []
    for prompts in args.sets.split(","):
        for temperature in (float(t) for t in args.temperatures.split(",")):
            rows = []
            for k in ks:
                t0 = time.perf_counter()
                eid = run_experiment(db, prompts, temperature, k, args.repeats, args.max_new_tokens)
                store = store or open_store(db)
                df = queries.runs(store, eid)
                spec = df[df["kind"] == "speculative"].reset_index(drop=True)  # sweep order: DRAFTS
                ratio, ci = head_to_head(store, int(spec.loc[0, "run_id"]), int(spec.loc[1, "run_id"]))
                for i, name in enumerate(DRAFTS):
                    r = spec.loc[i]
                    rows.append(
                        {
                            "draft": name,
                            "k": k,
                            "alpha": r["alpha"],
                            "kl": r["kl"],
                            "tokens_per_round": r["tokens_per_round"],
                            "speedup": r["speedup"],
                            "lo": r["speedup_ci_lo"],
                            "hi": r["speedup_ci_hi"],
                            "match": r["outputs_match_baseline"],
                            "warning": r["timing_warning"],
                        }
                    )
                rows[-1]["vs_plain"] = (ratio, ci)
                print(
                    f"  {prompts} T={temperature:g} k={k}: experiment {eid} in {time.perf_counter() - t0:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            print(f"\n{prompts}, temperature {temperature:g}")
            print(
                f"{'draft':<22} {'k':>2} {'alpha':>6} {'KL':>6} {'tok/rd':>6} {'speedup (95% CI)':>18}  "
                f"{'distilled/plain (95% CI)':>24}  match"
            )
            for r in rows:
                vs = r.get("vs_plain")
                vs_text = fmt_ci(vs[0], *(vs[1] or (None, None))) if vs else ""
                print(
                    f"{r['draft']:<22} {r['k']:>2} {r['alpha']:>6.3f} {r['kl']:>6.3f} {r['tokens_per_round']:>6.2f} "
                    f"{fmt_ci(r['speedup'], r['lo'], r['hi']):>18}  {vs_text:>24}  {r['match']}"
                    + (f"  WARNING {r['warning']}" if r["warning"] else "")
                )
            for name in DRAFTS:
                mine = [r for r in rows if r["draft"] == name and r["speedup"] == r["speedup"] and not r["warning"]]
                best = max(mine, key=lambda r: r["speedup"])
                summary.append((prompts, temperature, name, best))
                print(
                    f"best k for {name}: k={best['k']} at {fmt_ci(best['speedup'], best['lo'], best['hi'])}, "
                    f"alpha {best['alpha']:.3f}, KL {best['kl']:.3f}, tokens/round {best['tokens_per_round']:.2f}"
                )
            sys.stdout.flush()
    print("\nsummary (best k per draft; separated: the distilled draft's interval lies wholly above the plain one's)")
    print(
        f"{'prompts':<20} {'T':>3} {'draft':<22} {'k':>2} {'alpha':>6} {'KL':>6} {'tok/rd':>6} {'speedup (95% CI)':>18}"
    )
    for prompts, temperature, name, b in summary:
        print(
            f"{prompts:<20} {temperature:>3g} {name:<22} {b['k']:>2} {b['alpha']:>6.3f} {b['kl']:>6.3f} "
            f"{b['tokens_per_round']:>6.2f} {fmt_ci(b['speedup'], b['lo'], b['hi']):>18}",
            end="",
        )
        if name == DRAFTS[1]:
            plain = next(p for q, t, n, p in summary if (q, t, n) == (prompts, temperature, DRAFTS[0]))
            print(f"  {'separated' if b['lo'] > plain['hi'] else 'overlapping'}", end="")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
