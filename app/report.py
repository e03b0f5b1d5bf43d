"""The human-readable table of a `draftlab run` document (storage/serving/export.run_document: the CLI contract,
docs/cli.md, docs/metrics.md)."""

from __future__ import annotations

import json

from engine.config.variables import value_labels
from engine.wording import noun, plural
from storage.records.columns import COLUMNS, show

SAME = COLUMNS["outputs_match_baseline"]  # the table's last column, explained under it


def _swept_label(run: dict) -> str:
    """A run's swept value as the listing shows it (`suffix:24`, `0.7`, `demo-draft`)."""
    value = run.get("sweep_value")
    return str(run.get(run.get("sweep_variable") or "", value) if value is None else value)


def format_table(doc: dict) -> str:
    """A fixed-width summary: the baseline, one line per speculative run with its speedup interval, the
    verdict, and any timing warning."""
    b = doc["baseline"]
    # A sweep of anything but k leads each line with the run's swept value by its label (drafter=suffix:24).
    swept = {r.get("sweep_variable") for r in doc["runs"]} - {None, "k"}
    labels = (
        value_labels(
            next(iter(swept), ""), [_swept_label(r) for r in doc["runs"]], [r.get("drafter") for r in doc["runs"]]
        )
        if swept
        else []
    )
    width = max(map(len, labels), default=0)
    label_header = f"{'/'.join(sorted(swept)):<{width}} " if swept else ""
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
    lines = [
        f"experiment {doc['experiment_id']}" if doc.get("experiment_id") is not None else "experiment (not stored)",
        f"baseline  {b['new_tokens']:>6} tokens  {fmt(b['tokens_per_second'], '8.1f')} tok/s  "
        f"target step {1000 * (b['target_step_seconds'] or 0):.2f} ms"
        + (f"  ({plural(doc['repeats'], 'repeat')}, {noun(doc['repeats'], 'median')})" if doc.get("repeats") else ""),
        f"{label_header}{'k':>3} {'tok/s':>8} {'speedup (95% CI)':>19} {'refined':>7} {'formula':>7} {'alpha':>6} "
        f"{'tok/rnd':>7} {'c':>6} {'verify':>6} {SAME.header}",
    ]
    # Runs decoded in batches (B > 1, as in a batch-size sweep) name their batch size and serving figures (every run
    # has serving figures, batch-1 runs too: the table adds them only where batch sizes are in play).
    batched = any((r.get("batch_size") or 1) > 1 for r in doc["runs"])
    for r, label in zip(doc["runs"], labels or [None] * len(doc["runs"])):
        ci = r.get("speedup_ci")
        speed = (
            f"{r['speedup']:.2f} ({ci[0]:.2f}-{ci[1]:.2f})"
            if r.get("speedup") is not None and ci
            else fmt(r.get("speedup"), ".2f")
        )
        lead = f"{label:<{width}} " if swept else ""
        lines.append(
            f"{lead}{r['k']:>3} {fmt(r['tokens_per_second'], '8.1f')} {speed:>19} "
            f"{fmt(r.get('predicted_speedup_refined'), '7.2f')} {fmt(r['predicted_speedup'], '7.2f')} "
            f"{fmt(r['alpha'], '6.3f')} {fmt(r['tokens_per_round'], '7.2f')} {fmt(r['c'], '6.2f')} "
            f"{fmt(r.get('verify_cost'), '6.2f')} {show('outputs_match_baseline', r['outputs_match_baseline'])}"
            + (
                f"  predicted {r['predicted']:.2f} ({100 * r['prediction_error']:+.0f} %)"
                if r.get("prediction_error") is not None
                else ""
            )
            + (
                f"  batch {r['batch_size']}: TTFT p50 {fmt(r.get('ttft_seconds_p50'), '.3f')} s, ITL p95 "
                f"{fmt(r.get('itl_seconds_p95'), '.3f')} s, latency p95 "
                f"{fmt(r.get('request_latency_seconds_p95'), '.3f')} s"
                if batched
                else ""
            )
        )
    if doc["runs"]:
        lines.append(f"{SAME.header}: {SAME.help}")
    for r in doc["runs"]:
        if r.get("timing_warning"):
            lines.append(f"warning: k={r['k']}: {r['timing_warning']}")
    if doc.get("predicted_curves"):  # `--k auto` at batch sizes: one predicted curve each
        for size, entry in doc["predicted_curves"].items():
            curve = "  ".join(f"k={k}: {v:.2f}" for k, v in entry["curve"].items())
            lines.append(f"predicted curve at batch {size} (before measuring k = {entry['confirmed']}): {curve}")
    elif doc.get("predicted_curve"):
        curve = "  ".join(f"k={k}: {v:.2f}" for k, v in doc["predicted_curve"].items())
        lines.append(f"predicted curve (before measuring k = {doc.get('confirmed')}): {curve}")
    grid = doc.get("schedule")
    if grid:  # a grid: each batch size's baseline, verdict and the schedule to serve
        for b in doc.get("baselines") or []:
            lines.append(f"baseline at batch {b.get('batch_size')}: {fmt(b['tokens_per_second'], '.1f')} tok/s")
        lines += [step["text"] for step in grid["steps"]]
        lines.append(grid["text"])
        ranges = grid.get("num_speculative_tokens_per_batch_size") or []
        if len(ranges) > 1:
            lines.append("vLLM num_speculative_tokens_per_batch_size: " + json.dumps(ranges))
        elif ranges:
            lines.append(
                f"vLLM: num_speculative_tokens={ranges[0][2]} at every batch size (one k: no schedule)"
                if ranges[0][2]
                else "vLLM: no speculation at any batch size"
            )
    elif doc.get("verdict"):
        lines.append(doc["verdict"]["text"])
    return "\n".join(lines)
