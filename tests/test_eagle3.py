"""EAGLE-3 heads as drafts (engine/models/eagle3.py, Eagle3Drafter): a random head in the speculators format, written to
a tmp dir for a tiny 4-layer Llama target, loads through `--draft DIR`, drafts from the target's own hidden states
(exactly `hidden_states[i]` at the committed positions, from the verify forwards), stays lossless greedy at batch 1 and
3 and under sampling (chi-squared), and a head for another target is refused in one line."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from engine.decoding import runs
from engine.decoding.drafting import Eagle3Drafter, make_drafter
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.models.eagle3 import Eagle3Head, is_head
from engine.models.loading import LoadedModel, ModelPair, with_draft
from tests import tiny_models as tm
from tests.meaning import missing
from tests.test_engine_sampling import NEW, V, chi2_pvalue, exact_joint

AUX = [1, 2, 3]  # of the 4-layer target: ids i = the input of decoder layer i (vLLM's convention)
# The speculators / vLLM weight names (vllm/model_executor/models/llama_eagle3.py loads exactly these).
SPECULATORS_WEIGHTS = {
    "embed_tokens.weight",
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "layers.0.input_layernorm.weight",
    "layers.0.hidden_norm.weight",
    "layers.0.post_attention_layernorm.weight",
    *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}


def write_head(path, target, seed: int = 5, verifier: str = "target", aux=AUX, draft_vocab: int | None = None):
    """A random EAGLE-3 head for `target` saved in the speculators format (config.json + model.safetensors)."""
    t = target.config
    layer = dict(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=getattr(t, "rms_norm_eps", getattr(t, "layer_norm_eps", 1e-5)),
        model_type="llama",
    )
    draft_vocab = draft_vocab or t.vocab_size
    torch.manual_seed(seed)
    head = Eagle3Head(
        LlamaConfig(**layer), draft_vocab_size=draft_vocab, target_hidden_size=t.hidden_size, aux_layers=aux
    )
    with torch.no_grad():
        head.lm_head.weight.mul_(20.0)  # peaked drafts, as the tiny targets are
        kept = torch.randperm(t.vocab_size)[:draft_vocab].sort().values  # the draft vocabulary: target ids
        head.d2t.copy_(kept - torch.arange(draft_vocab))
        head.t2d.zero_().index_fill_(0, kept, True)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            {
                "speculators_model_type": "eagle3",
                "architectures": ["Eagle3Speculator"],
                "transformer_layer_config": layer,
                "draft_vocab_size": draft_vocab,
                "target_hidden_size": t.hidden_size,
                "norm_before_residual": False,
                "eagle_aux_hidden_state_layer_ids": aux,
                "speculators_config": {
                    "algorithm": "eagle3",
                    "default_proposal_method": "greedy",
                    "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                    "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
                },
            }
        )
    )
    return str(path)


def target_pair(target, vocab: int) -> ModelPair:
    tok = tm.tokenizer(vocab, eos=False)
    return ModelPair(LoadedModel("target", "memory", target, tok), None, torch.device("cpu"), torch.float32, len(tok))


@pytest.fixture(scope="module", params=[(4, None), (64, 40)], ids=["vocab4", "vocab64-draft40"])
def head_pair(request, tmp_path_factory):
    """The target with its head: vocabulary 4 (the head's drafts are often accepted) or 64 with a 40-token draft
    vocabulary (nearly every draft rejected, d2t mapping)."""
    vocab, draft_vocab = request.param
    target = tm.llama(0, layers=4, vocab=vocab, sharpness=4.0, eos=None)
    head_dir = write_head(tmp_path_factory.mktemp("head") / "head", target, draft_vocab=draft_vocab)
    return with_draft(target_pair(target, vocab), head_dir)


PROMPTS = ["t2 t3 t0", "t1", "t0 t2 t3 t1 t2", "t3 t3"]  # distinct first tokens


def decode(pair, batch: int, k: int = 3, new: int = 20, temperature: float = 0.0):
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=new, seed=2)
    ids = runs.encode_prompts(pair, PROMPTS, new)
    decoder = runs.speculative_decoder(pair, cfg, k, drafter="eagle3")
    results = [r for chunk in runs.run_batches(decoder, PROMPTS, ids, batch) for r in chunk]
    baseline = [r for chunk in runs.run_batches(runs.baseline_decoder(pair, cfg), PROMPTS, ids, batch) for r in chunk]
    return decoder, results, baseline


def test_head_directory_loads_as_a_head_with_the_speculators_weight_names(head_pair):
    head = head_pair.draft.model
    assert is_head(head_pair.draft.name) and isinstance(head, Eagle3Head)
    assert set(head.state_dict()) == SPECULATORS_WEIGHTS
    assert head.aux_layers == AUX


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_rows_equal_target_only_decoding(head_pair, batch):
    decoder, results, baseline = decode(head_pair, batch)
    assert isinstance(decoder.drafter, Eagle3Drafter)
    for spec, base in zip(results, baseline):
        assert spec.output_ids == base.output_ids
    drafted = [t for r in results for round_ in r.rounds for t in round_.draft_tokens]
    rejected = sum(t.outcome == "rejected" for t in drafted)
    assert rejected > 0 and len(drafted) > 3 * len(PROMPTS)  # rejections, and the head drafts after the prefill
    assert all(r.rounds[0].k == 0 for r in results)  # the prefill round: no states to draft from yet


def test_rounds_accept_several_drafts_on_a_small_vocabulary(tmp_path):
    """Vocabulary 4: a random head's drafts are accepted often enough that rounds accept several, so the states of
    accepted drafts are fed too (the test above checks them)."""
    target = tm.llama(0, layers=4, vocab=4, sharpness=4.0, eos=None)
    pair = with_draft(target_pair(target, 4), write_head(tmp_path / "head", target))
    _, results, _ = decode(pair, 3, new=40)
    accepted = [round_.accepted for r in results for round_ in r.rounds]
    assert max(accepted) >= 2


@pytest.mark.parametrize("batch", [1, 3])
def test_states_fed_to_the_head_are_the_targets_hidden_states_at_the_committed_positions(head_pair, batch, monkeypatch):
    """Every state the head reads equals the target's `hidden_states[i]` (i in the head's aux ids, concatenated)
    at its position, from a full forward without a cache, and each prompt's positions are fed once, in order."""
    fed = {}  # prompt (its first token: distinct) -> list of (position, state)
    original = Eagle3Drafter.draft_inputs

    def spy(self, seqs):
        before = list(self.cached)
        states = [torch.cat(p) for p in self.pending]
        ids, valid = original(self, seqs)
        for seq, c, h in zip(seqs, before, states):
            fed.setdefault(int(seq[0]), []).append((seq.clone(), c, h.clone()))
        return ids, valid

    monkeypatch.setattr(Eagle3Drafter, "draft_inputs", spy)
    decode(head_pair, batch)
    target = head_pair.target.model
    assert len(fed) == len(PROMPTS)
    for calls in fed.values():
        expect_from = 0
        for seq, c, h in calls:
            expect_from = 0 if c == 0 else expect_from  # a new decode of the prompt (the warm-up ran it first)
            assert c == expect_from and h.shape[0] == seq.shape[0] - 1 - c  # positions c .. L - 2, none skipped
            with torch.no_grad():
                full = target(seq[None], output_hidden_states=True).hidden_states
            truth = torch.cat([full[i][0] for i in AUX], -1)[c : seq.shape[0] - 1]
            torch.testing.assert_close(h, truth, rtol=1e-4, atol=1e-5)
            expect_from = seq.shape[0] - 1


def test_sampled_outputs_follow_the_targets_distribution(tmp_path):
    """Chi-squared against the target's exact joint over 3 new tokens (as tests/test_engine_sampling.py does)."""
    target = tm.llama(0, layers=4, vocab=V, hidden=16, sharpness=25.0, eos=None)
    pair = with_draft(target_pair(target, V), write_head(tmp_path / "head", target, draft_vocab=4))
    prompt_ids = runs.encode_prompts(pair, ["t2 t3"], NEW)[0]
    decoder = runs.speculative_decoder(
        pair, SamplingConfig(temperature=1.0, max_new_tokens=NEW, seed=11), 2, drafter="eagle3"
    )
    counts = np.zeros(V**NEW)
    accepted = 0
    for i in range(2000):
        result = decoder.generate("t2 t3", prompt_ids, i)
        counts[np.ravel_multi_index(result.output_ids, (V,) * NEW)] += 1
        accepted += sum(r.accepted for r in result.rounds)
    assert accepted > 200  # the head's drafts take part
    assert chi2_pvalue(counts, exact_joint(target, prompt_ids)) > 1e-3


def test_a_head_for_another_target_is_refused_in_one_line(tmp_path):
    target = tm.llama(0, layers=4, vocab=8, eos=None)
    pair = target_pair(target, 8)
    with pytest.raises(DraftLabError) as err:
        with_draft(pair, write_head(tmp_path / "other", target, verifier="meta-llama/Llama-3.1-8B-Instruct"))
    assert not missing(str(err.value), "'meta-llama/Llama-3.1-8B-Instruct'", "'target'"), err.value  # both targets
    assert "\n" not in str(err.value)
    with pytest.raises(DraftLabError, match="reads target layers \\[1, 2, 4\\].*decoder layers 0..3"):
        with_draft(pair, write_head(tmp_path / "deep", target, aux=[1, 2, 4]))
    wider = tm.llama(0, layers=4, vocab=8, hidden=16, eos=None)
    with pytest.raises(DraftLabError, match=r"width 32\b.*target's.*\b16\b"):
        with_draft(target_pair(wider, 8), write_head(tmp_path / "wide", target))


def test_drafter_and_draft_kind_must_agree(head_pair):
    cfg = SamplingConfig()
    with pytest.raises(DraftLabError, match="the draft is an EAGLE-3 head.*use --drafter eagle3"):
        make_drafter("model", draft_model=head_pair.draft.model, vocab_size=8, k=2, cfg=cfg)
    with pytest.raises(DraftLabError, match=r"'eagle3'.*EAGLE-3 head.*causal LM.*--drafter model"):
        make_drafter("eagle3", draft_model=head_pair.target.model, vocab_size=8, k=2, cfg=cfg)


def test_draftlab_run_drafts_with_a_head_directory(tmp_path, model_dirs, capsys):
    """`draftlab run --draft HEAD_DIR --drafter eagle3`: the head loads by its speculators config (never as a causal
    LM), its verifier is the --target path, and the run is lossless."""
    from transformers import AutoModelForCausalLM

    from tests.cli_runs import run_json

    target = AutoModelForCausalLM.from_pretrained(model_dirs["target"])  # 2 layers: aux ids 0, 1, 1
    head_dir = write_head(tmp_path / "head", target, verifier=model_dirs["target"], aux=[0, 1, 1])
    doc, _ = run_json(
        tmp_path, {**model_dirs, "draft": head_dir}, capsys, "--drafter", "eagle3", "--k", "3", "--max-new-tokens", "12"
    )
    (run,) = doc["runs"]
    assert (run["drafter"], run["draft"], run["status"]) == ("eagle3", head_dir, "done")
    assert run["outputs_match_baseline"] is True and run["proposed"] > 0 and run["rejected"] > 0
    assert len(run["per_position_acceptance"]) == 3  # every breakdown is logged per draft token, as for any drafter


def test_draftlab_run_takes_eagle3_for_a_head_without_drafter(tmp_path, model_dirs, capsys):
    """`draftlab run --draft HEAD_DIR` with no --drafter runs the head as eagle3, in either layout (here a draft
    sweep over a speculators head and a SpecForge one, SGLang ids [0, 0, 0] = hidden_states[1]); a drafter named for
    the other kind of draft (also in a sweep of heads and causal LMs, which without one compares them:
    tests/test_mixed_draft_sweep.py) is one error line, before anything is stored."""
    from transformers import AutoModelForCausalLM

    from app.cli import main
    from storage import open_store
    from storage.records import queries as q
    from tests.cli_runs import run_json
    from tests.test_head_layouts import specforge_head

    target = AutoModelForCausalLM.from_pretrained(model_dirs["target"])  # 2 layers
    heads = [
        write_head(tmp_path / "head", target, verifier=model_dirs["target"], aux=[0, 1, 1]),
        str(specforge_head(tmp_path / "specforge", target, [0, 0, 0])),
    ]
    doc, db = run_json(tmp_path, {**model_dirs, "draft": ",".join(heads)}, capsys, "--k", "3", "--max-new-tokens", "12")
    assert [(r["drafter"], r["draft"], r["status"]) for r in doc["runs"]] == [("eagle3", h, "done") for h in heads]
    assert all(r["outputs_match_baseline"] is True and r["proposed"] > 0 for r in doc["runs"])

    for drafter, draft, says in (
        ("model", heads[1], "drafter 'model' drafts with a causal LM, but the draft"),
        ("heuristic", heads[0], "leave the drafter out (a head drafts as eagle3)"),
        ("eagle3", model_dirs["draft"], "drafter 'eagle3' drafts with an EAGLE-3 head, but the draft"),
        ("eagle3", f"{heads[0]},{model_dirs['draft']}", "drafter 'eagle3' drafts with an EAGLE-3 head, but"),
    ):
        code = main(
            [
                "run",
                "--target",
                model_dirs["target"],
                "--draft",
                draft,
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--db",
                db,
                "--json",
                *(["--drafter", drafter] if drafter else []),
            ]
        )
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1 and says in err, err
    assert len(q.experiment_rows(open_store(db))) == 1  # only the sweep above was stored


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma2", "gemma3", "cohere2", "llama4-chunked"])
def test_a_head_over_each_family_decodes_losslessly_past_its_window_at_batch_1_and_3(tmp_path, family):
    """Lossless per model family and batch size: a head over targets with sliding or chunked attention windows (the
    aux states caught by pre-hooks on their layers, engine/decoding/aux_states.py), prompts and outputs longer than the
    window, rows of different lengths decoded together."""
    from tests.test_engine_sliding import PROMPTS as LONG_PROMPTS
    from tests.test_engine_sliding import build

    target = build(family)
    pair = with_draft(target_pair(target, 64), write_head(tmp_path / "head", target, draft_vocab=40))
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=40)
    ids = runs.encode_prompts(pair, LONG_PROMPTS, 40)
    baseline = [
        r.output_ids
        for chunk in runs.run_batches(runs.baseline_decoder(pair, cfg), LONG_PROMPTS, ids, 1)
        for r in chunk
    ]
    assert max(i.shape[-1] + len(o) for i, o in zip(ids, baseline)) > 16 * 3  # well past the 16-token window
    for batch in (1, 3):
        decoder = runs.speculative_decoder(pair, cfg, 3, drafter="eagle3")
        if (
            family == "llama4-chunked" and batch > 1
        ):  # refused by name at batch > 1 (engine/decoding/attention_masks.py)
            with pytest.raises(DraftLabError, match="run it at batch size 1"):
                list(runs.run_batches(decoder, LONG_PROMPTS, ids, batch))
            continue
        results = [r for chunk in runs.run_batches(decoder, LONG_PROMPTS, ids, batch) for r in chunk]
        assert [r.output_ids for r in results] == baseline, (family, batch)
        assert sum(len(round_.draft_tokens) for r in results for round_ in r.rounds) > 3 * len(LONG_PROMPTS)
