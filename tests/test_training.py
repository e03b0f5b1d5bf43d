"""Training jobs ("Train a draft"): the Distiller's checkpoints resume exactly, the queue refuses bad jobs and
fences a job to its worker, and a worker runs a job end to end — live curve, cancel after a step with a
checkpoint of that step, resume without repeating or skipping a step, the trained draft saved, lossless and
offered as a candidate, and a before/after experiment queued and timed."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from sqlalchemy import text

from app.worker.worker import Worker
from engine.decoding.runs import baseline_decoder, encode_prompts, run_prompts, speculative_decoder
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import outputs_match
from engine.models.loading import load_pair
from engine.training import data
from engine.training import distill as ds
from storage.db.errors import QueueError
from storage.db.schema import utcnow
from storage.jobs import liveness, training
from storage.jobs.experiments import get_experiment
from tests import tiny_models as tm

TRAIN = ["t3 t4 t5", "t9 t10", "t20 t21 t22 t23", "t40 t2", "t7 t8 t9 t11", "t30 t31", "t50 t51 t52", "t12"]
VAL = ["t13 t14 t15", "t33 t34", "t60 t61 t5", "t25 t26 t27"]


def _cfg(steps=12):
    return ds.DistillConfig(steps=steps, lr=3e-3, max_new_tokens=10, batch_size=3, eval_points=4)


def _fresh_pair():
    target = tm.llama(0, layers=2, sharpness=4.0)
    return tm.pair(target, tm.noisy_copy(target, seed=1, noise=0.5))


# --- the engine: checkpoints ---------------------------------------------------------------------------------


def test_a_checkpoint_resumes_exactly_where_an_uninterrupted_run_would_be(tmp_path, monkeypatch):
    whole = ds.Distiller(_fresh_pair(), TRAIN, VAL, _cfg())
    list(whole.prepare())
    straight = [r for r in whole.train() if r["kind"] in ("step", "eval")]

    first = ds.Distiller(_fresh_pair(), TRAIN, VAL, _cfg())
    list(first.prepare())
    seen = []
    for rec in first.train():
        seen.append(rec)
        if rec["kind"] == "step" and rec["step"] == 6:  # stop between step 6 and its held-out measurement
            break
    first.save_checkpoint(tmp_path / "ckpt")

    # a new process: fresh models, and the target's continuations are never generated again
    monkeypatch.setattr(data, "generate", lambda *a, **k: pytest.fail("a resume regenerated the data"))
    second = ds.Distiller(_fresh_pair(), TRAIN, VAL, _cfg())
    assert second.load_checkpoint(tmp_path / "ckpt") and second.step == 6
    rest = [r for r in second.train() if r["kind"] in ("step", "eval")]
    assert [r["step"] for r in rest if r["kind"] == "step"] == list(range(7, 13))  # none repeated, none skipped
    resumed = [r for r in seen if r["kind"] in ("step", "eval")] + rest
    assert [(r["kind"], r["step"]) for r in resumed] == [(r["kind"], r["step"]) for r in straight]
    for a, b in zip(resumed, straight):
        key = "loss" if a["kind"] == "step" else "kl"
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a, b)
    for (name, p), q in zip(second.pair.draft.model.state_dict().items(), whole.pair.draft.model.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-6), name
    assert [c["step"] for c in second.curve] == [c["step"] for c in whole.curve]
    assert [c["kl"] for c in second.curve] == pytest.approx([c["kl"] for c in whole.curve], rel=1e-6)


def test_a_checkpoint_of_other_settings_is_refused_never_restarted_over(tmp_path):
    """Other settings or prompts: one line naming what differs (the checkpoint kept); discard_other (--overwrite)
    removes it and starts over; no checkpoint: a fresh start."""
    run = ds.Distiller(_fresh_pair(), TRAIN, VAL, _cfg())
    list(run.prepare())
    run.save_checkpoint(tmp_path / "ckpt")
    with pytest.raises(DraftLabError, match="--steps: checkpoint 12, now 13"):
        ds.Distiller(_fresh_pair(), TRAIN, VAL, _cfg(steps=13)).load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(DraftLabError, match=r"--prompts \(training prompts\): checkpoint"):
        ds.Distiller(_fresh_pair(), TRAIN[:-1], VAL, _cfg()).load_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / ds.Distiller.DATA).exists()
    assert not ds.Distiller(_fresh_pair(), TRAIN, VAL, _cfg()).load_checkpoint(tmp_path / "none")
    assert not ds.Distiller(_fresh_pair(), TRAIN, VAL, _cfg(steps=13)).load_checkpoint(
        tmp_path / "ckpt", discard_other=True
    )
    assert not (tmp_path / "ckpt").exists()


# --- the queue -----------------------------------------------------------------------------------------------


def _job(store, tmp_path, **overrides) -> int:
    settings = {
        "name": "d1",
        "target": "t",
        "draft": "d",
        "prompts": "code:tune",
        "validation": "code:validation",
        "steps": 5,
        "models": tmp_path / "models",
        **overrides,
    }
    return training.enqueue_training(store, **settings)


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"name": "../escape"}, "not a plain directory name"),
        ({"name": ""}, "not a plain directory name"),
        ({"steps": 0}, "steps must be a positive integer"),
        ({"steps": 2.5}, "steps must be a positive integer"),
        ({"lr": -1}, "learning rate must be a positive number"),
        ({"lr": float("nan")}, "learning rate"),
        ({"batch_size": 0}, "batch size"),
        ({"focus_from": 999}, "focus experiment 999 does not exist"),
        ({"target": " "}, "target is empty"),
    ],
)
def test_bad_jobs_are_refused_and_nothing_is_stored(store, tmp_path, bad, needle):
    with pytest.raises(QueueError, match=needle):
        _job(store, tmp_path, **bad)
    assert training.jobs(store).empty


def test_a_directory_that_holds_a_model_or_a_name_in_use_is_refused(store, tmp_path):
    _job(store, tmp_path)
    with pytest.raises(QueueError, match="already writes"):
        _job(store, tmp_path)
    (tmp_path / "models" / "kept").mkdir(parents=True)
    (tmp_path / "models" / "kept" / "config.json").write_text("{}")
    with pytest.raises(QueueError, match="already holds a model"):
        _job(store, tmp_path, name="kept")
    assert len(training.jobs(store)) == 1


def test_one_claim_wins_reports_are_fenced_cancel_and_resume(store, tmp_path):
    jid = _job(store, tmp_path)
    assert training.next_job(store) == jid
    assert training.claim_job(store, jid, "w1") and not training.claim_job(store, jid, "w2")
    assert training.report(store, jid, "w2", [{"step": 1, "loss": 9.0}], step=1) == {"owned": False, "cancel": False}
    assert training.report(
        store, jid, "w1", [{"step": 0, "kl": 2.0}, {"step": 1, "loss": 1.5, "lr": 1e-3}], step=1, phase="training"
    ) == {"owned": True, "cancel": False}
    assert training.report(store, jid, "w1", [{"step": 1, "kl": 1.2}])["owned"]  # an eval point fills step 1 in
    pts = training.points(store, jid)
    assert pts["step"].tolist() == [0, 1] and pts.loc[1, "loss"] == 1.5 and pts.loc[1, "kl"] == 1.2
    assert training.cancel_job(store, jid)
    assert training.report(store, jid, "w1", step=2)["cancel"] is True
    assert training.finish_job(store, jid, "cancelled", worker_id="w1")
    assert training.get_job(store, jid)["status"] == "cancelled" and training.resume_job(store, jid)
    assert training.get_job(store, jid)["status"] == "queued"
    assert training.claim_job(store, jid, "w3") and training.rewind(store, jid, "w3", 0)
    assert training.points(store, jid)["step"].tolist() == [0]


def test_a_dead_workers_job_is_swept_interrupted(store, tmp_path):
    jid = _job(store, tmp_path)
    liveness.register_worker(store, "ghost", "elsewhere", 1)
    assert training.claim_job(store, jid, "ghost")
    old = utcnow() - timedelta(seconds=600)
    with store.write() as conn:
        conn.execute(text("UPDATE workers SET heartbeat = :t"), {"t": old})
        conn.execute(text("UPDATE training_jobs SET heartbeat = :t"), {"t": old})
    liveness.mark_stale(store, 60)
    job = training.get_job(store, jid)
    assert job["status"] == "interrupted" and "last checkpoint" in job["error"]


# --- a worker runs jobs end to end ---------------------------------------------------------------------------


@pytest.fixture
def train_setup(tmp_path, model_dirs, monkeypatch):
    from storage import open_store

    prompts = tmp_path / "train.txt"
    prompts.write_text("\n".join(TRAIN) + "\n")
    val = tmp_path / "val.txt"
    val.write_text("\n".join(VAL) + "\n")
    monkeypatch.setenv("DRAFTLAB_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr("app.training.training.REPORT_SECONDS", 0.0)  # every step reported: the cancel lands on step 4
    monkeypatch.setattr("app.training.training.EVAL_REPEATS", 1)
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    settings = {
        "target": model_dirs["target"],
        "draft": model_dirs["draft"],
        "prompts": str(prompts),
        "validation": str(val),
        "steps": 10,
        "lr": 3e-3,
        "batch_size": 3,
        "max_new_tokens": 10,
    }
    yield store, settings
    store.dispose()


def _drain(store):
    with Worker(store, heartbeat_seconds=0.2, poll_seconds=0.05) as worker:
        worker.work(until_idle=True)
    return worker


def test_a_job_is_cancelled_after_a_step_and_resumes_from_its_checkpoint(train_setup, monkeypatch, model_dirs):
    store, settings = train_setup
    straight = training.enqueue_training(store, name="straight", **settings)
    _drain(store)
    assert training.get_job(store, straight)["status"] == "done"
    reference = training.points(store, straight)

    jid = training.enqueue_training(store, name="interrupted", **settings)
    original = training.report

    def cancel_at_step_4(store_, job_id, worker_id, points=(), **fields):
        if fields.get("step") == 4:
            training.cancel_job(store_, job_id)  # as the dashboard's Cancel button does, while step 4 is reported
        return original(store_, job_id, worker_id, points, **fields)

    monkeypatch.setattr(training, "report", cancel_at_step_4)
    _drain(store)
    job = training.get_job(store, jid)
    assert job["status"] == "cancelled" and job["step"] == 4 and job["checkpoint_step"] == 4, job
    assert (Path(job["out"]) / training.CHECKPOINT_DIR / "state.pt").exists()
    assert not (Path(job["out"]) / "config.json").exists()  # no model written for a cancelled job
    assert training.points(store, jid)["step"].max() == 4

    monkeypatch.setattr(training, "report", original)
    monkeypatch.setattr(data, "generate", lambda *a, **k: pytest.fail("the resumed job regenerated its data"))
    assert training.resume_job(store, jid)
    _drain(store)
    job = training.get_job(store, jid)
    assert job["status"] == "done" and job["step"] == 10 and job["error"] is None, job
    pts = training.points(store, jid)
    assert pts["step"].tolist() == list(range(11))  # steps 0..10 once each: none repeated, none missing
    assert pts["loss"].iloc[1:].tolist() == pytest.approx(reference["loss"].iloc[1:].tolist(), rel=1e-5)
    assert pts["kl"].dropna().tolist() == pytest.approx(reference["kl"].dropna().tolist(), rel=1e-5)
    assert job["kl_after"] < job["kl_before"]
    assert not (Path(job["out"]) / training.CHECKPOINT_DIR).exists()  # removed once the model is saved

    # the trained draft: a model directory with its card, lossless as a draft, offered as a candidate
    out = Path(job["out"])
    assert out.parent == Path(settings["prompts"]).parent / "models" and out.name == "interrupted"
    card = (out / "MODEL_CARD.md").read_text()
    assert "draftlab distill" in card and "--steps 10" in card
    assert json.loads((out / "distill.json").read_text())["lossless_after"] is True
    assert [d["name"] for d in training.trained_drafts(store)] == ["interrupted", "straight"]
    pair = load_pair(model_dirs["target"], str(out), "cpu")
    cfg = SamplingConfig(0.0, 0, 1.0, 0, 10)
    ids = encode_prompts(pair, VAL, 10)
    assert outputs_match(
        list(run_prompts(speculative_decoder(pair, cfg, 3), VAL, ids)),
        list(run_prompts(baseline_decoder(pair, cfg), VAL, ids)),
    )

    # the before/after experiment: the starting draft against the trained one, on the held-out prompts, timed
    exp = get_experiment(store, job["eval_experiment_id"])
    assert exp["sweep_variable"] == "draft" and json.loads(exp["sweep_values"]) == [settings["draft"], str(out)]
    assert exp["prompts"] == settings["validation"] and exp["temperature"] == 0.0
    from storage.records import queries

    runs = queries.runs(store, exp["id"])
    assert (runs["status"] == "done").all() and len(runs) == 3
    spec = runs[runs["kind"] == "speculative"]
    assert spec["outputs_match_baseline"].tolist() == [True, True]
    assert spec["speedup_ci_lo"].notna().all()


def test_a_job_that_cannot_load_its_models_fails_with_one_line(train_setup, tmp_path):
    store, settings = train_setup
    jid = training.enqueue_training(store, name="broken", **{**settings, "target": str(tmp_path / "no-such-model")})
    _drain(store)
    job = training.get_job(store, jid)
    assert job["status"] == "failed" and "not found" in job["error"] and "\n" not in job["error"]
    assert training.resume_job(store, jid)  # failures are resumable like runs


def test_a_training_job_too_large_for_one_slot_leases_both_of_its_group(train_setup, monkeypatch):
    """A job whose pair needs two devices of a `+` group takes both leases (and names both); one too large for the
    whole group fails at once with the fix, leaving no lease behind."""
    from engine.models.placement import HEADROOM, weight_bytes

    store, settings = train_setup
    size = weight_bytes(settings["target"], torch.float32) + weight_bytes(settings["draft"], torch.float32)
    tight = int(size / (1 - HEADROOM) * 0.6)  # each slot holds 60 % of the pair: it takes two
    spread = training.enqueue_training(store, name="spread", **{**settings, "steps": 2})
    held = []
    original = training.report

    def watch(store_, job_id, worker_id, points=(), **fields):
        with store.read() as conn:
            held.append(sorted(conn.execute(text("SELECT device FROM device_leases")).scalars()))
        return original(store_, job_id, worker_id, points, **fields)

    monkeypatch.setattr(training, "report", watch)
    with Worker(
        store,
        device="cpu:0+cpu:1",
        free_memory=lambda: [tight, tight],
        log=lambda m: None,
        heartbeat_seconds=0.5,
        poll_seconds=0.05,
    ) as worker:
        worker.work(until_idle=True)
    monkeypatch.setattr(training, "report", original)
    job = training.get_job(store, spread)
    host = socket.gethostname()
    assert job["status"] == "done", job["error"]
    assert job["device_name"] == "cpu ×2 (cpu:0, cpu:1)"
    assert held and all(h == [f"{host}:cpu:0", f"{host}:cpu:1"] for h in held)

    big = training.enqueue_training(store, name="big", **{**settings, "steps": 2})
    with Worker(
        store,
        device="cpu:0+cpu:1",
        free_memory=lambda: [1000, 1000],
        log=lambda m: None,
        heartbeat_seconds=0.5,
        poll_seconds=0.05,
    ) as worker:
        worker.work(until_idle=True)
    job = training.get_job(store, big)
    assert job["status"] == "failed" and "needs ~" in job["error"] and "\n" not in job["error"]
    with store.read() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM device_leases")).scalar() == 0
