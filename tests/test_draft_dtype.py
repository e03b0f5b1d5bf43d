"""draft_dtype: the draft model loaded and run in a precision of its own (same: the experiment's dtype), the target
staying at the experiment's. The CLI sweeps it (`--draft-dtype same,bfloat16`) and refuses an unknown dtype in one
line; the worker's model cache (app/runtime/model_cache.py) loads each run's draft at its dtype, keyed by it, so a
sweep's runs never share the wrong draft; greedy output stays the target's own; the verdict's cost and deploy's note
read it; a drafter without a draft model and an EAGLE-3 head are told apart."""

from __future__ import annotations

import pytest
import torch

from app.cli import build_parser, main
from app.runtime.model_cache import ModelCache
from app.sweep import parse_sweep
from engine.config.run_config import RunConfig
from engine.config.variables import VARIABLES
from engine.errors import DraftLabError
from engine.models.loading import load_pair
from tests.cli_runs import run_json
from tests.meaning import missing


def _experiment(model_dirs, draft: str | None = None, **extra) -> dict:
    """The experiment row the worker's cache reads (app/worker/timing.py hands it over as stored)."""
    return {
        "id": 1,
        "target": model_dirs["target"],
        "draft": draft or model_dirs["draft"],
        "device": "cpu",
        "dtype": "float32",
        "trust_remote_code": False,
        **extra,
    }


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def test_the_cli_sweeps_draft_dtype_and_refuses_an_unknown_one(model_dirs, tmp_path, capsys):
    args = build_parser().parse_args(
        ["run", "--target", "t", "--prompts", "code", "--draft", "d", "--draft-dtype", "same,bfloat16"]
    )
    options = {name: getattr(args, name) for name in VARIABLES}
    config = RunConfig.from_args(args, parse_sweep(options))
    assert (config.sweep, config.values) == ("draft_dtype", ("same", "bfloat16"))
    assert [run["draft_dtype"] for run in config.runs()] == ["same", "bfloat16"]
    assert "draft_dtype" not in config.run_settings(baseline=True)  # one target-only baseline serves both
    assert RunConfig.make(target="t", prompts="code", draft="d").value("draft_dtype") == "same"  # the default

    prompts = tmp_path / "p.txt"
    prompts.write_text("t3 t4\n")
    db = tmp_path / "refused.db"
    argv = ["run", "--target", model_dirs["target"], "--draft", model_dirs["draft"], "--prompts", str(prompts)]
    code = main([*argv, "--draft-dtype", "same,fp8", "--db", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert not missing(errors[0], "--draft-dtype", "fp8", "bfloat16", "same"), errors[0]
    assert not db.exists()  # refused before anything is stored
    with pytest.raises(DraftLabError) as refused:
        RunConfig.make(target="t", prompts="code", draft="d", sweep="draft_dtype", values="float8")
    assert not missing(str(refused.value), "--draft-dtype", "float8"), refused.value


@pytest.mark.parametrize("draft_dtype, expected", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_the_worker_cache_loads_the_draft_in_its_dtype_and_keys_by_it(model_dirs, draft_dtype, expected):
    """Through the cache the worker uses: the run's draft in its own dtype, the target (and the "same" draft) in
    the experiment's; each dtype its own draft object, loaded once; an explicit dtype equal to the experiment's
    shares the loaded pair. Both 16-bit dtypes decode on the CPU."""
    from engine.decoding.runs import speculative_decoder
    from engine.decoding.sampling import SamplingConfig

    logs: list[str] = []
    cache = ModelCache(load_pair, logs.append, None)
    experiment = _experiment(model_dirs)
    loaded = cache.pair(experiment)
    same = cache.pair_for(loaded, model_dirs["draft"], experiment, "same")
    low = cache.pair_for(loaded, model_dirs["draft"], experiment, draft_dtype)

    assert same is loaded.pair and _dtype(same.draft.model) == torch.float32
    assert _dtype(low.draft.model) == expected and low.draft.model is not same.draft.model
    assert low.target.model is loaded.pair.target.model and _dtype(low.target.model) == torch.float32
    assert low.dtype == torch.float32  # the pair's dtype stays the target's (other drafts load in it)
    assert cache.pair_for(loaded, model_dirs["draft"], experiment, draft_dtype) is low  # cached, not reloaded
    assert sum(draft_dtype in line for line in logs) == 1, logs
    assert cache.pair_for(loaded, model_dirs["draft"], experiment, "float32") is loaded.pair

    ids = loaded.pair.tokenizer("t3 t4 t5", return_tensors="pt").input_ids
    result = speculative_decoder(low, SamplingConfig(max_new_tokens=6), 3).generate("t3 t4 t5", ids, 0)
    assert len(result.output_ids) == 6 and result.rounds


def test_a_model_free_drafter_and_an_eagle3_head(model_dirs, tmp_path):
    """A drafter without a draft model: the dtype changes nothing (no draft loads, no note, no cost). An EAGLE-3
    head (it reads the target's hidden states and shares its embedding) is refused in one line at any other dtype."""
    from transformers import AutoModelForCausalLM

    from tests.test_eagle3 import write_head

    cache = ModelCache(load_pair, lambda line: None, None)
    experiment = _experiment(model_dirs)
    loaded = cache.pair(experiment)
    assert cache.pair_for(loaded, None, experiment, "bfloat16").draft is None
    v = VARIABLES["draft_dtype"]
    assert v.serving_note("bfloat16", {"draft": None}) is None
    assert v.run_cost({"sweep_label": "bfloat16", "draft_parameters": None}) is None

    target = AutoModelForCausalLM.from_pretrained(model_dirs["target"])
    head = write_head(tmp_path / "head", target, verifier=model_dirs["target"], aux=[0, 1, 1])
    with pytest.raises(DraftLabError) as refused:
        cache.pair_for(loaded, str(head), experiment, "bfloat16")
    assert not missing(str(refused.value), "bfloat16", str(head), "--draft-dtype same"), refused.value
    assert _dtype(loaded.pair.target.model.get_input_embeddings()) == torch.float32  # the target untouched


def test_a_draft_dtype_sweep_runs_end_to_end_lossless(tmp_path, model_dirs, capsys, monkeypatch):
    """`draftlab run --draft-dtype same,bfloat16`, greedy: both runs' outputs are the baseline's token for token (one
    shared baseline), the bfloat16 run drafted with a bfloat16 draft and the same run with a float32 one (two draft
    objects), the verdict costs them by bytes per parameter, and deploy notes the bfloat16 run's draft precision."""
    from engine.decoding import runs as engine_runs
    from storage import open_store
    from storage.analysis.verdict import verdict
    from storage.serving.deploy import deploy_document

    drafted = []
    make = engine_runs.make_drafter

    def spy(spec, *, draft_model, **kwargs):
        drafted.append(draft_model)
        return make(spec, draft_model=draft_model, **kwargs)

    monkeypatch.setattr(engine_runs, "make_drafter", spy)
    doc, db = run_json(
        tmp_path, model_dirs, capsys, "--draft-dtype", "same,bfloat16", "--k", "3", "--max-new-tokens", "12"
    )

    baseline = doc["baseline"]["outputs"]
    assert baseline and all(len(o["token_ids"]) == 12 for o in baseline)
    assert [r["sweep_value"] for r in doc["runs"]] == ["same", "bfloat16"]
    for run in doc["runs"]:
        assert run["status"] == "done" and run["proposed"] > 0, run
        assert run["outputs"] == baseline and run["outputs_match_baseline"] is True, run["sweep_value"]
    assert [_dtype(m) for m in drafted] == [torch.float32, torch.bfloat16]  # one decoder per run, in sweep order
    assert drafted[0] is not drafted[1]

    store = open_store(db)
    eid = doc["experiment_id"]
    costs = {c.value: c.cost for c in verdict(store, eid).candidates}
    size = sum(p.numel() for p in drafted[0].parameters())
    assert costs == {"same": 4.0 * size, "bfloat16": 2.0 * size}  # "same" read as the experiment's float32
    ids = [r["run_id"] for r in doc["runs"]]
    notes = [" ".join(deploy_document(store, eid, rid)["engines"]["vllm"]["notes"]) for rid in ids]
    assert "draft_dtype same" not in notes[0]
    assert not missing(notes[1], "bfloat16", "speculative_config", "draft_dtype same"), notes[1]
    store.dispose()


@pytest.mark.parametrize(
    "row, cost",
    [
        ({"dtype": "bfloat16"}, 2.0),
        ({"dtype": "auto", "device_name": "cpu"}, 4.0),
        ({"dtype": "auto", "device_name": "NVIDIA H100 80GB HBM3 (cuda:0)"}, 2.0),
        ({"dtype": "auto"}, None),  # the device unknown: not comparable
    ],
)
def test_same_costs_the_experiments_dtype(row, cost):
    got = VARIABLES["draft_dtype"].run_cost({"sweep_label": "same", "draft_parameters": 10, **row})
    assert got == (None if cost is None else cost * 10)
