"""`draftlab distill` (engine/training/distill.py + app/cli.py): distillation lowers held-out KL, --focus-from weights
the loss toward what an experiment rejected, the output directory loads by path and speculates losslessly, and bad
input ends in one error line (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.cli import main
from engine.decoding.records import ACCEPTED, BONUS, CORRECTION, DISCARDED, REJECTED, DraftToken, PromptResult, Round
from engine.decoding.runs import baseline_decoder, encode_prompts, run_prompts, speculative_decoder
from engine.decoding.sampling import SamplingConfig
from engine.metrics.metrics_oracle import outputs_match
from engine.models.loading import load_pair
from engine.training import data
from engine.training import distill as ds
from storage import open_store
from storage.analysis.focus import focus_profile_weights, focus_weights
from storage.jobs import run_state
from tests import tiny_models as tm
from tests.test_storage import enqueue, record, run_ids

TRAIN = ["t3 t4 t5", "t9 t10", "t20 t21 t22 t23", "t40 t2", "t7 t8 t9 t11", "t30 t31", "t50 t51 t52", "t12"]
VAL = ["t13 t14 t15", "t33 t34", "t60 t61 t5", "t25 t26 t27"]


def _one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err, err
    return errors[0]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(TRAIN) + "\n")
    return str(path)


# --- the engine ----------------------------------------------------------------------------------------------


def test_distillation_lowers_heldout_kl():
    target = tm.llama(0, layers=2, sharpness=4.0)
    draft = tm.noisy_copy(target, seed=1, noise=0.5)
    pair = tm.pair(target, draft)
    cfg = ds.DistillConfig(steps=25, lr=3e-3, max_new_tokens=16, batch_size=4, eval_points=5)
    run = ds.Distiller(pair, TRAIN, VAL, cfg)
    records = [*run.prepare(), *run.train()]
    kinds = [r["kind"] for r in records]
    assert kinds.count("step") == 25 and kinds[-1] == "trained"
    done = records[-1]
    assert done["before"]["lossless"] is True  # the reference continuations are target-only greedy output
    curve = done["curve"]
    assert curve[0]["step"] == 0 and curve[-1]["step"] == 25
    assert curve[-1]["kl"] < 0.5 * done["kl_before"], curve
    # measured again from scratch on the trained draft: the held-out figure agrees with the curve's last point
    after = ds.mean_kl(target, draft, done["validation"], pair.vocab_size, pair.device)
    assert after == pytest.approx(curve[-1]["kl"], rel=1e-4)


def test_batched_samples_are_drawn_from_the_target():
    """The sampled training continuations (decoded many at a time, left-padded) follow p_t: the first sampled token
    of a short and a long prompt sharing batches passes a chi-square test against the target's own next-token
    distribution (padding that leaked into attention or positions would shift the short prompt's); continuations
    end at EOS (kept) or at max_new_tokens; the same seed gives the same data, another seed other data."""
    from tests.test_engine_sampling import chi2_pvalue

    target = tm.llama(0, layers=2, sharpness=2.0)
    pair = tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.5))
    short, long = "t9", "t3 t4 t5 t6 t7 t8 t10"
    # a model's own generation defaults (as a hub model's generation_config.json sets them) must not apply: here
    # they would forbid the short prompt's most likely next token and cut the tail
    with torch.no_grad():
        top = int(target(input_ids=pair.tokenizer(short, return_tensors="pt").input_ids).logits[0, -1].argmax())
    target.generation_config.update(top_k=3, min_p=0.2, suppress_tokens=[top])
    n = 1200
    seqs = list(data.sample_batched(pair, [short, long] * n, 3, seed=5, batch=64))
    assert len(seqs) == 2 * n
    for s in seqs:
        assert 1 <= len(s.continuation) <= 3
        assert len(s.continuation) == 3 or s.continuation[-1] == tm.EOS
        assert tm.EOS not in s.continuation[:-1]
    for i, prompt in enumerate((short, long)):
        ids = pair.tokenizer(prompt, return_tensors="pt").input_ids
        assert seqs[i].prompt_ids == ids[0].tolist()
        with torch.no_grad():
            p = target(input_ids=ids).logits[0, -1].softmax(-1).double()
        observed = torch.bincount(torch.tensor([s.continuation[0] for s in seqs[i::2]]), minlength=len(p))
        assert chi2_pvalue(observed.double().numpy(), p.numpy()) > 1e-3, prompt
    again = [s.continuation for s in data.sample_batched(pair, [short, long] * n, 3, seed=5, batch=64)]
    assert again == [s.continuation for s in seqs]
    other = [s.continuation for s in data.sample_batched(pair, [short, long] * n, 3, seed=6, batch=64)]
    assert other != again
    assert target.generation_config.top_k == 3  # and the model's own settings are left as they were


def test_greedy_positions_follow_the_speculative_rounds():
    """A draft position per continuation token, as greedy speculation with k=2 would assign it."""
    seq = ds.Sequence([5], [7, 8, 9, 10, 11, 12])

    class Fixed(torch.nn.Module):  # predicts the continuation except at continuation index 1 and 5
        def forward(self, input_ids):
            wrong = {1, 5}
            logits = torch.zeros(*input_ids.shape, 16)
            for j, tok in enumerate(seq.continuation):
                logits[0, j, (tok + 1) if j in wrong else tok] = 1.0
            return type("Out", (), {"logits": logits})()

    ds.greedy_positions(Fixed(), [seq], 16, 2, "cpu")
    # round 1: pos1 ok (idx0), pos2 wrong (idx1) -> next round at idx2: pos1 ok, pos2 ok -> bonus idx4;
    # round 3 at idx5: pos1 wrong
    assert seq.positions == [1, 2, 1, 2, ds.BONUS, 1]


def test_assign_weights_raise_the_focused_type():
    seqs = [ds.Sequence([0], [1, 2, 3, 4])]
    seqs[0].positions = [1, 2, 3, 4]

    class Typer:  # token 2 and 4 are whitespace, the others code
        def describe(self, token):
            return ("", "whitespace" if token in (2, 4) else "code")

    plain = ds.assign_weights(seqs, Typer(), None, None)
    assert seqs[0].weights.tolist() == [1.0, 1.0, 1.0, 1.0] and plain["by_type"]["code"]["mean_weight"] == 1.0
    summary = ds.assign_weights(seqs, Typer(), {"whitespace": 3.0, "code": 1.0}, {1: 1.0, 2: 1.0})
    w = seqs[0].weights.tolist()
    assert w[1] == w[3] > 1 > w[0] == w[2] and sum(w) == pytest.approx(4.0)
    assert summary["by_type"]["whitespace"]["mean_weight"] > summary["by_type"]["code"]["mean_weight"]


# --- --focus-from ---------------------------------------------------------------------------------------------


def _round(prompt_index, index, k, accepted, types):
    drafts = [
        DraftToken(
            i + 1,
            10 + i,
            f"t{i}",
            types[i],
            0.5,
            0.5,
            0.5,
            0.1,
            ACCEPTED if i < accepted else REJECTED if i == accepted else DISCARDED,
        )
        for i in range(k)
    ]
    kinds = [ACCEPTED] * accepted + [BONUS if accepted == k else CORRECTION]
    return Round(prompt_index, index, k, accepted, list(range(accepted + 1)), kinds, 0.002, 0.01, k, drafts)


def _crafted_experiment(store) -> tuple[int, int]:
    """k=4, 2 prompts x 40 rounds: code drafts are accepted, whitespace drafts rejected wherever they come; a
    whitespace draft sits at position 3 in most rounds, so position 3 is rejected more than positions 1-2."""
    eid = enqueue(store, ks=(4,), prompts=2)
    ids = run_ids(store, eid)
    spec_results, base_results = [], []
    for p in range(2):
        rounds = []
        for n in range(40):
            if n % 4 == 3:  # a whitespace draft at position 1, rejected
                rounds.append(_round(p, n, 4, 0, ["whitespace", "code", "code", "code"]))
            else:  # two accepted code drafts, a rejected whitespace draft at position 3
                rounds.append(_round(p, n, 4, 2, ["code", "code", "whitespace", "code"]))
        output = [t for r in rounds for t in r.emitted_ids]
        spec_results.append(PromptResult(p, f"p{p}", output, "x", len(rounds) * 0.012, rounds=rounds))
        base_results.append(
            PromptResult(
                p, f"p{p}", output, "x", len(output) * 0.01, decode_steps=len(output), decode_seconds=len(output) * 0.01
            )
        )
    assert sorted(run_state.claim_group(store, eid, "w")) == sorted(ids.values())
    for rid, kind, results in (
        (ids[("baseline", None)], "baseline", base_results),
        (ids[("speculative", 4)], "speculative", spec_results),
    ):
        run_state.start_run(store, rid, 2, "cpu")
        for result in results:
            record(store, rid, kind, result)
        run_state.finish_run(store, rid, "done")
    return eid, ids[("speculative", 4)]


@pytest.fixture
def crafted_db(tmp_path):
    url = f"sqlite:///{tmp_path / 'focus.db'}"
    store = open_store(url)
    eid, rid = _crafted_experiment(store)
    yield url, store, eid, rid
    store.dispose()


def test_focus_weights_raise_what_the_experiment_rejected(crafted_db):
    _, store, eid, rid = crafted_db
    focus = focus_weights(store, eid)
    assert focus["run_id"] == rid and focus["k"] == 4
    assert focus["acceptance_by_type"]["whitespace"] == 0.0 and focus["acceptance_by_type"]["code"] == 1.0
    tw, pw = focus["type_weights"], focus["position_weights"]
    assert tw["whitespace"] > 1.0 > tw["code"]
    assert pw[3] > pw[1] and pw[3] > 1.0
    for w in [*tw.values(), *pw.values()]:
        assert 0.25 <= w <= 4.0
    # normalised to mean 1 over the verified drafts (before clipping), floored so nothing weighs zero
    assert focus_profile_weights({"a": (0.5, 10), "b": (0.5, 30)}) == {"a": 1.0, "b": 1.0}
    assert focus_profile_weights({"a": (1.0, 1), "b": (0.0, 1000)})["a"] == 0.25


def test_focus_from_unknown_experiment_is_one_error_line(model_dirs, prompts_file, tmp_path, capsys, crafted_db):
    url = crafted_db[0]
    code = main(
        [
            "distill",
            "--target",
            model_dirs["target"],
            "--draft",
            model_dirs["draft"],
            "--prompts",
            prompts_file,
            "--steps",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--focus-from",
            "999",
            "--db",
            url,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    line = _one_error_line(err)
    assert "no experiment 999" in line and "draftlab list" in line


# --- the command, end to end ---------------------------------------------------------------------------------


def test_cli_distill_writes_a_model_that_loads_and_speculates_losslessly(
    model_dirs, prompts_file, tmp_path, capsys, crafted_db
):
    url, _, eid, _ = crafted_db
    out = tmp_path / "distilled"
    code = main(
        [
            "distill",
            "--target",
            model_dirs["target"],
            "--draft",
            model_dirs["draft"],
            "--prompts",
            prompts_file,
            "--steps",
            "15",
            "--lr",
            "3e-3",
            "--max-new-tokens",
            "12",
            "--batch-size",
            "4",
            "--out",
            str(out),
            "--focus-from",
            str(eid),
            "--db",
            url,
            "--json",
        ]
    )
    stdout, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(stdout)
    assert set(doc) == {"out", "steps", "kl_before", "kl_after", "alpha_before", "alpha_after"}
    assert doc["steps"] == 15 and Path(doc["out"]) == out
    assert doc["kl_after"] < doc["kl_before"]
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    card = (out / "MODEL_CARD.md").read_text()
    assert "draftlab distill" in card and f"--focus-from {eid}" in card and "greedy" in card
    assert "the same file as training" in card  # a prompt file is its own validation set, and the card says so
    assert "whitespace" in card  # the focus weights used
    saved = json.loads((out / "distill.json").read_text())
    assert saved["focus"]["type_weights"]["whitespace"] > 1.0 and saved["lossless_after"] is True
    assert "Traceback" not in err

    # the directory loads by path as a draft and greedy speculation equals target-only decoding
    pair = load_pair(model_dirs["target"], str(out), "cpu")
    cfg = SamplingConfig(0.0, 0, 1.0, 0, 12)
    ids = encode_prompts(pair, TRAIN, 12)
    base = list(run_prompts(baseline_decoder(pair, cfg), TRAIN, ids))
    spec = list(run_prompts(speculative_decoder(pair, cfg, 3), TRAIN, ids))
    assert outputs_match(spec, base)


def test_cli_distill_interrupted_continues_from_its_checkpoint_without_repeating_a_step(
    model_dirs, prompts_file, tmp_path, capsys, monkeypatch
):
    """Ctrl-C at step 4 of 8 (a checkpoint every step, so step 3's is there; step 4's state is not saved: an
    interrupt can land mid-step), then the same command: it continues at step 4, and the saved model is the one
    an uninterrupted run writes, bit for bit."""
    from safetensors.torch import load_file

    import app.training.distill_driver as driver

    monkeypatch.setattr(driver, "CHECKPOINT_SECONDS", 0.0)

    def command(out):
        return [
            "distill",
            "--target",
            model_dirs["target"],
            "--draft",
            model_dirs["draft"],
            "--prompts",
            prompts_file,
            "--steps",
            "8",
            "--lr",
            "3e-3",
            "--max-new-tokens",
            "10",
            "--batch-size",
            "3",
            "--out",
            str(out),
            "--json",
        ]

    assert main(command(tmp_path / "straight")) == 0
    capsys.readouterr()
    original = driver.checkpoint

    def interrupt_at_step_4(run, ckpt):
        if run.step == 4:
            raise KeyboardInterrupt
        return original(run, ckpt)

    out = tmp_path / "interrupted"
    monkeypatch.setattr(driver, "checkpoint", interrupt_at_step_4)
    assert main(command(out)) == 130
    line = _one_error_line(capsys.readouterr().err)
    assert "interrupted at step 4" in line and "holds step 3" in line and "same command" in line
    assert not (out / "model.safetensors").exists() and (out / ".checkpoint").is_dir()

    monkeypatch.setattr(driver, "checkpoint", original)
    steps_taken = []
    train = ds.Distiller.train

    def counted(self):
        for rec in train(self):
            if rec["kind"] == "step":
                steps_taken.append(rec["step"])
            yield rec

    monkeypatch.setattr(ds.Distiller, "train", counted)
    assert main(command(out)) == 0
    err = capsys.readouterr().err
    assert "continuing from the checkpoint" in err and "at step 3 of 8" in err
    assert steps_taken == [4, 5, 6, 7, 8]  # none repeated, none skipped
    assert not (out / ".checkpoint").exists()  # gone once the model is saved
    resumed, straight = load_file(out / "model.safetensors"), load_file(tmp_path / "straight" / "model.safetensors")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


# --- bad input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["mismatched tokenizers", "steps 0", "negative steps", "out is a file", "out under a file", "lr 0"]
)
def test_bad_input_is_one_error_line(case, model_dirs, prompts_file, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    argv = {
        "target": model_dirs["target"],
        "draft": model_dirs["draft"],
        "steps": "3",
        "out": str(tmp_path / "o"),
        "lr": "1e-3",
    }
    needle = {
        "mismatched tokenizers": "tokenizers disagree",
        "steps 0": "--steps: '0' is not a whole number from 1",
        "negative steps": "--steps: '-5' is not a whole number from 1",
        "out is a file": "is a file",
        "out under a file": "not writable",
        "lr 0": "--lr: '0' is not a positive number",
    }[case]
    if case == "mismatched tokenizers":
        argv["draft"] = model_dirs["alien"]
    elif case == "steps 0":
        argv["steps"] = "0"
    elif case == "negative steps":
        argv["steps"] = "-5"
    elif case == "out is a file":
        argv["out"] = str(blocker)
    elif case == "out under a file":
        argv["out"] = str(blocker / "sub")
    else:
        argv["lr"] = "0"
    code = main(
        [
            "distill",
            "--target",
            argv["target"],
            "--draft",
            argv["draft"],
            "--prompts",
            prompts_file,
            "--steps",
            argv["steps"],
            "--out",
            argv["out"],
            "--lr",
            argv["lr"],
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)


# --- the shipped distilled demo draft ------------------------------------------------------------------------


def test_shipped_distilled_draft_loads_by_demo_name_and_is_lossless():
    from engine import zoo
    from engine.text.prompt_sets import load_prompts

    path = zoo.resolve("demo-draft-distilled")
    assert path is not None, "engine/zoo/demo-draft-distilled is not built"
    card = (path / "MODEL_CARD.md").read_text()
    assert "draftlab distill --target demo-target --draft demo-draft --prompts code+english+math+mixed+chinese" in card
    # same size as demo-draft, fp16 like it; every shipped weight file together stays within 30 MB
    assert (path / "model.safetensors").stat().st_size == (
        zoo.ZOO_DIR / "demo-draft" / "model.safetensors"
    ).stat().st_size
    assert json.loads((path / "config.json").read_text())["dtype"] == "float16"
    assert sum(p.stat().st_size for p in zoo.ZOO_DIR.glob("*/model.safetensors")) <= 30 * 2**20

    pair = load_pair("demo-target", "demo-draft-distilled", "cpu")
    prompts = load_prompts("code:validation")[:2]
    cfg = SamplingConfig(0.0, 0, 1.0, 0, 16)
    ids = encode_prompts(pair, prompts, 16)
    base = list(run_prompts(baseline_decoder(pair, cfg), prompts, ids))
    spec = list(run_prompts(speculative_decoder(pair, cfg, 4), prompts, ids))
    assert outputs_match(spec, base)
