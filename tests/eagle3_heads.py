"""EAGLE-3 heads for the demo target in tests that need a head with real acceptance (a random head accepts ~0 in
the lab and in a server alike, so a collapse could never show), and copies of one served wrongly.

`demo_head(tmp)`: the shipped engine/zoo/demo-eagle3 once it exists, else a STAND-IN trained here in seconds: a
new head (engine/eagle3.new_head, vLLM's default aux ids, norm_before_fc) fitted for STEPS steps to the target's own
greedy continuations of code:tune (teacher-forced first drafts, cross-entropy on the target's token). It is a
fixture, not the trainer (engine/training/head_training.py): it exists so these tests run before demo-eagle3 lands.

`misserved(head, out, how)`: the same head as a server would read it after one of the mistakes the collapse finding
names: "aux-1" (its ids one lower: a head trained in vLLM's convention written in SGLang's), "no-norm" (norm_before_fc
dropped from config.json: vLLM then drops the input_norm weight), "norm-on" (norm_before_fc set, with a unit
input_norm weight, on a head trained without it: the server normalises the aux states the head never saw
normalised), "d2t" (lm_head rows in another order than the
draft ids they score, as a whole-vocabulary head saved in draft order without its d2t: every draft proposes a wrong
id).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from engine.zoo import ZOO_DIR

DEMO_HEAD = ZOO_DIR / "demo-eagle3"
STEPS = 300
PROMPTS, NEW_TOKENS = 16, 48
MISTAKES = ("aux-1", "no-norm", "norm-on", "d2t")


def demo_head(tmp: Path) -> str:
    """A head for demo-target with real acceptance: demo-eagle3 when shipped, else the stand-in in `tmp`."""
    if (DEMO_HEAD / "config.json").exists():
        return str(DEMO_HEAD)
    return stand_in(tmp / "stand-in-eagle3")


def stand_in(out: Path) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.models.eagle3 import default_aux_layers, new_head, save_head
    from engine.models.head_check import _continuations
    from engine.text.chat import render
    from engine.text.prompt_sets import load_prompts
    from engine.zoo import resolve

    source = str(resolve("demo-target"))
    target = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    prompts = render(load_prompts("code:tune")[:PROMPTS], tokenizer)  # plain texts: as they are
    data = _continuations(target, tokenizer, prompts, NEW_TOKENS, torch.device("cpu"))
    layers = target.config.num_hidden_layers
    torch.manual_seed(0)
    head = new_head(
        target, default_aux_layers(layers), torch.arange(target.config.vocab_size), "demo-target", norm_before_fc=True
    )
    trained = [p for name, p in head.named_parameters() if not name.startswith("embed_tokens")]
    optimizer = torch.optim.AdamW(trained, lr=3e-3)
    for step in range(STEPS):
        ids, states, _ = data[step % len(data)]
        combined = torch.cat([states[i] for i in head.aux_layers], -1)[:, :-2]
        logits = head(ids[1:-1][None], hidden_states=head.combine(combined)).logits[0]
        loss = torch.nn.functional.cross_entropy(logits, ids[2:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_head(head.eval(), out, dtype=torch.float32)
    return str(out)


def misserved(head: str, out: Path, how: str) -> str:
    """A copy of the head directory `head` in `out` with the mistake `how` (one of MISTAKES)."""
    from safetensors.torch import load_file, save_file

    assert how in MISTAKES, how
    shutil.copytree(head, out)
    config = json.loads((out / "config.json").read_text())
    if how == "aux-1":
        config["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in config["eagle_aux_hidden_state_layer_ids"]]
    elif how == "no-norm":
        config["norm_before_fc"] = False
    elif how == "norm-on":
        assert not config.get("norm_before_fc"), "norm-on is the mistake for a head trained without the norm"
        config["norm_before_fc"] = True
        weights = load_file(str(out / "model.safetensors"))
        width = weights["fc.weight"].shape[1]  # len(aux) x the target's hidden size
        weights["input_norm.weight"] = torch.ones(width, dtype=weights["fc.weight"].dtype)
        save_file(weights, str(out / "model.safetensors"))
    else:
        weights = load_file(str(out / "model.safetensors"))  # with a d2t too: every row then maps a wrong id
        order = torch.randperm(weights["lm_head.weight"].shape[0], generator=torch.Generator().manual_seed(0))
        weights["lm_head.weight"] = weights["lm_head.weight"][order].contiguous()
        save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return str(out)
