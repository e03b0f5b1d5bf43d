"""Training EAGLE-3 heads (engine/training/head_training.py): the training-time test computes exactly what the head
drafts at inference (its chain from every root, through Eagle3Head.forward with a KV cache, as Eagle3Drafter runs it),
the simulated acceptance equals greedy speculation's through the engine's loop, and a short training raises acceptance
on a tiny target."""

import pytest
import torch
from transformers import DynamicCache

from engine.models import eagle3
from engine.training import head_training as ht
from tests import tiny_models as tm
from tests.test_distill import crafted_db as crafted_db  # a fixture (the experiment --focus-from reads), found by name

AUX = [1, 2, 3]


def random_head(target, seed=0, draft_vocab=None, norm_before_fc=False):
    vocab = target.config.vocab_size
    torch.manual_seed(seed)
    ids = torch.randperm(vocab)[: draft_vocab or vocab]
    head = eagle3.new_head(target, AUX, ids, "target", norm_before_fc=norm_before_fc)
    with torch.no_grad():  # a head whose every part matters (new_head starts some parts as the target's)
        for name, p in head.named_parameters():
            if "embed" not in name:
                p.add_(torch.randn_like(p) * 0.3)
    return head.eval()


def inference_chain(head, ids, states, root, steps):
    """The drafts' logits from `root` the way Eagle3Drafter computes them: entries 0..root fed with the target's
    states in one forward (cached), then one forward per draft with the previous step's pre-norm output."""
    cache = DynamicCache()
    out = head(ids[:, 1 : root + 2], head.combine(states[:, : root + 1]), cache=cache)
    logits, state = [out.logits[:, -1]], out.hidden_states[1][:, -1:]
    for j in range(1, steps):
        token = ids[:, root + 1 + j : root + 2 + j]
        out = head(token, state, cache=cache, position_ids=torch.tensor([[root + j]]))
        logits.append(out.logits[:, -1])
        state = out.hidden_states[1][:, -1:]
    return logits


@pytest.mark.parametrize("draft_vocab,norm_before_fc", [(None, False), (40, True)])
def test_ttt_logits_equal_the_heads_inference_chain_from_every_root(draft_vocab, norm_before_fc):
    target = tm.llama(0, layers=4, vocab=64, eos=None).eval()
    head = random_head(target, draft_vocab=draft_vocab, norm_before_fc=norm_before_fc)
    ids = torch.randint(0, 64, (1, 14), generator=torch.Generator().manual_seed(1))
    states, _ = ht.target_features(target, AUX, ids, 64)
    steps = 4
    with torch.no_grad():
        trained = ht.ttt_logits(head, ids, states, steps)
        for root in range(0, ids.shape[1] - steps - 1):
            for j, logits in enumerate(inference_chain(head, ids, states, root, steps)):
                expect = logits[0][head.target_ids()]  # the inference logits over the draft vocabulary
                torch.testing.assert_close(trained[j][0, root], expect, rtol=1e-4, atol=1e-4)


def test_acceptance_length_is_one_plus_the_chained_survival():
    got = ht.acceptance([10, 10], [8, 5], [10, 8], [8, 4])
    assert got["per_position"] == [0.8, 0.5]
    assert got["acceptance_length"] == pytest.approx(1 + 0.8 + 0.4)
    assert got["accuracy"] == [0.8, 0.5]


def test_draftlab_train_head_writes_a_head_that_drafts_for_its_target(tmp_path, model_dirs, capsys):
    """`draftlab train-head` end to end on the tiny target: SPEC's --json keys, the speculators directory with its
    card (and why there is no SGLang copy of a head reading the embedding), a head that loads through `--draft OUT` for
    that target and decodes losslessly, and an --out that holds something else refused in one line before any work."""
    import json

    from app.cli import main
    from engine.config import head_format
    from engine.decoding.runs import baseline_decoder, encode_prompts, speculative_decoder
    from engine.decoding.sampling import SamplingConfig
    from engine.models.loading import load_pair

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t5 t6 t7\nt9 t3 t22 t40\nt12 t13\nt30 t31 t32\n")
    out = tmp_path / "head"
    assert (
        main(
            [
                "train-head",
                "--target",
                model_dirs["target"],
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                "--steps",
                "6",
                "--ttt-steps",
                "2",
                "--max-new-tokens",
                "8",
                "--batch-size",
                "2",
                "--aux-layers",
                "0,1",
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "out",
        "steps",
        "aux_layers",
        "draft_vocab_size",
        "alpha_before",
        "alpha_after",
        "acceptance_length_after",
        "per_position_acceptance_after",
    }
    assert (doc["steps"], doc["aux_layers"], len(doc["per_position_acceptance_after"])) == (6, [0, 1], 2)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [0, 1]
    assert config["speculators_config"]["verifier"]["name_or_path"] == model_dirs["target"]
    card = (out / "MODEL_CARD.md").read_text()
    # aux id 0 reads the embedding, which SGLang cannot capture: no SGLang copy, and the card says why
    assert head_format.head_layout(head_format.sglang_dir(out)) is None and "not written" in card and "-1" in card
    assert "draftlab train-head --target" in card and "Aux-layer ids `[0, 1]`" in card
    import shlex

    from app.cli import build_parser

    command = json.loads((out / "train_head.json").read_text())["command"]  # the card's command: one the CLI takes
    assert build_parser().parse_args(shlex.split(command)[1:]).draft_vocab_size == 0  # the default: left out
    assert not (out / ".checkpoint").exists()

    pair = load_pair(model_dirs["target"], str(out), "cpu", "float32")
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=8)
    ids = encode_prompts(pair, ["t5 t6 t7"], 8)[0]
    spec = speculative_decoder(pair, cfg, 2, drafter="eagle3").generate("t5 t6 t7", ids, 0)
    assert spec.output_ids == baseline_decoder(pair, cfg).generate("t5 t6 t7", ids, 0).output_ids

    capsys.readouterr()
    assert (
        main(
            [
                "train-head",
                "--target",
                model_dirs["target"],
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                "--steps",
                "2",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out") and "not empty" in err and "\n" not in err


def focus_tables_oracle(kinds, prompt_lengths, steps, type_weights, position_weights):
    """The test oracle: focus_tables written as the plain loop over (sequence, step, root) it vectorises."""
    pos_w = {int(k): float(v) for k, v in position_weights.items()}
    by_type, by_position, raw = {}, {}, []
    for seq_kinds, p_len in zip(kinds, prompt_lengths):
        length = len(seq_kinds)
        table = [[1.0] * (length - 1) for _ in range(steps)]
        for j in range(steps):
            for root in range(length - 1):
                predicted = root + 2 + j
                if p_len <= predicted < length:
                    w = float(type_weights.get(seq_kinds[predicted], 1.0)) * pos_w.get(j + 1, 1.0)
                    table[j][root] = w
                    by_type.setdefault(seq_kinds[predicted], []).append(w)
                    by_position.setdefault(j + 1, []).append(w)
        raw.append(table)
    values = [x for v in by_type.values() for x in v]
    mean = sum(values) / len(values)
    return (
        [[[x / mean for x in row] for row in t] for t in raw],
        {ty: (len(v), sum(v) / len(v) / mean) for ty, v in by_type.items()},
        {j: (len(v), sum(v) / len(v) / mean) for j, v in by_position.items()},
    )


@pytest.mark.parametrize("seed", range(5))
def test_focus_tables_equal_the_plain_loop_over_every_root_and_step(seed):
    rng = torch.Generator().manual_seed(seed)
    types = ["word", "punct", "digit", "space"]
    kinds, prompt_lengths = [], []
    for _ in range(int(torch.randint(1, 6, (1,), generator=rng))):
        length = int(torch.randint(2, 40, (1,), generator=rng))
        kinds.append([types[int(i)] for i in torch.randint(0, 4, (length,), generator=rng)])
        prompt_lengths.append(int(torch.randint(0, length, (1,), generator=rng)))
    kinds.append(["word", "punct", "digit", "word", "word"])  # every type predicted at least once
    prompt_lengths.append(1)
    type_w = {"punct": 3.0, "digit": 0.5}
    pos_w = {"1": 2.0, "3": 0.25}
    tables, summary = ht.focus_tables(kinds, prompt_lengths, 3, type_w, pos_w)
    oracle_tables, oracle_types, oracle_positions = focus_tables_oracle(kinds, prompt_lengths, 3, type_w, pos_w)
    for got, want in zip(tables, oracle_tables, strict=True):
        assert got.shape == (3, len(want[0]))
        assert torch.allclose(got, torch.tensor(want), rtol=1e-5)
    assert {
        ty: (v["tokens"], pytest.approx(v["mean_weight"], rel=1e-6)) for ty, v in summary["by_type"].items()
    } == oracle_types
    assert {
        j: (v["tokens"], pytest.approx(v["mean_weight"], rel=1e-6)) for j, v in summary["by_position"].items()
    } == oracle_positions
    # the profile is what it weighs: in the last sequence, step 0 (position 1) from root 0 predicts its "digit"
    # (weight 0.5), from root 1 a "word" (1); position 1 weighs twice position 2
    last = tables[-1]
    assert last[0, 0] / last[0, 1] == pytest.approx(0.5 / 1.0)  # digit vs word, both at position 1
    assert last[0, 1] / last[1, 0] == pytest.approx(2.0)  # a "word" at position 1 against one at position 2


def test_train_head_focus_from_weighs_what_the_experiment_rejected(tmp_path, model_dirs, capsys, crafted_db):
    """`draftlab train-head --focus-from`: the experiment's rejection profile (whitespace drafts rejected, code ones
    accepted) becomes the head's loss weights; the card and train_head.json say which and how much."""
    import json

    from app.cli import main

    url, _, eid, rid = crafted_db
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t5 t6 t7\nt9 t3 t22 t40\nt12 t13\n")
    out = tmp_path / "head"
    assert (
        main(
            [
                "train-head",
                "--target",
                model_dirs["target"],
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                "--steps",
                "3",
                "--ttt-steps",
                "2",
                "--max-new-tokens",
                "8",
                "--batch-size",
                "2",
                "--aux-layers",
                "0,1",
                "--device",
                "cpu",
                "--focus-from",
                str(eid),
                "--db",
                url,
            ]
        )
        == 0
    )
    capsys.readouterr()
    saved = json.loads((out / "train_head.json").read_text())
    assert saved["focus"]["experiment_id"] == eid and saved["focus"]["run_id"] == rid
    assert saved["focus"]["type_weights"]["whitespace"] > 1.0 > saved["focus"]["type_weights"]["code"]
    by_type = saved["weights"]["by_type"]
    assert by_type and all(v["tokens"] > 0 for v in by_type.values())
    for summary in by_type, saved["weights"]["by_position"]:  # mean 1 over the weighted entries, either way
        assert sum(v["tokens"] * v["mean_weight"] for v in summary.values()) == pytest.approx(
            sum(v["tokens"] for v in summary.values())
        )
    position = saved["weights"]["by_position"]  # the profile rejected position 1 more than position 2
    assert position["1"]["mean_weight"] > position["2"]["mean_weight"]
    card = (out / "MODEL_CARD.md").read_text()
    assert f"from experiment {eid}'s run {rid}" in card and f"--focus-from {eid}" in card
