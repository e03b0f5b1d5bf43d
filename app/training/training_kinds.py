"""What differs between the two kinds of training job for the worker's one loop (app/training/training.py): a "distill"
job runs app/training/distill_driver.py (`draftlab distill`: a copy of a draft toward its target), a "head" job runs
app/training/head_driver.py (`draftlab train-head`: an EAGLE-3 head on the target's own hidden states). Each kind says
what it trains, its settings, which models it loads, its trainer (both are engine/training/distill.py's Distiller, with
the same records and checkpoints, so the loop that reports, cancels and checkpoints is one), how it ends, its command
line and the timed experiment queued when it is done:

- distill: the starting draft against the trained one (a draft sweep), greedy, at the held-out k;
- head: a head has no "before" draft to time (the fresh head it starts as is random, never saved), so the
  experiment times the trained head against the target alone: one eagle3 run at k = its TTT steps S (the chain
  length it was trained for, the k its held-out figures use) beside the target-only baseline, on the held-out
  prompts, greedy. Its speedup interval says whether serving the head pays on this hardware.
"""

from __future__ import annotations

from pathlib import Path

from app.training import distill_driver, head_driver
from engine.config.head_settings import parse_aux_layers
from storage.db.schema import DISTILL, HEAD

SAMPLING = {"temperature": 0.0}  # the before/after experiment decodes greedily, as the held-out figures do


class DistillJob:
    """A "distill" job: trains a copy of job["draft"] toward job["target"]."""

    made = "draft"  # what the job writes, in words

    def __init__(self, job: dict):
        self.job = job

    @property
    def subject(self) -> str:
        return f"{self.job['draft']} toward {self.job['target']}"

    @property
    def draft(self) -> str | None:
        """The draft loaded beside the target (and placed with it)."""
        return self.job["draft"]

    def config(self):
        j = self.job
        return distill_driver.distill_config(
            j["steps"], j["lr"], j["max_new_tokens"], j["batch_size"], j["seed"], j["samples"]
        )

    def focus_on(self, cfg, focus: dict) -> None:
        distill_driver.focus_on(cfg, focus)

    def trainer(self, pair, train_prompts, val_prompts, cfg, focus, ckpt: Path):
        return distill_driver.distiller(
            pair, train_prompts, val_prompts, cfg, focus, ckpt, fix=distill_driver.JOB_CHECKPOINT_FIX
        )

    def command(self, run, db_url: str | None) -> str:
        return distill_driver.distill_command({**self.job, "device": _device(self.job), "db": db_url})

    def finish(self, run, out: Path, cfg, done: dict, focus, started: float, ckpt: Path, **card) -> dict:
        return distill_driver.finish(
            run.pair, out, cfg, run.prepared, done, focus, started, ckpt, draft=self.job["draft"], **card
        )

    def evaluation(self, out: Path, cfg, repeats: int, job_id: int) -> dict:
        """enqueue_experiment's arguments for the before/after experiment."""
        j = self.job
        return {
            "name": f"{j['name']}: before/after training job {job_id}",
            "target": j["target"],
            "draft": j["draft"],
            "prompts": j["validation"],
            "sampling": {**SAMPLING, "max_new_tokens": int(j["max_new_tokens"])},
            "device": j["device"],
            "sweep_variable": "draft",
            "sweep_values": [j["draft"], str(out)],
            "k": cfg.k,
            "repeats": repeats,
            "tags": ["distill", f"training-job-{job_id}"],
            "notes": f"Before/after of training job {job_id}: {j['draft']} against the draft it trained ({out}) "
            f"on the held-out {j['validation']}, greedy, k={cfg.k}.",
        }


class HeadJob(DistillJob):
    """A "head" job: trains an EAGLE-3 head for job["target"], reading its hidden states (no draft is loaded)."""

    made = "EAGLE-3 head"

    @property
    def subject(self) -> str:
        return f"an EAGLE-3 head for {self.job['target']}"

    @property
    def draft(self) -> str | None:
        return None

    def config(self):
        j = self.job
        return head_driver.head_config(
            j["steps"],
            j["lr"],
            j["max_new_tokens"],
            j["batch_size"],
            j["seed"],
            j["samples"],
            j["ttt_steps"],
            j["draft_vocab_size"] or 0,
            parse_aux_layers(j["aux_layers"]),
        )

    def focus_on(self, cfg, focus: dict) -> None:
        """A head's focus positions are its TTT steps (engine/training/head_training.py), whatever k the profile's run
        had."""

    def trainer(self, pair, train_prompts, val_prompts, cfg, focus, ckpt: Path):
        return head_driver.trainer(
            pair,
            train_prompts,
            val_prompts,
            cfg,
            focus,
            ckpt,
            self.job["name"],
            self.job["target"],
            fix=distill_driver.JOB_CHECKPOINT_FIX,
        )

    def command(self, run, db_url: str | None) -> str:
        """`draftlab train-head` with the aux layers the head was trained on (auto resolved for the target)."""
        return head_driver.head_command(
            {**self.job, "aux_layers": run.aux_layers, "device": _device(self.job), "db": db_url}
        )

    def finish(self, run, out: Path, cfg, done: dict, focus, started: float, ckpt: Path, **card) -> dict:
        return head_driver.finish(run.pair, out, cfg, run.prepared, done, focus, started, ckpt, **card)

    def evaluation(self, out: Path, cfg, repeats: int, job_id: int) -> dict:
        j = self.job
        return {
            "name": f"{j['name']}: EAGLE-3 head of training job {job_id}",
            "target": j["target"],
            "draft": str(out),
            "drafter": "eagle3",
            "prompts": j["validation"],
            "sampling": {**SAMPLING, "max_new_tokens": int(j["max_new_tokens"])},
            "device": j["device"],
            "sweep_variable": "k",
            "sweep_values": [cfg.k],
            "k": cfg.k,
            "repeats": repeats,
            "tags": ["train-head", f"training-job-{job_id}"],
            "notes": f"The EAGLE-3 head training job {job_id} trained ({out}) against {j['target']} alone on the "
            f"held-out {j['validation']}, greedy, k={cfg.k} (its TTT steps). A head has no 'before' "
            f"draft to time: the fresh head it started as was never saved.",
        }


KINDS = {DISTILL: DistillJob, HEAD: HeadJob}


def kind_of(job: dict) -> DistillJob:
    """The kind of a stored training job (an older database's jobs distil)."""
    return KINDS[job.get("kind") or DISTILL](job)


def _device(job: dict) -> str:
    return job["device"] if job["device"] in ("cpu", "cuda") else "auto"
