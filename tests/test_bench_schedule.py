"""benchmarks/bench_schedule.py runs: a tiny batch x k grid through the CLI (a separate process), and every figure it
prints per batch size is the run document's (benchmarks/bench_schedule.md quotes its output)."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import bench_schedule


def test_the_benchmark_prints_each_batch_sizes_table_and_the_schedule_from_the_run(tmp_path, capsys):
    doc_path = tmp_path / "doc.json"
    status = bench_schedule.main(
        [
            "--batch-sizes",
            "1,2",
            "--k",
            "1,2",
            "--repeats",
            "1",
            "--max-new-tokens",
            "4",
            "--num-prompts",
            "4",
            "--db",
            f"sqlite:///{tmp_path / 'kept.db'}",
            "--json",
            str(doc_path),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert (tmp_path / "kept.db").exists()  # --db keeps the database for the dashboard
    doc = json.loads(doc_path.read_text())
    assert sorted(b["batch_size"] for b in doc["baselines"]) == [1, 2]
    for run in doc["runs"]:
        lo, hi = run["speedup_ci"]
        speedup = f"{run['speedup']:.2f} ({lo:.2f}-{hi:.2f})"
        row = f"{run['k']:>6} {speedup:>19} {run['tokens_per_second']:>7.1f}"
        section = out.split(f"\nbatch {run['batch_size']}  ")[1].split("\nbatch ")[0]
        assert row in section, (row, section)
    for b in doc["baselines"]:
        assert f"\nbatch {b['batch_size']}  (baseline {b['tokens_per_second']:.1f} tok/s)" in out
    assert doc["schedule"]["text"] in out
    ranges = doc["schedule"]["num_speculative_tokens_per_batch_size"]
    assert "vLLM num_speculative_tokens_per_batch_size: " + (json.dumps(ranges) if ranges else "none") in out
    assert re.search(r"wall time\b.*: \d+ s\b", out) and re.search(r"load average\b.* after\b", out)
    assert re.search(r"load average \(1/5/15 min\) before [\d.]+/[\d.]+/[\d.]+", out)
    # --from-json reprints the same tables from the saved document, running nothing
    assert bench_schedule.main(["--from-json", str(doc_path)]) == 0
    again = capsys.readouterr().out
    tables = out[out.index("\nbatch 1  ") : out.index("outputs equal to the baseline's")]
    assert tables in again


def test_too_few_prompts_for_num_prompts_is_one_line_naming_the_fix(tmp_path):
    with pytest.raises(SystemExit) as exc:
        bench_schedule.main(
            ["--prompts", "code:tune", "--num-prompts", "500", "--db", f"sqlite:///{tmp_path / 'x.db'}"]
        )
    assert str(exc.value).startswith("error: code:tune holds 20 prompts, fewer than --num-prompts 500;")
    assert "\n" not in str(exc.value) and not (tmp_path / "x.db").exists()
