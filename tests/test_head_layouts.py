"""EAGLE-3 heads in SGLang's layout (engine/config/head_format.py, engine/models/eagle3.py convert_head, `draftlab
convert-head`): a speculators head converted to SGLang's layout and back computes the same logits in the lab and decodes
the same rounds, its SGLang file's aux ids are one lower (SGLang's id j = the output of layer j), a SpecForge-style head
(no verifier, its own embedding, `midlayer.*`) reads the target's hidden_states[j + 1] with the target's embedding, and
what SGLang cannot compute is refused in one line."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import head_format
from engine.errors import DraftLabError
from engine.models import eagle3
from engine.models.loading import with_draft
from tests import tiny_models as tm
from tests.test_eagle3 import decode, target_pair

AUX = [1, 2, 3]  # of the 4-layer target, DraftLab's (vLLM's) convention: the input of decoder layer i


@pytest.fixture(scope="module")
def target():
    return tm.llama(0, layers=4, vocab=16, sharpness=4.0, eos=None)


def speculators_head(path, target, aux=AUX, **kwargs):
    """A trained-looking head for `target` in the speculators layout, float32 (no embedding: the target's)."""
    torch.manual_seed(3)
    head = eagle3.new_head(target, aux, torch.arange(12), verifier="target", **kwargs)
    with torch.no_grad():
        for p in head.layers.parameters():
            p.add_(0.05 * torch.randn_like(p))
        head.fc.weight.normal_(0, 0.2)
    eagle3.save_head(head, path, dtype=torch.float32)
    return path


def logits(head_dir, target):
    """The head's logits and next states on fixed inputs, loaded by the lab."""
    head = eagle3.load_head(head_dir, target, ["target"], torch.device("cpu"), torch.float32)
    torch.manual_seed(9)
    ids = torch.randint(0, 16, (2, 5))
    states = torch.randn(2, 5, len(head.aux_layers) * 32)
    with torch.no_grad():
        out = head(ids, head.combine(states))
    return head, out.logits, out.hidden_states[1]


def test_speculators_to_sglang_and_back_computes_the_same_head(tmp_path, target):
    src = speculators_head(tmp_path / "head", target)
    notes = eagle3.convert_head(src, head_format.sglang_dir(src), "sglang")
    sglang = head_format.sglang_dir(src)
    config = json.loads((sglang / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}
    assert (config["draft_vocab_size"], config["tie_word_embeddings"], config["hidden_size"]) == (12, False, 32)
    assert config["verifier_name_or_path"] == "target" and "speculators_config" not in config
    names = set(load_file(str(sglang / "model.safetensors")))
    assert "midlayer.self_attn.q_proj.weight" in names and not any(n.startswith("layers.") for n in names)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert any("[1, 2, 3]" in n and "[0, 1, 2]" in n for n in notes)
    assert head_format.head_layout(sglang) == "sglang" and head_format.head_layout(src) == "speculators"

    head, expected, expected_state = logits(src, target)
    back = tmp_path / "back"
    eagle3.convert_head(sglang, back, "speculators")
    for directory in (sglang, back):
        converted, got, state = logits(directory, target)
        assert converted.aux_layers == AUX  # the SGLang file's ids read back + 1
        assert torch.equal(got, expected) and torch.equal(state, expected_state)
    assert json.loads((back / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == AUX
    assert json.loads((back / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == "target"


def test_a_run_with_the_sglang_copy_decodes_as_the_speculators_head(tmp_path):
    """Same rounds, same drafts accepted and rejected, at batch 3: the lab runs either layout alike."""
    target = tm.llama(0, layers=4, vocab=16, sharpness=4.0, eos=None)
    src = speculators_head(tmp_path / "head", target)
    eagle3.save_sglang(
        eagle3.load_head(src, target, ["target"], torch.device("cpu"), torch.float32),
        tmp_path / "sglang",
        dtype=torch.float32,
    )
    runs = []
    for head_dir in (src, tmp_path / "sglang"):
        _, results, baseline = decode(with_draft(target_pair(target, 16), str(head_dir)), 3)
        assert [r.output_ids for r in results] == [b.output_ids for b in baseline]
        runs.append(
            [
                [(t.token_id, t.outcome, round(t.p_draft, 6)) for round_ in r.rounds for t in round_.draft_tokens]
                for r in results
            ]
        )
    assert runs[0] == runs[1] and any(runs[0])


def specforge_head(path, target, sglang_ids, embed_noise=1.0):
    """A head as SpecForge saves it: a top-level Llama config, eagle_config ids in SGLang's convention, no
    verifier, `midlayer.*` weights, and an embedding of its own."""
    torch.manual_seed(4)
    t = target.config
    layer = dict(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=t.rms_norm_eps,
    )
    from transformers import LlamaConfig

    head = eagle3.Eagle3Head(
        LlamaConfig(**layer),
        draft_vocab_size=t.vocab_size,
        target_hidden_size=t.hidden_size,
        aux_layers=[j + 1 for j in sglang_ids],
    )
    with torch.no_grad():
        head.embed_tokens.weight.normal_(0, embed_noise)
    state = eagle3.layout_weights(head.state_dict(), "sglang")
    path.mkdir(parents=True)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "num_hidden_layers": 1,
                "tie_word_embeddings": False,
                "draft_vocab_size": t.vocab_size,
                "torch_dtype": "float32",
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": sglang_ids, "use_aux_hidden_state": True},
                **layer,
            }
        )
    )
    return path


def test_a_specforge_head_reads_the_layers_sglang_reads_with_the_targets_embedding(tmp_path, target):
    path = specforge_head(tmp_path / "specforge", target, [0, 1, 2])
    assert head_format.is_head(path) and head_format.head_spec(path).verifier is None
    head = eagle3.load_head(path, target, ["target"], torch.device("cpu"), torch.float32)
    assert head.aux_layers == [1, 2, 3]  # SGLang captures at j + 1: transformers' hidden_states[j + 1]
    assert head.embed_tokens is target.get_input_embeddings()  # SGLang's set_embed: the file's own is not used
    with pytest.raises(DraftLabError, match=r"reads target layers \[0, 1, 3\] in SGLang's convention.*from 0 to 2"):
        eagle3.load_head(
            specforge_head(tmp_path / "deep", target, [0, 1, 3]), target, ["target"], torch.device("cpu"), torch.float32
        )
    # to the speculators layout: a target must be named, and the embedding SGLang never used is dropped
    with pytest.raises(DraftLabError, match="names no target.*pass --verifier MODEL") as err:
        eagle3.convert_head(path, tmp_path / "out", "speculators")
    assert "\n" not in str(err.value)
    notes = eagle3.convert_head(path, tmp_path / "out", "speculators", verifier="target")
    assert "embed_tokens.weight" not in load_file(str(tmp_path / "out" / "model.safetensors"))
    assert any("embed_tokens dropped" in n for n in notes)
    _, expected, _ = logits(path, target)
    _, got, _ = logits(tmp_path / "out", target)
    assert torch.equal(got, expected)


def test_what_sglang_cannot_compute_is_refused_in_one_line(tmp_path, target):
    src = speculators_head(tmp_path / "residual", target)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "norm_before_residual": True}))
    cases = [
        (src, "norm_before_residual"),
        (speculators_head(tmp_path / "fc", target, norm_before_fc=True), "norm_before_fc"),
        (speculators_head(tmp_path / "twice", target, aux=[1, 2, 2]), "captures once"),
        (speculators_head(tmp_path / "embedding", target, aux=[0, 2, 3]), "cannot capture"),
    ]
    for head_dir, says in cases:
        with pytest.raises(DraftLabError, match=says) as err:
            eagle3.convert_head(head_dir, tmp_path / "out", "sglang")
        assert "\n" not in str(err.value) and "serve it with vLLM" in str(err.value)
        assert not (tmp_path / "out").exists()
    del config["norm_before_residual"]  # vLLM reads a missing key as True: so does the lab
    (src / "config.json").write_text(json.dumps(config))
    assert head_format.head_spec(src).norm_before_residual is True
    with pytest.raises(DraftLabError, match="already in the speculators layout"):
        eagle3.convert_head(src, tmp_path / "out", "speculators")


def test_convert_head_cli(tmp_path, target, capsys):
    from app.cli import main

    src = speculators_head(tmp_path / "head", target)
    out = head_format.sglang_dir(src)
    assert main(["convert-head", str(src), "--to", "sglang", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out} (sglang layout)" in printed and "[0, 1, 2]" in printed
    assert main(["convert-head", str(src), "--to", "sglang", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--overwrite" in err
    assert main(["convert-head", str(src), "--to", "sglang", "--out", str(out), "--overwrite"]) == 0
    capsys.readouterr()
    for argv, says in (
        (
            ["convert-head", str(tmp_path), "--to", "sglang", "--out", str(tmp_path / "x")],
            "has no readable config.json",
        ),
        (["convert-head", str(src), "--to", "vllm", "--out", str(tmp_path / "x")], "invalid choice"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err
