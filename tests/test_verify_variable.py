"""--verify standard,block as a swept variable (engine/config/variables.py): stored on every run, one shared
target-only baseline, executed by the worker (a block run's rounds record accepted_standard, a standard run's none),
carried by the run JSON and export."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from app.cli import main
from app.sweep import parse_sweep
from engine.config.run_config import RunConfig
from engine.errors import DraftLabError
from storage import open_store
from storage.jobs.experiments import enqueue_experiment
from storage.records import queries as q
from tests.meaning import missing
from tests.test_sweep import BASE


def test_a_verify_sweep_runs_end_to_end(capsys, tmp_path):
    db_url = f"sqlite:///{tmp_path / 'v.db'}"  # the decoding is the point here; every database stores the columns
    args = ["run", "--target", "demo-target", "--draft", "demo-draft", "--prompts", "code:validation", "--k", "3"]
    args += ["--temperature", "1", "--verify", "standard,block", "--max-new-tokens", "8", "--repeats", "1"]
    assert main([*args, "--db", db_url, "--json"]) == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    store = open_store(db_url)
    eid = doc["experiment_id"]
    runs = q.runs(store, eid)
    assert (runs["kind"] == "baseline").sum() == 1  # the target verifies nothing: one shared baseline
    spec = runs[runs["kind"] == "speculative"].set_index("verify")
    assert sorted(spec.index) == ["block", "standard"]
    assert q.experiment(store, eid)["sweep_variable"] == "verify"
    with store.read() as conn:
        counts = dict(
            conn.execute(
                text(
                    "SELECT ru.verify, COUNT(rd.accepted_standard) FROM rounds rd JOIN runs ru ON ru.id = rd.run_id "
                    "GROUP BY ru.verify"
                )
            ).all()
        )
        rounds = conn.execute(
            text("SELECT COUNT(*) FROM rounds WHERE run_id = :r"), {"r": int(spec.loc["block", "run_id"])}
        ).scalar()
    assert counts == {"standard": 0, "block": rounds} and rounds > 0
    by_verify = {r["verify"]: r for r in doc["runs"]}
    assert by_verify["standard"]["accepted_standard"] is None
    assert by_verify["block"]["accepted_standard"] == spec.loc["block", "accepted_standard"]
    assert main(["export", str(eid), "--format", "json", "--db", db_url]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert "block" in json.dumps(exported) and "accepted_standard" in json.dumps(exported)
    block_run = str(int(spec.loc["block", "run_id"]))
    assert main(["export", str(eid), "--format", "deploy", "--run", block_run, "--db", db_url]) == 0
    deploy = json.loads(capsys.readouterr().out)
    assert json.loads(deploy["engines"]["vllm"]["speculative_config"])["rejection_sample_method"] == "block"
    assert deploy["configuration"]["verify"] == "block"


def test_each_run_of_a_verify_sweep_verifies_with_its_rule(store):
    cfg = RunConfig.make(target="t", prompts="code", draft="d", sweep="verify", values="standard,block", temperature=1)
    eid = enqueue_experiment(store, **cfg.enqueue(), name="x", prompt_texts=["p"])
    experiment, rows = q.experiment(store, eid), q.runs(store, eid)
    assert (rows["kind"] == "baseline").sum() == 1
    spec = rows[rows["kind"] == "speculative"]
    sampling = [RunConfig.of_run(row.to_dict(), experiment).sampling() for _, row in spec.iterrows()]
    assert sorted(s.verify for s in sampling) == ["block", "standard"]  # what app/worker/timing.py hands the engine
    assert RunConfig.make(target="t", prompts="code", draft="d", verify="block").sampling().verify == "block"


def test_the_sweep_parser_takes_verify():
    s = parse_sweep({**BASE, "verify": "standard, block"})
    assert s.variable == "verify" and s.values == ["standard", "block"]
    with pytest.raises(DraftLabError) as err:
        parse_sweep({**BASE, "verify": "standard,blocky"})
    assert not missing(str(err.value), "--verify", "'blocky'", "standard, block"), err.value


def test_a_block_run_maps_to_vllm_and_every_other_engine_says_it_cannot():
    from storage.serving.engine_settings import deploy_settings

    experiment = {"target": "demo-target", "draft": "demo-draft", "drafter": "model", "dtype": "auto"}
    base = {"run_id": 1, "k": 3, "drafter": "model", "draft": "demo-draft", "temperature": 0.8, "top_k": 0}
    block = deploy_settings({**base, "verify": "block"}, experiment)
    assert json.loads(block["vllm"]["speculative_config"])["rejection_sample_method"] == "block"
    for engine in ("sglang", "llama_cpp", "transformers"):
        said = [n for n in block[engine]["notes"] if not missing(n, "Not expressible", "block", "accepted_standard")]
        assert len(said) == 1, (engine, block[engine]["notes"])
    standard = deploy_settings({**base, "verify": "standard"}, experiment)
    assert "rejection_sample_method" not in json.loads(standard["vllm"]["speculative_config"])
    assert not any("accepted_standard" in n for tab in standard.values() for n in tab.get("notes", []))


def test_confirm_refuses_a_sampled_block_run_on_vllms_cpu_build(tmp_path):
    from dataclasses import replace

    from app.serving.confirm import Config
    from app.serving.cpu_block import refuse_block_on_cpu_build

    cpu = tmp_path / "python"
    cpu.write_text("")
    spec = json.dumps({"method": "draft_model", "num_speculative_tokens": 3, "rejection_sample_method": "block"})
    block = Config("run 3", 3, 3, spec, {"temperature": 1.0}, "demo-target")
    with pytest.raises(DraftLabError) as err:
        refuse_block_on_cpu_build([str(cpu), "-m", "vllm.entrypoints.openai.api_server"], [block], cpu)
    said = str(err.value)
    assert "\n" not in said
    assert not missing(said, "run 3", "block", "HAS_TRITON", "vllm/v1/sample/rejection_sampler.py", "verify=standard")
    refuse_block_on_cpu_build(["/opt/gpu/bin/python", "-m", "vllm"], [block], cpu)  # another vLLM: no refusal
    refuse_block_on_cpu_build([str(cpu)], [replace(block, request={"temperature": 0.0})], cpu)  # greedy: the argmax
    standard = replace(block, speculative_config=json.dumps({"method": "draft_model", "num_speculative_tokens": 3}))
    refuse_block_on_cpu_build([str(cpu)], [standard], cpu)


def test_the_cpu_builds_source_still_says_what_the_refusal_quotes():
    """The refusal's reason, read from the installed CPU build: block only in the V2 runner's sampler, the V1 sampler
    reading rejection_sample_method for 'synthetic' alone, the V2 runner needing Triton, Triton without a CPU
    backend disabled, and the installed Triton without one."""
    from app.serving.vllm_server import LOCAL_VENV_PYTHON
    from tests.conftest import missing_service

    found = sorted(LOCAL_VENV_PYTHON.parent.parent.glob("lib/python3*/site-packages/vllm/config/vllm.py"))
    if not found:
        missing_service(f"no vLLM CPU build under {LOCAL_VENV_PYTHON.parent.parent}; run scripts/install_vllm.sh")
    vllm = found[0].parent.parent
    site = vllm.parent
    v2 = (vllm / "v1/worker/gpu/spec_decode/rejection_sampler.py").read_text()
    assert 'rejection_sample_method == "block"' in v2 and "use_block_verification = True" in v2
    v1 = (vllm / "v1/sample/rejection_sampler.py").read_text()
    assert 'rejection_sample_method == "synthetic"' in v1 and '"block"' not in v1
    assert "if not HAS_TRITON:" in (vllm / "config/vllm.py").read_text()
    assert "doesn't include CPU backend" in (vllm / "triton_utils/importing.py").read_text()
    assert not (site / "triton/backends/cpu").exists()
