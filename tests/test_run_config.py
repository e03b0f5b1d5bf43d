"""engine/config/run_config.py: one run configuration, read by every place that used to list the settings. Property
tests round-trip every swept variable and setting through each view of it: the form's fields and its link (form -> URL
-> form), and the command line through the database to deploy (CLI -> enqueue -> stored rows -> deploy configuration).
Each strategy draws from the descriptions themselves (engine/config/variables.py), so a new variable is round-tripped
without a line here."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config.drafter_specs import SPECS, needs_draft_model
from engine.config.run_config import PARAMETERS, RUN_PARAMETERS, RunConfig
from engine.config.variables import SETTINGS, VARIABLES, Variable
from engine.errors import DraftLabError
from tests.meaning import missing

SETS = ["code:tune", "code:validation", "math:tune"]
# Model names as HF ids and paths are written: never starting with "-" (the command line reads "--x" as an option,
# and "--draft -" means no draft).
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_./", min_size=1, max_size=24).filter(
    lambda s: s.strip() == s and not s.startswith("-")
)


def _number(v: Variable):
    """A value within the description's bounds (its limit in force), as the parser would return it."""
    low = 0 if v.low is None else v.low
    high = v.upper if v.upper is not None else 10**6
    if v.kind is int:
        return st.integers(int(math.ceil(low + (1 if v.low_open else 0))), int(min(high, 2**31 - 1)))
    values = st.floats(low, min(high, 10**6), allow_nan=False, exclude_min=v.low_open)
    if v.min_positive is not None:  # 0, or at least the smallest usable value
        values = values.filter(lambda x: x == 0 or x >= v.min_positive)
    return values


def _drafter(form_only: bool):
    """A drafter spec; the form has a field for the confidence and prompt-lookup parameters only, so for it other
    parameters are their defaults (suffix = suffix:24)."""
    specs = []
    for name, spec in SPECS.items():
        p = spec.parameter
        if p is None:
            specs.append(st.just(name))
        elif form_only and name not in ("confidence", "prompt-lookup"):
            specs.append(st.just(spec.spec(p.default)))
        else:
            specs.append(_number_in(p).map(lambda value, spec=spec: spec.spec(value)))
    return st.one_of(specs)


def _number_in(p):
    if p.kind is int:
        return st.integers(int(p.low) + (1 if p.low_open else 0), int(p.high) - 1)
    return (
        st.floats(p.low, p.high, allow_nan=False, exclude_min=p.low_open, exclude_max=True)
        .map(lambda x: round(x, 4))
        .filter(p.valid)
    )


def _value(v: Variable, form_only: bool):
    if v.name == "draft":
        return NAMES
    if v.name == "drafter":
        return _drafter(form_only)
    if v.categorical:  # a named variable with fixed choices (draft sampling): its example lists them
        return st.sampled_from(v.parse_list(v.example))
    return _number(v)


@st.composite
def configs(draw, form_only: bool = False):
    """A valid RunConfig: one swept variable with 1-3 values (or k auto), a grid sometimes, every parameter drawn."""
    sweep = draw(st.sampled_from([*VARIABLES, "auto"]))
    given_ = {name: draw(_value(v, form_only)) for name, v in PARAMETERS.items()}
    values, k_auto, grid = None, None, None
    if sweep == "auto":
        k_auto, sweep = draw(st.integers(2, 64)), "k"
    elif VARIABLES[sweep].categorical and VARIABLES[sweep].check_name is not None and sweep not in ("draft", "drafter"):
        values = VARIABLES[sweep].parse_list(VARIABLES[sweep].example)  # the form compares every choice
    else:
        values = draw(
            st.lists(
                _value(VARIABLES[sweep], form_only),
                min_size=1,
                max_size=3,
                unique_by=lambda x: VARIABLES[sweep].show(x) if isinstance(x, float) else x,
            )
        )
    if form_only and sweep == "drafter":  # the form lists drafters by kind, in the registry's order
        from pages.widgets.prefill import drafter_specs, split_drafter_specs

        values = list(drafter_specs(*split_drafter_specs(map(str, values or []))))  # (kinds, {name: listed values})
    if sweep != "batch_size" and draw(st.booleans()):
        grid = draw(st.lists(st.integers(1, 256), min_size=2, max_size=3, unique=True))
    try:
        return RunConfig.make(
            target=draw(NAMES),
            prompts=draw(st.sampled_from(SETS)),
            sweep=sweep,
            values=values,
            k_auto=k_auto,
            batch_sizes=grid,
            device=draw(st.sampled_from(["auto", "cpu", "cuda"])),
            dtype=draw(st.sampled_from(["auto", "float32", "bfloat16"])),
            **given_,
        )
    except DraftLabError:  # two floats shown alike (a sweep lists a value twice): not a configuration
        from hypothesis import reject

        reject()


def _on_the_command_line(cfg: RunConfig) -> bool:
    """The command line names the swept variable by the option that lists values: one value is a fixed setting
    there (a k sweep of one run; beside a batch-size list, a batch-size sweep), so a one-value sweep of another
    variable, or a grid of one value, has no command line of its own."""
    return cfg.k_auto is not None or len(cfg.values) > 1 or (cfg.sweep == "k" and not cfg.batch_sizes)


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)


@PROPERTY
@given(configs())
def test_the_link_reads_back_as_the_same_configuration(cfg):
    assert RunConfig.from_url(cfg.to_url()) == cfg


@PROPERTY
@given(configs(form_only=True))
def test_form_to_link_to_form(cfg):
    """The form's fields showing a configuration, its link, and the fields that link fills in: the same, and the
    configuration Launch would queue from them is the one they show."""
    from pages.widgets.prefill import form_config, form_values, parse_prefill

    fields = form_values(cfg)
    assert form_config(fields, cfg.prompts) == cfg  # form -> configuration (what Launch queues)
    filled, notes = parse_prefill(cfg.to_url(), SETS)  # configuration -> URL -> form
    assert notes == [] and filled == fields


def _parser():
    """`draftlab run`'s parser, its settings' flags and the sweep's."""
    from app.cli import build_parser

    return build_parser()


@PROPERTY
@given(configs().filter(_on_the_command_line))
def test_the_command_line_reads_back_as_the_same_configuration(cfg):
    from app.sweep import parse_sweep

    args = _parser().parse_args(["run", *cfg.to_cli()])
    options = {name: getattr(args, name) for name in VARIABLES}
    sweep = parse_sweep({**options, "draft": args.draft if args.draft is not None else "-"})
    assert RunConfig.from_args(args, sweep) == cfg


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(cfg=configs().filter(_on_the_command_line))
def test_cli_to_database_to_deploy(sqlite_store, cfg):
    """CLI arguments -> enqueue -> the stored experiment and runs -> deploy's configuration of each run: every
    parameter arrives as given, and the experiment row reads back as the configuration."""
    from app.sweep import parse_sweep
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q
    from storage.serving.deploy import configuration

    args = _parser().parse_args(["run", *cfg.to_cli()])
    options = {name: getattr(args, name) for name in VARIABLES}
    sweep = parse_sweep({**options, "draft": args.draft if args.draft is not None else "-"})
    given_ = RunConfig.from_args(args, sweep)
    size = max(
        given_.batch_sizes or [given_.value("batch_size"), *(given_.values if given_.sweep == "batch_size" else [])]
    )
    eid = enqueue_experiment(sqlite_store, **given_.enqueue(), name="x", prompt_texts=["p"] * int(size))
    experiment = q.experiment(sqlite_store, eid)
    assert RunConfig.from_experiment(experiment) == cfg
    runs = q.runs(sqlite_store, eid)
    spec = runs[runs["kind"] == "speculative"]
    assert len(spec) == len(cfg.values) * len(cfg.batch_sizes or [1])
    for _, row in spec.iterrows():
        value = cfg.swept.run_value(row)  # the run's swept value, as the pages read it back
        assert value in cfg.values
        expected = {**dict(cfg.settings), cfg.sweep: value}  # the configuration as given, this run's value swept
        if not needs_draft_model(expected["drafter"]):
            expected["draft"] = ""  # a drafter without a model: no draft
        if cfg.batch_sizes:  # a grid: each batch size's runs
            assert int(row["batch_size"]) in cfg.batch_sizes
            expected["batch_size"] = int(row["batch_size"])
        deployed = configuration(row.to_dict(), experiment)
        for name in RUN_PARAMETERS:
            if name == "max_new_tokens":
                assert deployed["_measured_max_new_tokens"] == expected[name]
            elif name == "draft":
                assert deployed["draft"] == (expected["draft"] or None)
            else:
                assert deployed[name] == expected[name], name


@pytest.fixture
def sqlite_store(tmp_path_factory):
    from storage import open_store

    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('db') / 'runs.db'}")
    yield store
    store.dispose()


def test_every_described_parameter_is_in_the_configuration():
    """A variable or setting added to engine/config/variables.py is a parameter of the configuration, a CLI flag, a link
    parameter and a form field (by its description), with no list to update."""
    from pages.widgets.prefill import KNOWN, NUMBERS, WIDGETS

    cfg = RunConfig.make(target="t", prompts="code", draft="d")
    assert [name for name, _ in cfg.settings] == list(PARAMETERS) == [*VARIABLES, *SETTINGS]
    flags = {
        a for action in _parser()._subparsers._group_actions[0].choices["run"]._actions for a in action.option_strings
    }
    assert {v.flag for v in PARAMETERS.values()} <= flags
    assert set(PARAMETERS) <= set(KNOWN) and set(PARAMETERS) <= set(WIDGETS)
    assert {name for name, v in PARAMETERS.items() if not v.categorical} <= set(NUMBERS)


def test_bad_values_are_refused_in_the_words_of_where_they_came_from():
    with pytest.raises(DraftLabError, match=r"--top-p|top_p value '1.5' is not a number in \(0, 1\]; use e.g. --top-p"):
        RunConfig.make(target="t", prompts="code", top_p=1.5)
    with pytest.raises(DraftLabError, match=r"enter e.g."):
        RunConfig.from_url({"target": "t", "prompts": "code", "top_p": "1.5"})
    with pytest.raises(DraftLabError, match="unknown settings colour"):
        RunConfig.make(target="t", prompts="code", colour=1)
    with pytest.raises(DraftLabError, match="not both"):
        RunConfig.make(target="t", prompts="code", sweep="batch_size", values=[1, 2], batch_sizes=[1, 2])


def test_duplicate_key_ignores_labels_only(sqlite_store):
    from storage.jobs.experiments import enqueue_experiment, recent_duplicate

    cfg = RunConfig.make(target="t", prompts="code", draft="d", sweep="k", values="1,2")
    launch = {**cfg.enqueue(), "name": "first", "notes": "n", "tags": ("a",)}
    eid = enqueue_experiment(sqlite_store, **launch, prompt_texts=["p"])
    assert recent_duplicate(sqlite_store, {**launch, "name": "other", "notes": "", "tags": ()}) == eid
    for change in ({"top_p": 0.9}, {"seed": 1}, {"draft_sampling": "greedy"}):
        other = cfg.with_values(**change)
        assert recent_duplicate(sqlite_store, {**other.enqueue(), "name": "first"}) is None, change


def test_a_run_reads_its_own_sampling_configuration():
    cfg = RunConfig.make(
        target="t",
        prompts="code",
        draft="d",
        sweep="temperature",
        values="0,0.7",
        top_k=20,
        draft_sampling="greedy",
        seed=5,
    )
    sampling = cfg.sampling(0.7)
    assert (sampling.temperature, sampling.top_k, sampling.seed, sampling.draft_sampling) == (0.7, 20, 5, "greedy")


def test_a_stored_run_stays_readable_after_a_workload_cap_is_lowered(sqlite_store, monkeypatch):
    """Caps bound what may be queued (SPEC, Inputs); a run queued under a higher cap is still read, rerun and
    deployed as it was."""
    from storage.jobs.experiments import add_k_runs, enqueue_experiment
    from storage.records import queries as q
    from storage.serving.deploy import configuration

    cfg = RunConfig.make(target="t", prompts="code", draft="d", sweep="k", values="1,2", max_new_tokens=512)
    eid = enqueue_experiment(sqlite_store, **cfg.enqueue(), name="x", prompt_texts=["p"])
    monkeypatch.setenv("DRAFTLAB_LIMIT_MAX_NEW_TOKENS", "64")
    with pytest.raises(DraftLabError, match="more than the limit of 64"):
        RunConfig.from_url(cfg.to_url())  # a new launch of it is refused
    experiment = q.experiment(sqlite_store, eid)
    assert RunConfig.from_experiment(experiment) == cfg
    row = q.runs(sqlite_store, eid).iloc[-1].to_dict()
    assert RunConfig.of_run(row, experiment).sampling().max_new_tokens == 512
    assert configuration(row, experiment)["_measured_max_new_tokens"] == 512
    assert len(add_k_runs(sqlite_store, eid, [3])) == 2


def test_an_eagle3_head_draft_picks_its_drafter_in_one_place(sqlite_store, tmp_path, monkeypatch):
    """The drafter a run takes when none is named (RunConfig.make, engine/config/run_config.py default_drafter): eagle3
    for an EAGLE-3 head directory in either layout, model for a causal LM, through the CLI's configuration, a link, the
    queue (enqueue_experiment without a drafter) and the form's launch (its Drafter field gives way to the head); a
    draft sweep of heads and causal LMs gives each draft its own (tests/test_mixed_draft_sweep.py). A drafter named for
    the other kind of draft, also in such a sweep, is one line; stored configurations keep the drafter they named."""
    import torch

    from engine.config.head_format import sglang_dir
    from engine.models.eagle3 import convert_head, new_head, save_head
    from pages.new_experiment import validate
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q
    from tests import tiny_models as tm
    from tests.test_pages_logic import VALID

    target = tm.llama(0, layers=4, vocab=16)
    head = str(save_head(new_head(target, [1, 2, 3], torch.arange(16), verifier="demo-target"), tmp_path / "head"))
    convert_head(head, sglang_dir(head), "sglang")
    sglang = str(sglang_dir(head))
    for draft, drafter in ((head, "eagle3"), (sglang, "eagle3"), ("demo-draft", "model"), ("hub/id", "model")):
        assert RunConfig.make(target="t", prompts="code", draft=draft).value("drafter") == drafter, draft
        assert RunConfig.from_url({"target": "t", "prompts": "code", "draft": draft}).value("drafter") == drafter
    assert RunConfig.make(target="t", prompts="code", sweep="draft", values=[head, sglang]).value("drafter") == "eagle3"
    assert RunConfig.make(target="t", prompts="code", draft=head, drafter="prompt-lookup:3").value("draft") == head

    eid = enqueue_experiment(
        sqlite_store,
        name="head",
        target="t",
        draft=head,
        prompts="code",
        sampling={},
        sweep_values=[2, 3],
        prompt_texts=["p"],
    )
    assert set(q.runs(sqlite_store, eid).dropna(subset=["k"])["drafter"]) == {"eagle3"}
    experiment = q.experiment(sqlite_store, eid)
    assert RunConfig.from_experiment(experiment).value("drafter") == "eagle3"
    monkeypatch.setattr("engine.config.run_config.is_head", lambda draft: False)  # stored: never re-derived
    assert RunConfig.from_experiment(experiment).value("drafter") == "eagle3"
    monkeypatch.undo()

    launch = validate(**{**VALID, "draft": sglang, "drafter": None})
    assert launch.errors == [] and launch.kwargs["drafter"] == "eagle3" and launch.kwargs["draft"] == sglang
    assert "[" not in launch.kwargs["name"]

    for case, says in (
        # the drafter, what it drafts with, and (in a draft sweep) the draft it cannot draft
        ({"draft": head, "drafter": "model"}, "drafter 'model'.*causal LM"),
        ({"draft": "demo-draft", "drafter": "eagle3"}, "drafter 'eagle3'.*EAGLE-3 head"),
        (
            {"sweep": "draft", "values": [head, "demo-draft"], "drafter": "model"},
            f"drafter 'model'.*causal LM.*'{head}'.*EAGLE-3 head",
        ),
        (
            {"sweep": "draft", "values": ["demo-draft", head], "drafter": "eagle3"},
            "drafter 'eagle3'.*EAGLE-3 head.*'demo-draft'",
        ),
        ({"draft": sglang, "sweep": "drafter", "values": "model,eagle3"}, "drafter 'model'"),
    ):
        with pytest.raises(DraftLabError, match=says) as err:
            RunConfig.make(target="t", prompts="code", **case)
        assert "\n" not in str(err.value)
    launch = validate(**{**VALID, "draft": head, "drafter": "confidence:0.5"})
    assert launch.kwargs == {} and any(not missing(e, "drafter 'confidence:0.5'", "causal LM") for e in launch.errors)
