"""The shipped demo pair: resolves by name, loads offline, shares one byte-level tokenizer, fits the size
budget, and speculative greedy decoding with it reproduces the target-only output token for token."""

from __future__ import annotations

import json

import pytest
import torch

from engine import zoo

PAIR = ("demo-target", "demo-draft")
PARAM_RANGES = {"demo-target": (8_000_000, 15_000_000), "demo-draft": (500_000, 2_000_000)}


@pytest.fixture(scope="module")
def loaded():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for name in PAIR:
        path = zoo.resolve(name)
        assert path is not None, f"{name} is not shipped: train it with python -m engine.zoo.train --model {name}"
        out[name] = (
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(path),
        )
    return out


def test_names_resolve_inside_the_package():
    for name in PAIR:
        path = zoo.resolve(name)
        assert path is not None and path.parent == zoo.ZOO_DIR and (path / "config.json").is_file()
        assert (path / "model.safetensors").is_file()
    assert zoo.resolve("gpt2") is None
    assert zoo.resolve("demo-nothing") is None


def test_architecture_and_parameter_counts(loaded):
    for name, (model, _) in loaded.items():
        assert type(model).__name__ == "LlamaForCausalLM"
        n = sum(p.numel() for p in model.parameters())
        lo, hi = PARAM_RANGES[name]
        assert lo <= n <= hi, (name, n)
    # the draft is much shallower: on CPU a forward's cost is mostly per layer, which sets c
    t, d = loaded["demo-target"][0].config, loaded["demo-draft"][0].config
    assert t.num_hidden_layers >= 4 * d.num_hidden_layers


def test_weights_are_fp16_safetensors_within_30_mb():
    from safetensors import safe_open

    total = 0
    for name in zoo.DEMO_MODELS:
        path = zoo.resolve(name)
        if path is None:
            continue
        f = path / "model.safetensors"
        total += f.stat().st_size
        with safe_open(str(f), "pt") as st:  # every weight in float16 (an EAGLE-3 head's d2t/t2d are indices)
            assert {st.get_slice(k).get_dtype() for k in st.keys() if k not in ("d2t", "t2d")} == {"F16"}
    assert total <= 30 * 1024 * 1024


def test_model_cards_name_the_reproducing_command():
    for name in PAIR:
        card = (zoo.resolve(name) / "MODEL_CARD.md").read_text(encoding="utf-8")
        assert f"python -m engine.zoo.train --model {name} --steps" in card
        for word in ("parameters", "training", "final loss", "wall time"):
            assert word in card
        info = json.loads((zoo.resolve(name) / "training.json").read_text(encoding="utf-8"))
        assert info["training_tokens"] > 0 and info["final_train_loss"] < 8


def test_tokenizers_are_identical(loaded):
    t_tok, d_tok = loaded["demo-target"][1], loaded["demo-draft"][1]
    t_json = (zoo.resolve("demo-target") / "tokenizer.json").read_bytes()
    assert t_json == (zoo.resolve("demo-draft") / "tokenizer.json").read_bytes()
    assert t_tok.get_vocab() == d_tok.get_vocab()
    assert len(t_tok) == loaded["demo-target"][0].config.vocab_size == 4096
    assert t_tok.eos_token == t_tok.bos_token == "<|endoftext|>"
    assert t_tok.eos_token_id == loaded["demo-target"][0].generation_config.eos_token_id


@pytest.mark.parametrize(
    "text",
    [
        "春天来了，公园里的花都开了。请问：投机解码是什么？",
        "def f(x):\n\treturn x ** 2  # 平方\n",
        "emoji 😀 and accents café naïve, Ωμέγα, Привет, 日本語",
        "   leading spaces and trailing   ",
    ],
)
def test_any_text_round_trips(loaded, text):
    tok = loaded["demo-target"][1]
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text


def test_models_learned_the_corpus(loaded):
    """A trained model predicts Python far better than chance (log 4096 = 8.3 nats)."""
    model, tok = loaded["demo-target"]
    ids = tok(
        "import os\nimport sys\n\n\ndef main():\n    parser = argparse.ArgumentParser()\n", return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < 4.0


def test_shipped_pair_greedy_matches_target_only():
    """End to end through the engine: load by name, baseline, then speculative k=3; same tokens."""
    from engine.decoding.runs import baseline_decoder, encode_prompts, run_prompts, speculative_decoder
    from engine.decoding.sampling import SamplingConfig
    from engine.models.loading import load_pair
    from engine.text.prompt_sets import load_prompts

    pair = load_pair("demo-target", "demo-draft", "cpu", "auto")
    assert pair.dtype == torch.float32
    prompts = load_prompts("code:validation")[:2] + load_prompts("chinese:validation")[:1]
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=24)
    ids = encode_prompts(pair, prompts, cfg.max_new_tokens)
    base = list(run_prompts(baseline_decoder(pair, cfg), prompts, ids))
    spec = list(run_prompts(speculative_decoder(pair, cfg, 3), prompts, ids))
    assert [p.output_ids for p in spec] == [p.output_ids for p in base]
    assert all(len(p.output_ids) > 0 for p in base)
    accepted = sum(r.accepted for p in spec for r in p.rounds)
    assert accepted > 0  # the draft agrees with the target at least sometimes


def test_the_shipped_eagle3_head_drafts_for_the_demo_target_losslessly():
    """demo-eagle3 resolves by name, loads as an EAGLE-3 head for demo-target (its verifier), and greedy
    speculation with it at k 3 reproduces target-only decoding while accepting most drafts."""
    from engine.decoding.runs import baseline_decoder, encode_prompts, speculative_decoder
    from engine.decoding.sampling import SamplingConfig
    from engine.models.eagle3 import Eagle3Head
    from engine.models.loading import load_pair
    from engine.text.prompt_sets import load_prompts

    pair = load_pair("demo-target", "demo-eagle3", "cpu", "float32")
    assert isinstance(pair.draft.model, Eagle3Head) and pair.draft.model.aux_layers == [2, 6, 9]
    card = json.loads((zoo.resolve("demo-eagle3") / "train_head.json").read_text())
    assert card["target"] == "demo-target" and "draftlab train-head --target demo-target" in card["command"]
    prompts = load_prompts("code:validation")[:4]
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=32)
    ids = encode_prompts(pair, prompts, 32)
    spec = speculative_decoder(pair, cfg, 3, drafter="eagle3")
    base = baseline_decoder(pair, cfg)
    accepted = proposed = 0
    for i, (prompt, prompt_ids) in enumerate(zip(prompts, ids)):
        result = spec.generate(prompt, prompt_ids, i)
        assert result.output_ids == base.generate(prompt, prompt_ids, i).output_ids
        accepted += sum(r.accepted for r in result.rounds)
        proposed += sum(r.k for r in result.rounds)
    assert accepted / proposed > 0.5
