"""How well a server cost profile predicts another draft's speedup in vLLM (issue 37, item 5): profile one draft,
predict another of the same shape from its lab acceptance alone, then confirm every cell in the server.

    python benchmarks/bench_server_prediction.py [--ks 1,2,3,4] [--concurrency 1,4,16] [--repeats 3]
        [--prompts code:validation] [--max-new-tokens 32] [--vllm "COMMAND"] [--out results.json]

Steps, on a fresh SQLite database:
1. the lab: `draftlab run` of demo-target with demo-draft at k = max(--ks) and with demo-draft-distilled at every k
   of --ks (batch 1; the lab's own speedups, and the acceptance by position the predictions start from);
2. `draftlab profile` of demo-draft: the server's step cost at each k and concurrency (one target-only server and one
   per k, interleaved passes);
3. demo-draft-distilled's k = max run predicted from that profile alone (it fits: same target, same draft shape);
4. demo-draft-distilled confirmed twice in vLLM at every k and concurrency (`draftlab profile` of it: the same
   interleaved A B A B passes as `draftlab confirm`, each cell's paired speedup with its interval). The first is
   the confirmed figure; the second, against the first, is the server's own spread, which no prediction can beat.

Prints per cell: predicted (95 %), confirmed (95 %), the second confirm, the lab's own speedup at batch 1; the
relative error |predicted / confirmed − 1| (median and worst), at each concurrency whether the predicted best k is the
confirmed best or tied with it within the confirm's interval, the same for the lab's figures, the server's spread,
and the server starts each path took. Needs vLLM (scripts/install_vllm.sh, or --vllm / $DRAFTLAB_VLLM).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
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


def _ci(ci) -> str:
    return f"({ci[0]:.2f}–{ci[1]:.2f})" if ci else "(—)"


def _measured(store, confirm_id: int) -> dict[tuple[int, int], tuple[float | None, list[float] | None]]:
    """{(k, concurrency): (speedup, interval)} of a stored confirm's speculative cells."""
    from sqlalchemy import text

    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT k, concurrency, speedup, speedup_ci_lo, speedup_ci_hi FROM server_measurements "
                "WHERE confirm_id = :c AND k > 0"
            ),
            {"c": confirm_id},
        ).all()
    return {
        (int(r.k), int(r.concurrency)): (r.speedup, [r.speedup_ci_lo, r.speedup_ci_hi] if r.speedup_ci_lo else None)
        for r in rows
    }


def _best_right(
    predicted: dict[int, float], confirmed: dict[int, tuple[float | None, list[float] | None]]
) -> tuple[int, int, str]:
    """(the k `predicted` ranks first, the confirmed best k, "right" / "tied" / "wrong"): tied when the chosen k's
    confirmed speedup lies inside the confirmed best's interval."""
    chosen = max(predicted, key=lambda k: predicted[k])
    best = max((k for k in confirmed if confirmed[k][0] is not None), key=lambda k: confirmed[k][0] or 0.0)
    if chosen == best:
        return chosen, best, "right"
    ci = confirmed[best][1]
    value = confirmed.get(chosen, (None, None))[0]
    return chosen, best, "tied" if ci and value is not None and ci[0] <= value <= ci[1] else "wrong"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ks", default="1,2,3,4")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--repeats", default="3", help="passes per server and concurrency")
    parser.add_argument("--lab-repeats", default="3")
    parser.add_argument("--max-new-tokens", default="32")
    parser.add_argument("--prompts", default="code:validation")
    parser.add_argument("--vllm", default=None)
    parser.add_argument("--out", default=None, help="also write every figure as JSON here")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    concurrency = [int(c) for c in args.concurrency.split(",")]
    vllm = ["--vllm", args.vllm] if args.vllm else []
    seconds: dict[str, float] = {}
    load = {"before": os.getloadavg()[0]}

    from storage import open_store
    from storage.serving.profiles import run_prediction

    with tempfile.TemporaryDirectory(prefix="bench-server-prediction-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'bench.db'}"
        common = ["--prompts", args.prompts, "--max-new-tokens", args.max_new_tokens, "--device", "cpu", "--db", db]
        labs = {}
        for draft, k_arg in (("demo-draft", str(max(ks))), ("demo-draft-distilled", args.ks)):
            started = time.monotonic()
            status, doc = _cli(
                ["run", "--target", "demo-target", "--draft", draft, "--k", k_arg, "--repeats", args.lab_repeats]
                + common
                + ["--json"]
            )
            seconds[f"lab {draft}"] = time.monotonic() - started
            if status != 0 or doc is None:
                print(f"error: the lab run of {draft} exited with status {status}", file=sys.stderr)
                return 1
            labs[draft] = doc
        load["after_lab"] = os.getloadavg()[0]

        def profile(draft: str) -> dict:
            doc = labs[draft]
            run = max(doc["runs"], key=lambda r: r["k"])
            started = time.monotonic()
            status, out = _cli(
                ["profile", str(doc["experiment_id"]), "--run", str(run["run_id"]), "--ks", args.ks]
                + ["--concurrency", args.concurrency, "--repeats", args.repeats, "--db", db, "--json", *vllm]
            )
            seconds.setdefault(f"profile {draft}", 0.0)
            seconds[f"profile {draft}"] += time.monotonic() - started
            if status != 0 or out is None:
                raise SystemExit(f"error: `draftlab profile` of {draft} exited with status {status}")
            return out

        source = profile("demo-draft")
        load["after_profile"] = os.getloadavg()[0]
        target = labs["demo-draft-distilled"]
        target_run = max(target["runs"], key=lambda r: r["k"])
        store = open_store(db)
        try:
            predicted = run_prediction(store, target["experiment_id"], target_run["run_id"], source["profile_id"])
        finally:
            store.dispose()
        first, second = profile("demo-draft-distilled"), profile("demo-draft-distilled")
        load["after_confirms"] = os.getloadavg()[0]
        store = open_store(db)
        try:
            confirmed, again = _measured(store, first["profile_id"]), _measured(store, second["profile_id"])
        finally:
            store.dispose()

    lab_speedup = {r["k"]: (r["speedup"], r.get("speedup_ci")) for r in target["runs"]}
    errors, spreads, lab_errors = [], [], []
    rows = []
    for c in concurrency:
        for k in ks:
            cell = predicted["concurrency"].get(str(c), {}).get(str(k))
            measured, ci = confirmed.get((k, c), (None, None))
            repeat = again.get((k, c), (None, None))[0]
            error = cell["speedup"] / measured - 1 if cell and measured else None
            spread = repeat / measured - 1 if repeat and measured else None
            lab_error = lab_speedup[k][0] / measured - 1 if lab_speedup.get(k, (None,))[0] and measured else None
            errors += [abs(error)] if error is not None else []
            spreads += [abs(spread)] if spread is not None else []
            lab_errors += [abs(lab_error)] if lab_error is not None else []
            rows.append((c, k, cell, measured, ci, repeat, error, spread, lab_error))

    print(
        f"{predicted['profile']['label']} (demo-draft's), predicting demo-draft-distilled\n"
        f"seconds: {json.dumps({k: round(v) for k, v in seconds.items()})}; load average (1 min): "
        f"{json.dumps({k: round(v, 1) for k, v in load.items()})}"
    )
    print(
        "\n| concurrency | k | predicted (95 %) | confirmed (95 %) | error | confirmed again | spread "
        "| lab, batch 1 | lab error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for c, k, cell, measured, ci, repeat, error, spread, lab_error in rows:

        def pct(v):
            return "—" if v is None else f"{v:+.0%}"

        def x(v):
            return "—" if v is None else f"{v:.2f}×"

        print(
            f"| {c} | {k} | {x(cell and cell['speedup'])} {_ci(cell and cell['speedup_ci'])} | {x(measured)} "
            f"{_ci(ci)} | {pct(error)} | {x(repeat)} | {pct(spread)} | {x(lab_speedup.get(k, (None,))[0])} "
            f"| {pct(lab_error)} |"
        )

    def summary(values):
        return f"median {statistics.median(values):.1%}, worst {max(values):.1%}" if values else "—"

    print(f"\nprediction error |predicted / confirmed − 1|: {summary(errors)} over {len(errors)} cells")
    print(f"the lab's own speedup (batch 1) against the same cells: {summary(lab_errors)}")
    print(f"the server's own spread |confirm 2 / confirm 1 − 1|: {summary(spreads)}")
    best = {}
    for c in concurrency:
        by_k = {k: confirmed[(k, c)] for k in ks if (k, c) in confirmed}
        cells = predicted["concurrency"].get(str(c), {})
        if not by_k or not cells:
            continue
        best[c] = {
            "predicted": _best_right({int(k): v["speedup"] for k, v in cells.items()}, by_k),
            "lab": _best_right({k: v[0] for k, v in lab_speedup.items() if v[0] is not None}, by_k),
            "schedule": predicted["schedule"].get(str(c)),
        }
        p, lab = best[c]["predicted"], best[c]["lab"]
        print(
            f"concurrency {c}: predicted best k={p[0]}, confirmed best k={p[1]}: {p[2]}; the lab's best k={lab[0]}: "
            f"{lab[2]}; the predicted schedule serves k={best[c]['schedule']}"
        )
    starts_profile = 1 + len(ks)
    print(
        f"server starts: profile-then-predict {starts_profile} (one profile; every further draft of this shape, "
        f"prompt set or k ≤ {max(ks)} is predicted with none); confirming every cell {starts_profile} per draft "
        f"with each configuration served once, {1 + len(ks) * len(concurrency)} per draft for `confirm --configs "
        f"all` over a lab grid of k {args.ks} × batch {args.concurrency} (one server per lab run)"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "labs": labs,
                    "profile": source,
                    "predicted": predicted,
                    "confirmed": {f"{k},{c}": v for (k, c), v in confirmed.items()},
                    "confirmed_again": {f"{k},{c}": v for (k, c), v in again.items()},
                    "best": {str(c): v for c, v in best.items()},
                    "errors": errors,
                    "spreads": spreads,
                    "lab_errors": lab_errors,
                    "seconds": seconds,
                    "load": load,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
