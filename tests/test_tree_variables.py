"""tree_topk and tree_tokens, the token tree's swept variables (SPEC "Token trees"): their flags, bounds and words
(never the sampling top-k), the one-line refusals of a tree that does not fit its run (a drafter that cannot branch,
tree_tokens below k + 1), the link and the queue round trip, the worker's sampling configuration, the baseline that
does not depend on them, and the cheaper tied choice that prefers the smaller tree."""

import pytest

from engine.config.drafter_specs import SPECS
from engine.config.run_config import BASELINE_PARAMETERS, RunConfig
from engine.config.tree_shape import MAX_TREE_TOKENS, MAX_TREE_TOPK, full_tree_nodes, verified_nodes
from engine.config.variables import VARIABLES
from engine.errors import DraftLabError
from tests.meaning import missing


def _make(**given):
    return RunConfig.make(target="t", prompts="code", draft="d", **given)


def test_the_flags_and_words_say_tree_not_the_sampling_top_k():
    topk, tokens = VARIABLES["tree_topk"], VARIABLES["tree_tokens"]
    assert (topk.flag, tokens.flag) == ("--tree-topk", "--tree-tokens")
    for words in (topk.help, topk.title, topk.label):
        assert not missing(words.lower(), "tree branches per node", "not the sampling top-k"), words
    for words in (tokens.help, tokens.title, tokens.label):
        assert not missing(words.lower(), "tree nodes verified per round"), words
    assert "tree_topk" not in BASELINE_PARAMETERS and "tree_tokens" not in BASELINE_PARAMETERS


@pytest.mark.parametrize(
    ("name", "bad"), [("tree_topk", "0"), ("tree_topk", str(MAX_TREE_TOPK + 1)), ("tree_tokens", "-1")]
)
def test_a_value_out_of_bounds_is_one_line_naming_the_flag(name, bad):
    with pytest.raises(DraftLabError) as err:
        VARIABLES[name].parse(bad)
    assert not missing(str(err.value), name, bad, VARIABLES[name].flag), err.value
    assert "\n" not in str(err.value)
    assert VARIABLES[name].parse(VARIABLES[name].default) in (0, 1)
    with pytest.raises(DraftLabError):
        VARIABLES["tree_tokens"].parse(str(MAX_TREE_TOKENS + 1))


def test_tree_tokens_below_k_plus_one_is_refused_with_the_fix():
    with pytest.raises(DraftLabError) as err:
        _make(k=4, tree_topk=2, tree_tokens=4)
    assert not missing(str(err.value), "--tree-tokens 4", "k=4", "--tree-tokens 5"), err.value
    with pytest.raises(DraftLabError) as form:
        _make(k=4, tree_topk=2, tree_tokens=4, form=True)
    assert not missing(str(form.value), "tree nodes verified per round 5"), form.value
    assert "--" not in str(form.value)
    # a sweep of k checks every run: k=6 needs 7 nodes
    with pytest.raises(DraftLabError) as swept:
        _make(sweep="k", values="2,6", tree_topk=2, tree_tokens=5)
    assert not missing(str(swept.value), "k=6", "7"), swept.value
    with pytest.raises(DraftLabError) as one:
        _make(tree_tokens=1)
    assert not missing(str(one.value), "--tree-tokens 1", "0"), one.value
    assert _make(k=4, tree_topk=2, tree_tokens=5).value("tree_tokens") == 5
    assert _make(k=4, tree_topk=2, tree_tokens=0).value("tree_tokens") == 0
    assert _make(k=8, tree_topk=1, tree_tokens=4).value("tree_topk") == 1  # a chain verifies k + 1 whatever it says


def test_a_drafter_that_cannot_branch_refuses_a_tree_by_its_declaration():
    chains = [s for s in SPECS.values() if not s.branches]
    trees = [s for s in SPECS.values() if s.branches]
    assert chains and trees
    assert all(not s.branches for s in SPECS.values() if not s.needs_model)  # no model, no ranked children
    for spec in chains:
        text = spec.parameter.example if spec.parameter else spec.name
        with pytest.raises(DraftLabError) as err:
            RunConfig.make(target="t", prompts="code", drafter=text, tree_topk=3)
        assert not missing(str(err.value), text, "--tree-topk 1", trees[0].name), err.value
        assert RunConfig.make(target="t", prompts="code", drafter=text, tree_topk=1).value("tree_topk") == 1
    # a drafter sweep is checked run by run
    chain = chains[0].parameter.example if chains[0].parameter else chains[0].name
    with pytest.raises(DraftLabError):
        _make(sweep="drafter", values=f"model,{chain}", tree_topk=2)


def test_the_link_the_command_line_and_the_worker_carry_them():
    cfg = _make(sweep="tree_topk", values="1,2,4", k=3, tree_tokens=8)
    assert RunConfig.from_url(cfg.to_url()) == cfg
    argv = cfg.to_cli()
    assert "--tree-topk=1,2,4" in argv and "--tree-tokens=8" in argv
    sampling = [cfg.sampling(v) for v in cfg.values]
    assert [(s.tree_topk, s.tree_tokens) for s in sampling] == [(1, 8), (2, 8), (4, 8)]
    tokens = _make(sweep="tree_tokens", values="0,8,16", k=3, tree_topk=2)
    assert [tokens.sampling(v).tree_tokens for v in tokens.values] == [0, 8, 16]


def test_each_run_of_a_queued_sweep_stores_its_tree_and_shares_one_baseline(store):
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q

    cfg = _make(sweep="tree_tokens", values="0,6,12", k=3, tree_topk=3)
    eid = enqueue_experiment(store, **cfg.enqueue(), name="x", prompt_texts=["p"])
    experiment, rows = q.experiment(store, eid), q.runs(store, eid)
    assert (rows["kind"] == "baseline").sum() == 1  # the target's own decoding does not depend on the tree
    spec = rows[rows["kind"] == "speculative"]
    sampling = [RunConfig.of_run(row.to_dict(), experiment).sampling() for _, row in spec.iterrows()]
    assert sorted((s.tree_topk, s.tree_tokens) for s in sampling) == [(3, 0), (3, 6), (3, 12)]
    assert RunConfig.from_experiment(experiment) == cfg


def test_the_cheaper_tied_tree_is_the_smaller_one():
    assert full_tree_nodes(3, 2) == 11 and full_tree_nodes(4, 1) == 5
    assert verified_nodes(3, 2, 0) == 11 and verified_nodes(3, 2, 6) == 6 and verified_nodes(4, 1, 16) == 5
    topk = VARIABLES["tree_topk"]
    rows = [{"sweep_value": v, "k": 3, "tree_topk": v, "tree_tokens": 0} for v in (1, 2, 4)]
    costs = [topk.run_cost(r) for r in rows]
    assert costs == sorted(costs) and len(set(costs)) == 3
    tokens = VARIABLES["tree_tokens"]
    rows = [{"sweep_value": v, "k": 3, "tree_topk": 2, "tree_tokens": v} for v in (0, 6, 8)]
    assert [tokens.run_cost(r) for r in rows] == [11.0, 6.0, 8.0]  # 0: the whole tree, the dearest
    assert "smaller tree" in topk.cheaper_because and "smaller tree" in tokens.cheaper_because


def test_the_form_refuses_a_tree_that_does_not_fit_in_its_own_words():
    from pages.new_experiment import validate
    from tests.test_pages_logic import VALID

    launch = validate(**{**VALID, "sweep_text": "2,4", "tree_topk": 2, "tree_tokens": 4})
    text = " ".join(launch.errors)
    assert not missing(text, "tree nodes verified per round 5", "k=4"), launch.errors
    assert "--tree" not in text
    ok = validate(**{**VALID, "sweep_text": "2,4", "tree_topk": 2, "tree_tokens": 5})
    assert ok.errors == [] and ok.kwargs["sampling"]["tree_topk"] == 2 and ok.kwargs["sampling"]["tree_tokens"] == 5
