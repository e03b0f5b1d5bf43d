"""The Train-a-draft page under AppTest: the form queues a job (and refuses bad ones, storing nothing), the job
view shows the live curve, cancel and resume, the before/after figures and experiment of a finished job, and
the trained draft is offered on the New-experiment page."""

from __future__ import annotations

import json

import pytest

from storage import open_store
from storage.jobs import training
from tests.meaning import missing
from tests.test_pages import app, assert_clean, chart_data, page_text
from tests.test_training import TRAIN, VAL


@pytest.fixture
def train_db(tmp_path, monkeypatch, model_dirs):
    url = f"sqlite:///{tmp_path / 'train.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    monkeypatch.setenv("DRAFTLAB_MODELS", str(tmp_path / "shared-models"))
    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path / "uploads"))
    store = open_store(url)
    yield store, model_dirs, tmp_path
    store.dispose()


def _fill(at, model_dirs, name="my-draft"):
    at.text_input(key="train_target").set_value(model_dirs["target"])
    at.text_input(key="train_draft").set_value(model_dirs["draft"]).run()
    at.selectbox(key="train_set").set_value("code:tune").run()  # the default (every set, 16 samples) is the full recipe
    at.number_input(key="train_samples").set_value(1)
    at.number_input(key="train_steps").set_value(6)
    at.number_input(key="train_batch_size").set_value(3)
    at.number_input(key="train_max_new_tokens").set_value(8).run()
    name_box = next(t for t in at.text_input if t.key and t.key.startswith("train_name_"))
    name_box.set_value(name).run()
    return at


def test_the_form_queues_a_job_and_shows_where_drafts_go(train_db):
    store, model_dirs, tmp_path = train_db
    at = app("train")
    assert_clean(at)
    assert at.title[0].value == "Train a draft"
    assert str(tmp_path / "shared-models" / "demo-draft-distilled-1") in page_text(at)
    assert "DRAFTLAB_MODELS" in page_text(at)
    _fill(at, model_dirs)
    assert any("tokenizers match" in s.value or "Pair check" in s.value for s in at.success)
    # Before it is queued: how long, with a range and what that rests on (nothing finished here yet: the shipped
    # demo's recorded run, scaled to this job's shape and models).
    assert any(
        c.value.startswith("About ")
        and "(" in c.value
        and not missing(c.value, "no distillation job", "demo-draft-distilled")  # none here yet: the shipped card
        for c in at.caption
    )
    at.button(key="train_launch").click().run()
    assert_clean(at)
    jobs = training.jobs(store)
    assert len(jobs) == 1
    job = training.get_job(store, int(jobs["id"].iloc[0]))
    assert job["status"] == "queued" and job["steps"] == 6 and job["batch_size"] == 3
    assert job["prompts"] == "code:tune" and job["validation"] == "code:validation"
    assert job["out"] == str(tmp_path / "shared-models" / "my-draft")
    assert at.query_params["job"] == [str(job["id"])] or at.query_params["job"] == str(job["id"])
    assert "Job " in page_text(at) and "queued" in page_text(at)


def test_the_form_starts_from_the_recipe_that_made_demo_draft_distilled(train_db):
    """The defaults are the settings of the shipped demo-draft-distilled (its distill.json, the command its write-up
    benchmarks/bench_distilled.md gives), not the first version's (code:tune, 200 steps at lr 3e-4, 1 sample), which
    the write-up says made a weak draft."""
    import re
    import shlex
    from pathlib import Path

    from engine import zoo
    from engine.text.prompt_sets import EVERY_SET

    card = json.loads((zoo.ZOO_DIR / "demo-draft-distilled" / "distill.json").read_text())
    at = app("train")
    assert_clean(at)
    shown = {
        key: at.number_input(key=f"train_{key}").value
        for key in ("steps", "lr", "batch_size", "samples", "max_new_tokens", "seed")
    }
    assert shown == {key: card[key] for key in shown}
    assert (shown["steps"], shown["lr"], shown["samples"]) == (1200, 0.001, 16)
    assert (
        set(at.selectbox(key="train_set").value.split("+"))
        == set(card["prompts"].split("+"))
        == set(EVERY_SET.split("+"))
    )
    assert at.text_input(key="train_target").value == card["target"]
    assert at.text_input(key="train_draft").value == card["draft"]
    section = (Path(__file__).resolve().parent.parent / "benchmarks" / "bench_distilled.md").read_text()
    command = re.search(r"`(draftlab distill --target demo-target\s.*?)`", section, re.S).group(1)
    words = shlex.split(command)
    flags = {words[i][2:].replace("-", "_"): words[i + 1] for i in range(2, len(words) - 1, 2)}
    assert flags["prompts"] == card["prompts"]
    for key in ("steps", "lr", "batch_size", "samples", "max_new_tokens", "seed"):
        assert float(flags[key]) == shown[key], key


def test_every_tune_split_at_once_is_one_choice_held_out_on_every_validation_split(train_db):
    from engine.text.prompt_sets import EVERY_SET, PROMPT_SETS, load_prompts

    store, model_dirs, _ = train_db
    at = _fill(app("train"), model_dirs)
    at.selectbox(key="train_set").set_value(EVERY_SET).run()
    assert_clean(at)
    assert f"{len(load_prompts(EVERY_SET))} prompts" in page_text(at)
    held_out = "+".join(f"{name}:validation" for name in PROMPT_SETS)
    assert at.selectbox(key="train_validation").value == held_out
    at.button(key="train_launch").click().run()
    job = training.get_job(store, int(training.jobs(store)["id"].iloc[0]))
    assert job["prompts"] == EVERY_SET and job["validation"] == held_out
    at.selectbox(key="train_set").set_value("english:tune").run()  # the held-out split follows the training set
    assert at.selectbox(key="train_validation").value == "english:validation"
    at.selectbox(key="train_validation").set_value("math:validation").run()  # and a choice of its own is kept
    at.number_input(key="train_steps").set_value(7).run()
    assert at.selectbox(key="train_validation").value == "math:validation"


def test_a_mismatched_pair_blocks_and_a_bad_name_is_one_error_nothing_stored(train_db):
    store, model_dirs, _ = train_db
    at = app("train")
    at.text_input(key="train_target").set_value(model_dirs["target"])
    at.text_input(key="train_draft").set_value(model_dirs["alien"]).run()
    assert any("disagree" in e.value for e in at.error)
    assert at.button(key="train_launch").disabled
    at = _fill(app("train"), model_dirs, name="../escape")
    at.button(key="train_launch").click().run()
    assert_clean(at)
    assert any("not a plain directory name" in e.value for e in at.error)
    assert training.jobs(store).empty


def test_cancel_and_resume_buttons_drive_the_job(train_db):
    store, model_dirs, tmp_path = train_db
    jid = training.enqueue_training(
        store,
        name="j",
        target=model_dirs["target"],
        draft=model_dirs["draft"],
        prompts="code:tune",
        validation="code:validation",
        steps=50,
    )
    assert training.claim_job(store, jid, "w")
    training.report(
        store,
        jid,
        "w",
        [{"step": 0, "kl": 1.0}, {"step": 1, "loss": 0.9, "lr": 1e-4}, {"step": 2, "loss": 0.8, "lr": 1e-4}],
        step=2,
        progress=0.04,
        phase="training",
    )
    at = app("train", job=jid)
    assert_clean(at)
    assert "step 2 of 50" in page_text(at)
    series = set(chart_data(at)[0][0]["series"])
    assert series == {"train loss (weighted top-k KL)", "held-out KL (nats/token)"}
    at.button(key=f"cancel_job_{jid}").click().run()
    assert training.get_job(store, jid)["cancel_requested"] is True
    training.finish_job(store, jid, "cancelled", worker_id="w", checkpoint_step=2)
    at = app("train", job=jid)
    at.button(key=f"resume_job_{jid}").click().run()
    assert training.get_job(store, jid)["status"] == "queued"


def test_a_finished_job_shows_its_figures_and_its_draft_is_a_candidate(train_db, monkeypatch):
    store, model_dirs, tmp_path = train_db
    from app.worker.worker import Worker

    prompts, val = tmp_path / "train.txt", tmp_path / "val.txt"
    prompts.write_text("\n".join(TRAIN) + "\n")
    val.write_text("\n".join(VAL) + "\n")
    monkeypatch.setattr("app.training.training.EVAL_REPEATS", 1)
    jid = training.enqueue_training(
        store,
        name="tiny-distilled",
        target=model_dirs["target"],
        draft=model_dirs["draft"],
        prompts=str(prompts),
        validation=str(val),
        steps=8,
        lr=3e-3,
        batch_size=3,
        max_new_tokens=8,
    )
    with Worker(store, heartbeat_seconds=0.2, poll_seconds=0.05, log=lambda m: None) as worker:
        worker.work(until_idle=True)
    job = training.get_job(store, jid)
    assert job["status"] == "done", job["error"]

    at = app("train", job=jid)
    assert_clean(at)
    text = page_text(at)
    assert "Trained draft saved" in text and f"Before/after experiment #{job['eval_experiment_id']}" in text
    labels = {m.label: m.value for m in at.metric}
    assert labels[f"held-out KL (before: {job['kl_before']:.3f})"] == f"{job['kl_after']:.3f}"
    assert labels[f"α, greedy k=4 (before: {job['alpha_before']:.3f})"] == f"{job['alpha_after']:.3f}"
    steps = chart_data(at)[0][0]
    assert sorted(set(steps["step"])) == list(range(9))
    grid = next(d for d in at.dataframe if "outputs_match_baseline" in d.value)  # the before/after runs
    config = json.loads(grid.proto.columns)
    assert grid.proto.placeholder == "—"  # the baseline has no speedup: a dash, not "None"
    assert config["alpha"]["label"] == "α" and config["alpha"]["type_config"]["format"] == "%.3f"
    assert config["outputs_match_baseline"]["label"] == "same output" and config["outputs_match_baseline"]["help"]

    # New experiment: offered as a candidate of a draft sweep, and as a one-click draft
    at = app("new")
    at.selectbox(key="draft_pick").set_value(job["out"]).run()
    assert_clean(at)
    assert at.text_input(key="draft").value == job["out"]
    at.selectbox(key="sweep_variable").set_value("draft").run()
    options = at.multiselect(key="draft_candidates").options
    assert "tiny-distilled (trained, job 1)" in options, options


def test_a_findings_link_preselects_the_experiment_to_focus_on(train_db):
    """The token-type finding's "Try it" opens `train?focus_from=ID` (storage/findings.DISTILL_PAGE): that
    experiment is the focus, and the user can still change it."""
    from sqlalchemy import text

    from pages.widgets.nav import PAGES
    from storage.analysis.findings import DISTILL_PAGE
    from storage.jobs.experiments import enqueue_experiment

    store, model_dirs, _ = train_db
    eid = enqueue_experiment(
        store,
        name="focus me",
        target="t",
        draft="d",
        prompts="code:tune",
        sampling={"max_new_tokens": 8},
        sweep_values=[2],
    )
    with store.write() as conn:
        conn.execute(text("UPDATE runs SET status = 'done' WHERE experiment_id = :e"), {"e": eid})
    assert DISTILL_PAGE in PAGES  # a real page, not "not built yet"
    at = app(DISTILL_PAGE, focus_from=eid)
    assert_clean(at)
    assert at.selectbox(key="train_focus").value == eid
    from pages.train import NO_FOCUS

    at.selectbox(key="train_focus").set_value(NO_FOCUS).run()
    assert at.selectbox(key="train_focus").value == NO_FOCUS  # the link chose once; the user's choice stands


# --- EAGLE-3 heads ---------------------------------------------------------------------------------------------


def _fill_head(at, model_dirs, name="my-head", aux="1"):
    at.radio(key="train_kind").set_value("head").run()
    at.text_input(key="train_target").set_value(model_dirs["target"]).run()
    at.selectbox(key="train_set").set_value("code:tune").run()
    at.number_input(key="head_steps").set_value(6)
    at.number_input(key="head_ttt_steps").set_value(3)
    at.number_input(key="head_draft_vocab_size").set_value(40)
    at.text_input(key="head_aux_layers").set_value(aux)
    at.number_input(key="head_batch_size").set_value(2)
    at.number_input(key="head_max_new_tokens").set_value(8).run()
    name_box = next(t for t in at.text_input if t.key and t.key.startswith("train_name_"))
    name_box.set_value(name).run()
    return at


def test_the_head_form_starts_from_train_heads_defaults_and_queues_a_head_job(train_db):
    from engine.config import head_settings

    store, model_dirs, tmp_path = train_db
    at = app("train")
    at.radio(key="train_kind").set_value("head").run()
    assert_clean(at)
    assert not any(t.key == "train_draft" for t in at.text_input)  # a head starts from no draft
    shown = {
        key: at.number_input(key=f"head_{key}").value
        for key in ("steps", "lr", "ttt_steps", "draft_vocab_size", "max_new_tokens", "batch_size", "samples")
    }
    assert shown == {key: head_settings.DEFAULTS[key] for key in shown}
    assert at.text_input(key="head_aux_layers").value == "auto"
    assert any(not missing(c.value, "no head training job", "demo-eagle3") for c in at.caption), at.caption
    _fill_head(at, model_dirs)
    assert str(tmp_path / "shared-models" / "my-head") in page_text(at)
    at.button(key="train_launch").click().run()
    assert_clean(at)
    job = training.get_job(store, int(training.jobs(store)["id"].iloc[0]))
    assert (
        job["kind"],
        job["draft"],
        job["target"],
        job["steps"],
        job["ttt_steps"],
        job["draft_vocab_size"],
        job["aux_layers"],
        job["batch_size"],
        job["max_new_tokens"],
    ) == ("head", "", model_dirs["target"], 6, 3, 40, "1", 2, 8)
    assert job["validation"] == "code:validation" and job["out"] == str(tmp_path / "shared-models" / "my-head")
    text = page_text(at)
    assert "EAGLE-3 head for" in text and "TTT steps 3" in text and "aux layers 1" in text


def test_head_aux_layers_that_are_not_ids_are_one_error_and_nothing_is_queued(train_db):
    store, model_dirs, _ = train_db
    at = _fill_head(app("train"), model_dirs, aux="2;6")
    assert_clean(at)
    assert any(not missing(e.value, "aux layers", "'2;6'") for e in at.error), at.error
    assert at.button(key="train_launch").disabled
    at.text_input(key="head_aux_layers").set_value("auto").run()
    assert not at.error and not at.button(key="train_launch").disabled
    assert training.jobs(store).empty


def test_a_running_head_job_shows_acceptance_by_position_and_length_beside_its_loss(train_db):
    from pages.widgets import charts

    store, model_dirs, _ = train_db
    jid = training.enqueue_training(
        store,
        kind="head",
        name="h",
        target=model_dirs["target"],
        prompts="code:tune",
        validation="code:validation",
        steps=20,
        ttt_steps=2,
    )
    assert training.claim_job(store, jid, "w")
    training.report(
        store,
        jid,
        "w",
        [
            {"step": 0, "kl": 0.6, "acceptance_length": 1.0, "per_position": [0.0, None], "accuracy": [0.0, 0.1]},
            {"step": 1, "loss": 0.5, "lr": 1e-3},
            {"step": 2, "loss": 0.4, "lr": 1e-3},
            {"step": 2, "kl": 0.4, "acceptance_length": 1.5, "per_position": [0.4, 0.25], "accuracy": [0.4, 0.2]},
        ],
        step=2,
        progress=0.1,
        phase="training",
    )
    at = app("train", job=jid)
    assert_clean(at)
    assert "step 2 of 20" in page_text(at)
    data = [frames[0] for frames in chart_data(at)]
    loss = next(d for d in data if "series" in d)
    assert set(loss["series"]) == {charts.HEAD_LOSS, charts.HEAD_HELD_OUT}
    by_position = next(d for d in data if "position" in d)
    assert by_position[["step", "position"]].values.tolist() == [[0, 1], [0, 2], [2, 1], [2, 2]]
    assert by_position["acceptance"].tolist()[2:] == [0.4, 0.25]
    length = next(d for d in data if "acceptance_length" in d and "series" not in d and "position" not in d)
    assert length["acceptance_length"].tolist() == [1.0, 1.5]
    at.button(key=f"cancel_job_{jid}").click().run()
    assert training.get_job(store, jid)["cancel_requested"] is True


def test_a_finished_head_job_shows_its_figures_and_is_offered_as_a_head(train_db, monkeypatch):
    store, model_dirs, tmp_path = train_db
    from app.worker.worker import Worker

    prompts, val = tmp_path / "train.txt", tmp_path / "val.txt"
    prompts.write_text("\n".join(TRAIN) + "\n")
    val.write_text("\n".join(VAL) + "\n")
    monkeypatch.setattr("app.training.training.EVAL_REPEATS", 1)
    jid = training.enqueue_training(
        store,
        kind="head",
        name="tiny-head",
        target=model_dirs["target"],
        prompts=str(prompts),
        validation=str(val),
        steps=8,
        lr=3e-2,
        batch_size=4,
        max_new_tokens=8,
        ttt_steps=2,
    )
    with Worker(store, heartbeat_seconds=0.2, poll_seconds=0.05, log=lambda m: None) as worker:
        worker.work(until_idle=True)
    job = training.get_job(store, jid)
    assert job["status"] == "done", job["error"]

    at = app("train", job=jid)
    assert_clean(at)
    text = page_text(at)
    assert "Trained EAGLE-3 head saved" in text and f"Timed experiment #{job['eval_experiment_id']}" in text
    labels = {m.label: m.value for m in at.metric}
    assert (
        labels[f"acceptance length (before: {job['acceptance_length_before']:.2f})"]
        == f"{job['acceptance_length_after']:.2f}"
    )
    assert labels[f"α, greedy k=2 (before: {job['alpha_before']:.3f})"] == f"{job['alpha_after']:.3f}"
    grid = next(d for d in at.dataframe if "outputs_match_baseline" in d.value)  # the head against the target alone
    assert grid.value["draft"].tolist() == ["tiny-head"]

    # The EAGLE-3 form's estimate is from that finished head job (it said "no training job has finished yet")
    form = app("train")
    form.radio(key="train_kind").set_value("head").run()
    form.text_input(key="train_target").set_value(model_dirs["target"]).run()
    assert_clean(form)
    assert any(not missing(c.value, "1 finished head training job", "cpu") for c in form.caption), [
        c.value for c in form.caption
    ]

    # New experiment: listed as an EAGLE-3 head; picked, it is the draft and its check passes against its target
    at = app("new")
    at.text_input(key="target").set_value(model_dirs["target"]).run()
    assert at.selectbox(key="draft_pick").format_func(job["out"]) == f"tiny-head (EAGLE-3 head, job {jid})"
    at.selectbox(key="draft_pick").set_value(job["out"]).run()
    assert_clean(at)
    assert at.text_input(key="draft").value == job["out"]
    assert any("EAGLE-3 head (speculators layout) for this target" in s.value for s in at.success)
    at.text_input(key="target").set_value(model_dirs["draft"]).run()  # another target: refused, saying why
    assert any(f"was trained for target {model_dirs['target']!r}" in e.value for e in at.error)


def test_an_empty_model_field_disables_queue_and_its_help_says_which(train_db):
    """The Queue button is never disabled without saying why: an emptied Target model (or, distilling, Draft to start
    from) is named in its help, as the other problems are."""
    _store, model_dirs, _ = train_db
    at = _fill_head(app("train"), model_dirs)
    assert not at.button(key="train_launch").disabled
    at.text_input(key="train_target").set_value("").run()
    button = at.button(key="train_launch")
    assert button.disabled and not missing(button.help or "", "no target model"), button.help
    at = app("train")
    at.text_input(key="train_draft").set_value("").run()
    button = at.button(key="train_launch")
    assert button.disabled and not missing(button.help or "", "no draft to start from"), button.help
