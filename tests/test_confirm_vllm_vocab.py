"""`draftlab confirm` against a REAL vLLM server (the CPU build, as tests/test_confirm_vllm.py) for a draft with another
vocabulary: demo-target with demo-draft-othervocab (its own tokenizer) measured in the lab, then served by vLLM with
the deploy export's speculative config, which carries `use_heterogeneous_vocab` (vLLM's token-level intersection,
the rule the lab drafted by). Greedy: the server's outputs equal its target alone, and it accepts drafts."""

from __future__ import annotations

import json

from app.cli import main


def test_confirm_serves_a_draft_of_another_vocabulary_in_vllm(tmp_path, capsys, vllm_command):
    db = f"sqlite:///{tmp_path / 'confirm.db'}"
    prompts = tmp_path / "two.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("def is_prime(n):\n", "for i in range(10):\n")))
    lab_args = ["--prompts", str(prompts), "--k", "3", "--max-new-tokens", "16", "--repeats", "1", "--device", "cpu"]
    run = ["run", "--target", "demo-target", "--draft", "demo-draft-othervocab", *lab_args, "--db", db, "--json"]
    assert main(run) == 0
    lab = json.loads(capsys.readouterr().out)
    (spec_run,) = lab["runs"]
    assert spec_run["vocab"] == "intersection" and 0 < spec_run["vocab_coverage"] < 1
    confirm = ["confirm", str(lab["experiment_id"]), "--configs", "all", "--concurrency", "1", "--repeats", "1"]
    status = main([*confirm, "--vllm", vllm_command, "--db", db, "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    (config,) = json.loads(out)["configs"]
    assert config["speculative_config"]["use_heterogeneous_vocab"] is True
    assert config["speculative_config"]["method"] == "draft_model"
    (m,) = config["per_concurrency"]
    assert m["outputs_match_server_baseline"] == 1.0  # greedy: lossless in the server too
    assert 0 < m["server_draft_acceptance_rate"] <= 1
