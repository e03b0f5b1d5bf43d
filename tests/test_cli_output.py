"""What `draftlab run` says on stderr while it times the runs itself: its own lines (no worker process is
involved, so no "worker:" prefix), counts in words, and the progress bar's final line once."""

from __future__ import annotations

import re

from tests.meaning import missing
from tests.test_cli_errors import run_cli as run_cli  # a fixture, found by name


def _segments(err: str) -> list[str]:
    """stderr as a log file shows it: every carriage return and newline starts a line of its own."""
    return [s.strip() for s in re.split(r"[\r\n]", err) if s.strip()]


def test_run_prints_its_own_lines_and_one_final_progress_line(run_cli):
    code, out, err = run_cli("--k", "1,2", "--repeats", "1")
    assert code == 0, err
    lines = _segments(err)
    assert not [s for s in lines if s.startswith("worker:")], err
    done = [s for s in lines if s.startswith("draftlab run: run ") and s.endswith(" done")]
    assert done == [
        "draftlab run: run 1 (baseline, batch 1) done",
        "draftlab run: run 2 (speculative, k=1, batch 1) done",
        "draftlab run: run 3 (speculative, k=2, batch 1) done",
    ], err  # a grid's runs differ by it
    (timing,) = [s for s in lines if s.startswith("draftlab run: experiment 1:")]
    assert not missing(timing, "3 runs", "prompt-major", "1 repeat", "batch size 1"), timing
    assert "Loading weights" not in err  # transformers' bars: the one bar on stderr is the runs' own
    full = [s for s in lines if "100%|" in s and "tok" in s]  # ours, not transformers' "Loading weights" bars
    assert len(full) == 1, full  # printed once, after the runs' lines
    assert lines.index(full[0]) > max(lines.index(s) for s in done)
    assert full[0].startswith("all runs: 100%|")  # not the description of whichever decode reported last
    assert "(1 repeat, median)" in out
    header = next(line for line in out.splitlines() if "speedup (95% CI)" in line)
    assert header.endswith("same output")  # the last column, not an unexplained "match"
    legend = [line for line in out.splitlines() if line.strip().startswith("same output:")]
    assert len(legend) == 1 and "greedy" in legend[0], out  # the column's legend: it is said for greedy runs
    rows = [line for line in out.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert rows and all(line.endswith(" yes") for line in rows), rows  # greedy: lossless


def test_the_run_table_leads_a_sweep_of_anything_but_k_with_each_runs_label():
    """A drafter sweep's lines say which drafter they are (its label), not only their k; a k sweep keeps k first."""
    from app.report import format_table

    base = {"new_tokens": 10, "tokens_per_second": 5.0, "target_step_seconds": 0.01}
    run = {
        "k": 4,
        "tokens_per_second": 6.0,
        "speedup": 1.2,
        "speedup_ci": [1.1, 1.3],
        "predicted_speedup": 1.3,
        "alpha": 0.6,
        "tokens_per_round": 2.0,
        "c": 4.0,
        "outputs_match_baseline": True,
    }
    drafters = [{**run, "sweep_variable": "drafter", "sweep_value": v} for v in ("model", "suffix:24")]
    lines = format_table({"experiment_id": 1, "baseline": base, "runs": drafters}).splitlines()
    assert lines[2].split()[:2] == ["drafter", "k"]
    assert [line.split()[0] for line in lines[3:5]] == ["model", "suffix:24"]
    ks = [{**run, "sweep_variable": "k", "sweep_value": k, "k": k} for k in (2, 4)]
    lines = format_table({"experiment_id": 1, "baseline": base, "runs": ks}).splitlines()
    assert lines[2].split()[0] == "k" and [line.split()[0] for line in lines[3:5]] == ["2", "4"]
