"""The `draftlab run --json` document (SPEC.md's CLI contract) and its human-readable table."""
from __future__ import annotations

from engine.metrics import outputs_match, speculative_metrics, target_step_seconds, throughput
from engine.records import PromptResult


def _outputs(results: list[PromptResult]) -> list[dict]:
    return [{"prompt_index": p.prompt_index, "token_ids": p.output_ids, "text": p.text} for p in results]


def baseline_entry(results: list[PromptResult], run_id: int | None = None) -> dict:
    return {"run_id": run_id, **throughput(results), "target_step_seconds": target_step_seconds(results),
            "outputs": _outputs(results)}


def speculative_entry(k: int, results: list[PromptResult], baseline: list[PromptResult], greedy: bool,
                      run_id: int | None = None) -> dict:
    metrics = speculative_metrics(results, baseline)
    return {"run_id": run_id, "k": k, **metrics,
            "outputs_match_baseline": outputs_match(results, baseline) if greedy else None,
            "outputs": _outputs(results)}


def format_table(doc: dict) -> str:
    """A fixed-width summary: one line for the baseline, one per speculative run."""
    b = doc["baseline"]
    lines = [f"experiment {doc['experiment_id']}" if doc.get("experiment_id") is not None else "experiment (not stored)",
             f"baseline  {b['new_tokens']:>6} tokens  {b['tokens_per_second']:8.1f} tok/s  "
             f"target step {1000 * (b['target_step_seconds'] or 0):.2f} ms",
             f"{'k':>3} {'tok/s':>8} {'speedup':>8} {'pred.':>6} {'alpha':>6} {'accept':>7} {'tok/rnd':>7} {'c':>6} match"]
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
    for r in doc["runs"]:
        lines.append(f"{r['k']:>3} {fmt(r['tokens_per_second'], '8.1f')} {fmt(r['speedup'], '8.2f')} "
                     f"{fmt(r['predicted_speedup'], '6.2f')} {fmt(r['alpha'], '6.3f')} "
                     f"{fmt(r['draft_acceptance_rate'], '7.3f')} {fmt(r['tokens_per_round'], '7.2f')} "
                     f"{fmt(r['c'], '6.2f')} {r['outputs_match_baseline']}")
    return "\n".join(lines)
