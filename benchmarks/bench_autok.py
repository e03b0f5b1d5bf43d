"""How well does `--k auto` predict? Runs `draftlab run --k auto:K` end to end on the demo pair (fresh database
each invocation), optionally while `--load N` CPU-burning processes compete for the machine, then prints, for
every confirmed k, the measured speedup and the predictions of

  - new:    the shipped predictor (app/autok.py): modelled from the k=K run's own batch-round costs, its
            per-prompt acceptance and the verify profile's shape, anchored on the speedup k=K measured against
            its interleaved baseline;
  - scaled: the same model, not anchored: the interleaved baseline's seconds over the modelled seconds at k;
  - old:    the predictor before (profile in absolute seconds, baseline seconds per token, the k=K run's
            per-round overhead),

all computed in this process from the same stored measurements, so the comparison is A/B on identical data;
then the worst |error| of each.

    python benchmarks/bench_autok.py                              # quiet, batch 1, K=6, 1 invocation
    python benchmarks/bench_autok.py --load 2 --invocations 2     # under load
    python benchmarks/bench_autok.py --batch-size 4               # at batch size 4 (or a list: 1,4,16)
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the imports below (noqa: E402) come from the repository root

from app.autok import cost_model, predict_curve  # noqa: E402
from engine.metrics.theory import modelled_seconds  # noqa: E402
from storage import open_store  # noqa: E402
from storage.analysis import catalog  # noqa: E402
from storage.jobs.experiments import load_verify_profile  # noqa: E402
from storage.records import queries as q  # noqa: E402

BURN = "while True: pass"


def old_curve(store, probe, baseline, profile: dict[int, float]) -> dict[int, float]:
    """The predictor `--k auto` shipped before (kept here to compare against)."""
    from engine.metrics.theory import predicted_curve

    k_max = int(probe["k"])
    costs = q.round_costs(store, int(probe["run_id"]))
    per_position = [
        0.0 if v is None or math.isnan(v) else float(v)
        for v in q.acceptance_by_position(store, int(probe["run_id"]))["conditional"]
    ]
    overhead = (costs["wall_seconds"] - costs["draft_seconds"]) / costs["rounds"] - profile[k_max + 1]
    return predicted_curve(
        per_position,
        float(probe["draft_step_seconds"]),
        overhead,
        profile,
        float(baseline["wall_seconds"]) / float(baseline["new_tokens"]),
    )


def scaled_curve(store, probe, baseline, profile: dict[int, float]) -> dict[int, float]:
    model = cost_model(store, probe)
    assert model is not None, "the probe run has rounds"
    seconds = modelled_seconds(k_max=int(probe["k"]), verify_shape=profile, **model)
    return {k: float(baseline["wall_seconds"]) / t for k, t in seconds.items()}


def profiles(store, experiment_id: int) -> dict[int, dict[int, float]]:
    """{batch size: profile}: the per-batch-size profiles where stored (storage.jobs.experiments.load_verify_profiles),
    else the batch-1 profile."""
    try:
        from storage.jobs.experiments import load_verify_profiles

        found = load_verify_profiles(store, experiment_id)
        if found:
            return found
    except ImportError:
        pass
    return {1: load_verify_profile(store, experiment_id)}


def evaluate(db: Path) -> list[dict]:
    store = open_store(f"sqlite:///{db}")
    eid = int(catalog.experiments(store)["experiment_id"].iloc[0])
    runs = q.runs(store, eid)
    experiment = q.experiment(store, eid)
    assert experiment is not None
    k_max = int(experiment["k_auto"])
    by_batch = profiles(store, eid)
    rows = []
    spec = runs[runs["kind"] == "speculative"]
    for size in sorted({int(b or 1) for b in spec["batch_size"]}):
        at = spec[spec["batch_size"].fillna(1).astype(int) == size]
        probe = at[at["k"] == k_max].iloc[0]
        baseline = runs[runs["run_id"] == probe["baseline_run_id"]].iloc[0]
        profile = by_batch.get(size) or by_batch.get(1)
        assert profile is not None, "the experiment stored a verify profile"
        curves: dict[str, Any] = {
            "new": predict_curve(store, probe, profile),
            "scaled": scaled_curve(store, probe, baseline, profile),
        }
        if size == 1 or len(by_batch) == 1:
            curves["old"] = old_curve(store, probe, baseline, profile)
        print(f"  batch {size}: k={k_max} measured {probe['speedup']:.3f} (the anchor)")
        checks = at[at["baseline_run_id"] != probe["baseline_run_id"]].sort_values("k")
        for _, r in checks.iterrows():
            k, measured = int(r["k"]), float(r["speedup"])
            errors = {name: c[k] / measured - 1 for name, c in curves.items() if c and k in c}
            rows.append({"batch": size, "k": k, "measured": measured, **errors})
            print(
                f"    k={k}: measured {measured:.3f} ({r['speedup_ci_lo']:.2f}-{r['speedup_ci_hi']:.2f})  "
                + "  ".join(f"{name} {curves[name][k]:.3f} ({100 * e:+.1f} %)" for name, e in errors.items())
            )
        if len(checks):  # how the machine moved between the pass at k=K and the confirming pass
            fresh = runs[runs["run_id"] == checks["baseline_run_id"].iloc[0]].iloc[0]
            print(
                "    between the passes: target step "
                f"x{fresh['target_step_seconds'] / baseline['target_step_seconds']:.2f}"
                f", draft step x{checks['draft_step_seconds'].mean() / probe['draft_step_seconds']:.2f}"
            )
        if len(checks) > 1 and curves["new"]:  # does the prediction rank the confirmed k values as measured?
            ks = [int(k) for k in checks["k"]]
            print(
                f"    best confirmed k: predicted {max(ks, key=lambda k: curves['new'][k])}, measured "
                f"{int(checks.loc[checks['speedup'].idxmax(), 'k'])}"
            )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--invocations", type=int, default=1)
    ap.add_argument("--k-max", type=int, default=6)
    ap.add_argument("--batch-size", default="1", help="a batch size or a list (1,4,16)")
    ap.add_argument("--prompts", default="code:tune")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=int, default=0, help="CPU-burning processes running meanwhile")
    ap.add_argument("--keep", default=None, help="keep each invocation's database in this folder")
    args = ap.parse_args(argv)
    command = [
        sys.executable,
        "-c",
        "import sys; from app.cli import main; sys.exit(main())",
        "run",
        "--target",
        "demo-target",
        "--draft",
        "demo-draft",
        "--prompts",
        args.prompts,
        "--k",
        f"auto:{args.k_max}",
        "--temperature",
        "0",
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--repeats",
        str(args.repeats),
        "--json",
    ]
    if args.batch_size != "1":
        command += ["--batch-size", args.batch_size]
    print("command: draftlab " + " ".join(command[3:]) + (f"  (with {args.load} CPU burners)" if args.load else ""))
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.load)]
    rows, started = [], time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(args.invocations):
                db = Path(args.keep or tmp) / f"auto{n}.db"
                if args.keep:
                    db.parent.mkdir(parents=True, exist_ok=True)
                    db.unlink(missing_ok=True)
                t0 = time.perf_counter()
                out = subprocess.run(
                    [*command, "--db", f"sqlite:///{db}"], capture_output=True, text=True, env=env, cwd=ROOT
                )
                if out.returncode != 0:
                    sys.exit(f"command failed ({out.returncode}): {out.stderr.strip().splitlines()[-3:]}")
                print(f"invocation {n + 1}: {time.perf_counter() - t0:.0f} s")
                rows += evaluate(db)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    for name in ("new", "scaled", "old"):
        errors = [abs(r[name]) for r in rows if name in r]
        if errors:
            print(
                f"{name:>6}: worst |error| {100 * max(errors):.1f} %, mean |error| "
                f"{100 * sum(errors) / len(errors):.1f} % over {len(errors)} confirmed runs"
            )
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
