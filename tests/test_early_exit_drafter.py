"""The early-exit:L drafter (LayerSkip's self-speculation, transformers' assistant_early_exit): the draft model cut to
its first L decoder layers, then its final norm and LM head. Lossless with the target as its own draft (Llama and
GPT-2, batch 1 and 3); the cut model computes exactly the first L layers; the target is never changed; an L the
draft cannot cut is refused in one line; the CLI runs it."""

import json

import pytest
import torch

from app.cli import main
from engine.config.drafter_specs import canonical_drafter, parse_drafter
from engine.decoding import runs
from engine.decoding.batched_cache import BatchCache
from engine.decoding.drafting import EarlyExitDrafter, early_exit, make_drafter
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import speculative_metrics
from engine.models.cached_model import rollback_cache
from tests import tiny_models as tm
from tests.meaning import missing

PROMPTS = ["t5", "t9 t3 t22 t9 t3", "t40 t41 t2 t8 t9 t10 t11 t12 t13"]
NEW = 24
LAYERS = 4
FAMILIES = ["llama", "gpt2"]


def _target(family: str):
    return getattr(tm, family)(0, layers=LAYERS, sharpness=4.0, eos=None)


def _layer_count(model) -> int:
    base = model.base_model
    return len(base.layers if hasattr(base, "layers") else base.h)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_target_as_its_own_early_exit_draft_is_lossless_and_left_untouched(family, batch):
    target = _target(family)
    p = tm.pair(target, target, tm.tokenizer(64, eos=False))  # one object: the target is its own draft
    cfg = SamplingConfig(temperature=0, max_new_tokens=NEW)
    ids = runs.encode_prompts(p, PROMPTS, NEW)
    probe = ids[1][None]
    with torch.no_grad():
        before = target(probe).logits
    state = {name: t.clone() for name, t in target.state_dict().items()}

    base = [r for b in runs.run_batches(runs.baseline_decoder(p, cfg), PROMPTS, ids, batch) for r in b]
    decoder = runs.speculative_decoder(p, cfg, 3, drafter="early-exit:1")
    spec = [r for b in runs.run_batches(decoder, PROMPTS, ids, batch) for r in b]

    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    m = speculative_metrics(spec, base)
    assert m["proposed"] > 0 and m["rejected"] > 0  # one layer of four drafts, and not always the target's token
    for s in spec:  # a constant k: every round drafts 3 unless the budget left is shorter
        left = NEW
        for r in s.rounds:
            assert r.k == min(3, left - 1), (r.k, left)
            left -= len(r.emitted_ids)
    draft = decoder.drafter.lm.model
    assert isinstance(decoder.drafter, EarlyExitDrafter) and draft is not target
    assert _layer_count(draft) == draft.config.num_hidden_layers == 1
    # The target: its layers, its config, its weights and its outputs as before.
    assert _layer_count(target) == target.config.num_hidden_layers == LAYERS
    assert all(torch.equal(t, state[name]) for name, t in target.state_dict().items())
    with torch.no_grad():
        assert torch.equal(target(probe).logits, before)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_the_cut_draft_computes_exactly_the_first_layers_then_the_norm_and_head(family, layers):
    target = _target(family)
    cut = early_exit(target, layers)
    # The reference: an HF model of `layers` layers holding the target's weights for them (the rest left out).
    reference = getattr(tm, family)(5, layers=layers, sharpness=1.0, eos=None)
    missed = reference.load_state_dict(target.state_dict(), strict=False).missing_keys
    assert not [key for key in missed if "attn.bias" not in key], missed  # every weight came from the target
    ids = torch.tensor([[3, 17, 5, 40, 9, 22, 8]])
    with torch.no_grad():
        want = reference(ids).logits
        assert torch.allclose(cut(ids).logits, want, atol=1e-5)
        assert not torch.allclose(target(ids).logits, want, atol=1e-3)  # the full depth differs
        if layers + 1 < LAYERS:
            assert not torch.allclose(early_exit(target, layers + 1)(ids).logits, want, atol=1e-3)
        # Through the drafters' KV cache, a token at a time: a cache of `layers` layers, the same logits.
        cache = BatchCache(cut, 64)
        cache.reset(1)
        stepped = [cache.forward(ids[:, :4], torch.ones(1, 4, dtype=torch.bool))[:, -1]]
        for i in range(4, ids.shape[1]):
            stepped.append(cache.forward(ids[:, i : i + 1], torch.ones(1, 1, dtype=torch.bool))[:, -1])
    assert torch.allclose(torch.stack(stepped, 1), want[:, 3:], atol=1e-5)
    assert len(rollback_cache(cut).layers) == layers and len(cache.cache.layers) == layers
    # Shares the target's weights (no copy of a tensor), keeps its layers' own modules.
    assert cut.get_output_embeddings().weight is target.get_output_embeddings().weight
    assert cut.base_model is not target.base_model and cut.config is not target.config


def test_the_cut_keeps_a_windowed_models_layer_types_in_step():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=1,
        max_position_embeddings=64,
    )
    target = Qwen2ForCausalLM(config).eval()
    cut = early_exit(target, 2)
    assert cut.config.layer_types == target.config.layer_types[:2] and len(target.config.layer_types) == 3
    assert len(rollback_cache(cut).layers) == 2


@pytest.mark.parametrize("layers", [LAYERS, LAYERS + 5])
def test_an_exit_at_or_past_the_draft_depth_is_refused_in_one_line(layers):
    target = _target("llama")
    with pytest.raises(DraftLabError) as err:
        make_drafter(f"early-exit:{layers}", draft_model=target, vocab_size=64, k=3, cfg=SamplingConfig())
    message = str(err.value)
    assert "\n" not in message
    assert not missing(message, f"early-exit:{layers}", f"first {layers}", f"has {LAYERS}", f"below {LAYERS}"), message
    assert target.config.num_hidden_layers == LAYERS


@pytest.mark.parametrize("spec", ["early-exit:0", "early-exit:10000", "early-exit:2.5", "early-exit"])
def test_a_bad_exit_layer_is_refused_naming_the_drafter_and_its_example(spec):
    with pytest.raises(DraftLabError) as err:
        parse_drafter(spec)
    assert not missing(str(err.value), "'early-exit'", "early-exit:4"), str(err.value)


def test_the_cli_runs_early_exit_with_the_target_as_its_own_draft(model_dirs, tmp_path, capsys):
    assert (
        parse_drafter(" early-exit:02 ") == ("early-exit", 2) and canonical_drafter("early-exit:02") == "early-exit:2"
    )
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t3 t4 t5\nt9 t10\n")
    target = model_dirs["target"]  # two layers: early-exit:1 keeps one
    argv = ["run", "--target", target, "--draft", target, "--prompts", str(prompts), "--max-new-tokens", "8"]
    argv += ["--db", f"sqlite:///{tmp_path / 'cli.db'}", "--k", "2", "--json", "--repeats", "1"]
    code = main([*argv, "--drafter", "early-exit:1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    (run,) = json.loads(out)["runs"]  # the speculative run (its baseline is stored beside it)
    assert run["drafter"] == "early-exit:1" and run["draft"] == target and run["status"] == "done"
    assert run["outputs_match_baseline"] is True and run["proposed"] > 0


def test_transformers_serves_it_with_the_target_as_its_own_assistant():
    """The deploy tab: assistant_early_exit goes to generate() (on the generation_config it re-enters early exit in
    the assistant's own generate), the schedule on the target's generation_config (where transformers reads an
    assistant's), no assistant model; a run that drafted from another model's layers is said to differ."""
    from storage.serving.engine_settings import deploy_settings

    experiment = {"target": "demo-target", "draft": "demo-target", "temperature": 0.0, "seed": 0}
    experiment |= {"max_new_tokens": 64, "dtype": "auto", "trust_remote_code": False}
    doc = deploy_settings({"run_id": 3, "k": 4, "drafter": "early-exit:2"}, experiment)["transformers"]
    assert doc["generate_kwargs"] == {"assistant_early_exit": 2, "do_sample": False}
    assert doc["assistant_generation_config"]["num_assistant_tokens"] == 4
    snippet = doc["snippet"]
    compile(snippet, "<deploy snippet>", "exec")
    assert "target.generation_config.num_assistant_tokens = 4" in snippet and "assistant_model" not in snippet
    assert not [n for n in doc["notes"] if n.startswith("Not expressible")]
    other = deploy_settings({"run_id": 3, "k": 4, "drafter": "early-exit:2", "draft": "demo-draft"}, experiment)
    said = " ".join(n for n in other["transformers"]["notes"] if n.startswith("Not expressible"))
    assert not missing(said, "demo-draft", "--draft demo-target"), said
    for engine in ("vllm", "sglang", "llama_cpp"):  # none drafts with the target's own layers
        assert not other[engine].get("command") and other[engine]["notes"][0].startswith("Not expressible")


@pytest.mark.parametrize("drafters", ["early-exit:2", "model,early-exit:5"])
def test_the_cli_refuses_an_exit_past_a_local_drafts_depth_before_storing_anything(
    model_dirs, tmp_path, capsys, drafters
):
    """A local draft's layer count is read from its config.json before anything queues (engine/config/run_config's
    check_drafters): exit 2, one line naming the drafter, both depths and the fix, no database written."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t3 t4 t5\n")
    db = tmp_path / "refused.db"
    target = model_dirs["target"]  # two layers
    code = main(
        ["run", "--target", target, "--draft", target, "--prompts", str(prompts), "--db", f"sqlite:///{db}"]
        + ["--drafter", drafters]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    bad = drafters.split(",")[-1]
    assert not missing(err, repr(bad), f"keeps {bad.split(':')[1]}", "has 2", "below 2"), err
    assert not db.exists()


def test_the_forms_default_drafter_comparison_leaves_early_exit_out():
    """The New-experiment form compares strategies for ONE draft model by default; early exit makes another draft of
    it (and fails outright on a draft no deeper than its default L), so it is offered, not preselected."""
    from engine.config.drafter_specs import SPECS
    from pages.widgets.prefill import DEFAULT_DRAFTER_SWEEP

    assert "early-exit" not in DEFAULT_DRAFTER_SWEEP and "early-exit" in SPECS
    assert {"model", "heuristic", "prompt-lookup", "suffix"} <= set(DEFAULT_DRAFTER_SWEEP)
