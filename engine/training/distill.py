"""Distil a draft toward its target: forward KL(p_target || p_draft) on the target's own continuations.

Data (engine/training/data.py; generated once, then cached for every step): the target's GREEDY continuation of
every training prompt (the exact text target-only greedy decoding emits, via engine.decoding.baseline), plus
`samples - 1` continuations sampled from the target at temperature 1 (on-policy for the target; more text, less
overfitting on small prompt sets; decoded in batches), and the target's top-`top_k` next-token distribution at every
continuation position (one teacher-forced target forward per sequence). A step
draws `batch_size` cached sequences, runs the draft over them and minimises, per continuation position,

    sum_{x in top-k of p_t}  p~_t(x) (log p~_t(x) - log p_d(x))       (p~_t: p_t renormalised over its top k)

weighted per token (`type_weights`, `position_weights`: the `--focus-from` profile, mean 1) and averaged.
Held-out figures use the full vocabulary: kl = mean D_KL(p_t || p_d) over the target's greedy continuations of
the validation prompts; alpha = greedy speculative acceptance (k=4 by default) on those prompts.

Pure torch + transformers: `Distiller` yields plain dict records;
storage, CLI and dashboards stay outside.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch

from engine.decoding.runs import encode_prompts, run_prompts, speculative_decoder
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.metrics.metrics_oracle import speculative_metrics
from engine.models.loading import LoadedModel, ModelPair
from engine.text.token_types import TokenTyper
from engine.training import data
from engine.training.data import Sequence
from engine.wording import noun, plural

EVAL_K = 4  # draft length of the held-out acceptance measurement
BONUS = 0  # "draft position" of a bonus slot: no draft proposed it


@dataclass
class DistillConfig:
    steps: int
    lr: float = 3e-4
    max_new_tokens: int = 128
    batch_size: int = 8  # sequences per step
    top_k: int = 64  # target distribution kept per position (renormalised over these)
    warmup_steps: int = 0  # 0: 10 % of steps (at most 50)
    min_lr_ratio: float = 0.1  # cosine decay to lr * this
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    eval_points: int = 8  # held-out KL measured this many times along the run (the loss curve's second column)
    samples: int = 1  # continuations per training prompt: the greedy one, plus samples - 1 drawn at temperature 1
    generation_batch: int = 32  # sampled continuations decoded together (engine/training/data.py sample_batched)
    k: int = EVAL_K  # draft length of the held-out alpha measurement
    profile_k: int = 0  # draft length of the position profile (--focus-from: its run's k); 0: k

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps <= 0:
            raise DraftLabError(f"--steps must be a positive integer (got {self.steps}); use e.g. --steps 300")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise DraftLabError(f"--lr must be a positive number (got {self.lr}); use e.g. --lr 3e-4")
        if self.max_new_tokens <= 0:
            raise DraftLabError(f"--max-new-tokens must be > 0 (got {self.max_new_tokens}); use e.g. 128")
        if self.samples <= 0:
            raise DraftLabError(f"--samples must be >= 1 (got {self.samples}); 1 = the greedy continuation only")
        if self.batch_size <= 0 or self.top_k <= 0:
            raise DraftLabError("batch size and top-k must be positive")


class TrainingConfig(Protocol):
    """The settings Distiller's shared stages, lr_at and config_record read: DistillConfig's, and those of
    engine/training/head_training.py's HeadConfig (a dataclass with these fields and its own)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # a dataclass: asdict() gives the record's and fingerprint's
    steps: int
    lr: float
    max_new_tokens: int
    batch_size: int
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    grad_clip: float
    seed: int
    eval_points: int
    samples: int
    generation_batch: int
    k: int
    profile_k: int


C = TypeVar("C", bound=TrainingConfig)


# --- teacher and draft figures over the data ----------------------------------------------------------------


def _continuation_logits(model, seqs: list[Sequence], vocab: int, device) -> list[torch.Tensor]:
    """Per sequence, logits [T, vocab] predicting each continuation token (teacher-forced)."""
    ids, _ = data.pad_batch(seqs, device)
    logits = model(input_ids=ids).logits[..., :vocab]
    out = []
    for row, s in enumerate(seqs):
        p, t = len(s.prompt_ids), len(s.continuation)
        out.append(logits[row, p - 1 : p - 1 + t])
    return out


@torch.no_grad()
def cache_teacher(target_model, seqs: list[Sequence], vocab: int, top_k: int, device, batch: int = 8) -> None:
    """Store the target's top-k log-probabilities (renormalised over the k) at every continuation position."""
    k = min(top_k, vocab)
    for chunk in data.chunks(seqs, batch):
        for s, logits in zip(chunk, _continuation_logits(target_model, chunk, vocab, device)):
            values, idx = logits.float().log_softmax(-1).topk(k, dim=-1)
            s.topk_ids = idx.cpu()
            s.topk_logp = values.log_softmax(-1).cpu()


@torch.no_grad()
def greedy_positions(draft_model, seqs: list[Sequence], vocab: int, k: int, device, batch: int = 8) -> None:
    """The draft position (1..k, or BONUS) each continuation token takes when this draft speculates greedily
    with draft length k against the target: exact for greedy decoding, since every accepted prefix is the
    target's own text, so the draft's proposals are its teacher-forced argmaxes."""
    for chunk in data.chunks(seqs, batch):
        for s, logits in zip(chunk, _continuation_logits(draft_model, chunk, vocab, device)):
            match = (logits.argmax(-1).cpu() == torch.tensor(s.continuation)).tolist()
            positions, j, t = [BONUS] * len(match), 0, len(match)
            while j < t:
                for i in range(1, k + 1):
                    slot = j + i - 1
                    if slot >= t:
                        j = t
                        break
                    positions[slot] = i
                    if not match[slot]:
                        j = slot + 1
                        break
                else:
                    j += k + 1  # all k accepted: slot j + k is the bonus token (BONUS already)
            s.positions = positions


def assign_weights(
    seqs: list[Sequence], typer: TokenTyper, type_weights: dict | None, position_weights: dict | None
) -> dict:
    """Per-token loss weights = type weight (of the target's token) x position weight (of its draft slot),
    normalised to mean 1 over all training tokens. Types/positions missing from the dicts weigh 1.
    Returns a summary: the mean weight and token count per type and per position."""
    type_weights, position_weights = type_weights or {}, {int(k): v for k, v in (position_weights or {}).items()}
    raw: list[tuple[list[float], list[str]]] = []  # per sequence: its tokens' raw weights and types
    by_type: dict[str, list[float]] = {}
    by_pos: dict[int, list[float]] = {}
    for s in seqs:
        types = [typer.describe(t)[1] for t in s.continuation]
        w = [
            float(type_weights.get(ty, 1.0)) * float(position_weights.get(pos, 1.0))
            for ty, pos in zip(types, s.positions or [BONUS] * len(types))
        ]
        raw.append((w, types))
    total = sum(len(w) for w, _ in raw)
    mean = sum(sum(w) for w, _ in raw) / total if total else 1.0
    for s, (w, types) in zip(seqs, raw):
        s.weights = torch.tensor([x / mean for x in w], dtype=torch.float32)
        for x, ty, pos in zip(s.weights.tolist(), types, s.positions or [BONUS] * len(types)):
            by_type.setdefault(ty, []).append(x)
            by_pos.setdefault(pos, []).append(x)
    summarise = lambda d: {key: {"tokens": len(v), "mean_weight": sum(v) / len(v)} for key, v in sorted(d.items())}  # noqa: E731
    return {"by_type": summarise(by_type), "by_position": summarise(by_pos)}


# --- loss and measurements -----------------------------------------------------------------------------------


def batch_loss(draft_model, seqs: list[Sequence], vocab: int, device) -> torch.Tensor:
    """Weighted mean over continuation positions of the top-k forward KL (the training objective)."""
    num, den = 0.0, 0
    for s, logits in zip(seqs, _continuation_logits(draft_model, seqs, vocab, device)):
        logp_d = logits.float().log_softmax(-1)
        if s.topk_ids is None or s.topk_logp is None:
            raise RuntimeError(
                "batch_loss() on a sequence without its teacher distributions (cache_teacher fills them)"
            )
        ids, logp_t = s.topk_ids.to(device), s.topk_logp.to(device)
        kl = (logp_t.exp() * (logp_t - logp_d.gather(-1, ids))).sum(-1)
        w = s.weights.to(device) if s.weights is not None else torch.ones_like(kl)
        num = num + (w * kl).sum()
        den += kl.shape[0]
    return num / max(den, 1)


@torch.no_grad()
def mean_kl(target_model, draft_model, seqs: list[Sequence], vocab: int, device, batch: int = 8) -> float:
    """Mean full-vocabulary D_KL(p_t || p_d) over every continuation position of `seqs` (nats)."""
    total, count = 0.0, 0
    for chunk in data.chunks(seqs, batch):
        t_logits = _continuation_logits(target_model, chunk, vocab, device)
        d_logits = _continuation_logits(draft_model, chunk, vocab, device)
        for lt, ld in zip(t_logits, d_logits):
            logp_t, logp_d = lt.float().log_softmax(-1), ld.float().log_softmax(-1)
            total += float((logp_t.exp() * (logp_t - logp_d)).sum())
            count += lt.shape[0]
    return total / count if count else float("nan")


def greedy_alpha(
    pair: ModelPair,
    prompts: list[str],
    max_new_tokens: int,
    k: int = EVAL_K,
    reference: list[Sequence] | None = None,
    drafter: str = "model",
) -> dict:
    """Greedy speculative decoding with the pair's draft at draft length k: alpha (engine.metrics.metrics_oracle)
    and, when the target's continuations are given, whether every output equals them (lossless)."""
    cfg = SamplingConfig(0.0, 0, 1.0, 0, max_new_tokens)
    encoded = encode_prompts(pair, prompts, max_new_tokens)
    results = list(run_prompts(speculative_decoder(pair, cfg, k, drafter=drafter), prompts, encoded))
    m = speculative_metrics(results)
    drafting = [r for p in results for r in p.rounds if r.k > 0]
    out = {
        "alpha": m["alpha"],
        "tokens_per_round": m["tokens_per_round"],
        "per_position_acceptance": m["per_position_acceptance"],
        # vLLM's mean acceptance length: 1 + accepted drafts per round that drafted
        "acceptance_length": 1 + m["accepted"] / len(drafting) if drafting else None,
    }
    if reference is not None:
        out["lossless"] = all(r.output_ids == s.continuation for r, s in zip(results, reference))
    return out


# --- training ------------------------------------------------------------------------------------------------


def lr_at(step: int, cfg: TrainingConfig) -> float:
    warm = cfg.warmup_steps or min(50, max(1, cfg.steps // 10))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


CHECKPOINT_FIX = (
    "rerun with the checkpoint's settings to resume it, or give a new --out (--overwrite discards it and starts over)"
)
_SETTING_FLAGS = {
    "train": "--prompts (training prompts)",
    "validation": "held-out prompts",
    "aux": "--aux-layers",
    "head": "the head's name",
    "type_weights": "--focus-from (type weights)",
    "position_weights": "--focus-from (position weights)",
}


def checkpoint_changes(saved: dict, now: dict) -> list[str]:
    """What differs between a checkpoint's fingerprint (Distiller._fingerprint) and this run's, one phrase each:
    a setting as its flag with both values (`--lr: checkpoint 0.001, now 0.002`), prompts by count. An empty list:
    the checkpoint is this run's."""

    def flat(fingerprint: dict) -> dict:
        config = fingerprint.get("config") or {}
        return {
            **{f"--{key.replace('_', '-')}": value for key, value in config.items()},
            **{_SETTING_FLAGS.get(key, f"--{key}"): value for key, value in fingerprint.items() if key != "config"},
        }

    def shown(value) -> str:
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return plural(len(value), "prompt")
        return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    old, new = flat(saved), flat(now)
    changes = []
    for key in [*new, *(k for k in old if k not in new)]:
        if old.get(key) != new.get(key):
            before, after = shown(old.get(key)), shown(new.get(key))
            if before == after:  # same count, other prompts
                before, after = f"{before} (other ones)", after
            changes.append(f"{key}: checkpoint {before}, now {after}")
    return changes


class Distiller(Generic[C]):
    """One distillation run, in stages the caller drives: `prepare()` (the target's continuations, teacher
    distributions, focus weights, held-out figures before), then `train()` (optimiser steps from `self.step + 1`).
    Between any two records the caller may `save_checkpoint(dir)`; `load_checkpoint(dir)` restores the prepared
    data and the training state (draft weights, optimiser, batch sampler and RNG states, curve) so `train()`
    continues with the next step exactly as an uninterrupted run would. Trains pair.draft.model in place
    (float32 on the pair's device). Records (plain dicts):

    {"kind": "phase", "phase": "..."}                      before each preparation stage
    {"kind": "generated", "split": "train"|"validation", "prompt": i, "of": n}
    {"kind": "prepared", "train_tokens", "validation_tokens", "weights": {...}}
    {"kind": "before", "kl", "alpha", "lossless"}          held-out figures of the draft as given
    {"kind": "step", "step", "loss", "lr", "seconds"}      after every optimiser step (step counts from 1)
    {"kind": "eval", "step", "kl", "train_loss"}           held-out KL along the run (the loss curve)
    {"kind": "trained", "seconds", "curve": [...], ...}    the end of training (weights still in memory)

    Generic in its settings C: a Distiller's are DistillConfig, head_training.HeadTrainer's its HeadConfig.
    """

    DATA, STATE = "data.pt", "state.pt"

    def __init__(
        self,
        pair: ModelPair,
        train_prompts: list[str],
        val_prompts: list[str],
        cfg: C,
        type_weights: dict | None = None,
        position_weights: dict | None = None,
    ):
        if pair.draft is None:
            raise DraftLabError("distillation needs a draft model; pass --draft MODEL")
        if pair.vocab != "shared":  # the loss compares both distributions token by token, in one vocabulary
            raise DraftLabError(
                f"distillation needs a draft that shares the target's tokenizer; {pair.draft.name!r} has another "
                "vocabulary (it drafts over their intersection); distil a draft with the target's tokenizer"
            )
        self.pair, self.cfg = pair, cfg
        self.train_prompts, self.val_prompts = list(train_prompts), list(val_prompts)
        self.type_weights, self.position_weights = type_weights, position_weights
        self.train_seqs: list[Sequence] = []
        self.val_seqs: list[Sequence] = []
        self.prepared: dict | None = None  # the "prepared" record
        self.before: dict | None = None  # held-out figures of the draft as given (alpha, tokens/round, lossless)
        self.kl_before: float | None = None
        self.step = 0  # optimiser steps done
        self.curve: list[dict] = []
        self.window: list[float] = []  # train losses since the last eval point
        self.seconds = 0.0  # training time so far (over every resumed session)
        self.opt: torch.optim.Optimizer | None = None  # made with the sampler by _optimizer(), both or neither
        self.gen: torch.Generator | None = None

    # --- stages ---

    def prepare(self: Distiller[DistillConfig]) -> Iterator[dict]:
        cfg, pair = self.cfg, self.pair
        torch.manual_seed(cfg.seed)
        target, draft, device, vocab = pair.target.model, self.draft.model, pair.device, pair.vocab_size
        target.eval()
        yield {"kind": "phase", "phase": "target continuations (train)"}
        train: list[Sequence] = []
        total = cfg.samples * len(self.train_prompts)
        for s in data.generate(pair, self.train_prompts, cfg.max_new_tokens):  # greedy: exactly target-only output
            train.append(s)
            yield {"kind": "generated", "split": "train", "prompt": len(train) - 1, "of": total}
        # then samples - 1 continuations per prompt at temperature 1, decoded many at a time
        for s in data.sample_batched(
            pair, self.train_prompts * (cfg.samples - 1), cfg.max_new_tokens, cfg.seed, cfg.generation_batch
        ):
            train.append(s)
            yield {"kind": "generated", "split": "train", "prompt": len(train) - 1, "of": total}
        yield {"kind": "phase", "phase": "target continuations (validation)"}
        val: list[Sequence] = []
        for i, s in enumerate(data.generate(pair, self.val_prompts, cfg.max_new_tokens)):
            val.append(s)
            yield {"kind": "generated", "split": "validation", "prompt": i, "of": len(self.val_prompts)}
        train = [s for s in train if s.continuation]
        if not train:
            raise DraftLabError("the target generated nothing for any training prompt (EOS first); use other prompts")

        yield {"kind": "phase", "phase": "teacher distributions and draft profile"}
        cache_teacher(target, train, vocab, cfg.top_k, device)
        draft.eval()
        greedy_positions(draft, train, vocab, cfg.profile_k or cfg.k, device)
        summary = assign_weights(train, TokenTyper(pair.tokenizer), self.type_weights, self.position_weights)
        self.train_seqs, self.val_seqs = train, val
        self.prepared = {
            "kind": "prepared",
            "train_sequences": len(train),
            "train_tokens": sum(len(s.continuation) for s in train),
            "validation_sequences": len(val),
            "validation_tokens": sum(len(s.continuation) for s in val),
            "weights": summary,
        }
        yield self.prepared

        yield {"kind": "phase", "phase": "held-out figures before training"}
        self.kl_before = mean_kl(target, draft, val, vocab, device)
        self.before = greedy_alpha(pair, self.val_prompts, cfg.max_new_tokens, cfg.k, val)
        self.curve = [{"step": 0, "train_loss": None, "kl": self.kl_before}]
        yield {"kind": "before", "kl": self.kl_before, **self.before}

    @property
    def draft(self) -> LoadedModel:
        """The pair's draft: a Distiller's is given (__init__ refuses a pair without one), a HeadTrainer's head is
        built by prepare() or load_checkpoint(), before anything reads it."""
        if self.pair.draft is None:
            raise RuntimeError("the trainer's draft was read before prepare() or load_checkpoint() made it")
        return self.pair.draft

    @property
    def model(self) -> torch.nn.Module:
        """The module trained in place (the pair's draft)."""
        return self.draft.model

    def _loss(self, seqs: list[Sequence]) -> torch.Tensor:
        """The training objective on one batch of sequences (a scalar to minimise)."""
        return batch_loss(self.model, seqs, self.pair.vocab_size, self.pair.device)

    def _optimizer(self) -> tuple[torch.optim.Optimizer, torch.Generator]:
        """A new optimiser and batch sampler (kept as self.opt and self.gen), returned."""
        draft, cfg = self.model, self.cfg
        draft.float().train()
        decay = [p for p in draft.parameters() if p.dim() >= 2 and p.requires_grad]
        other = [p for p in draft.parameters() if p.dim() < 2 and p.requires_grad]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )
        self.gen = torch.Generator().manual_seed(cfg.seed)
        return self.opt, self.gen

    def _training_state(self) -> tuple[torch.optim.Optimizer, torch.Generator]:
        """The optimiser and batch sampler, made on first use."""
        if self.opt is None or self.gen is None:
            return self._optimizer()
        return self.opt, self.gen

    def train(self) -> Iterator[dict]:
        if self.prepared is None:
            raise RuntimeError("Distiller.train() before prepare() or load_checkpoint()")
        cfg, draft = self.cfg, self.model
        opt, gen = self._training_state()
        draft.train()
        every = max(1, math.ceil(cfg.steps / max(1, cfg.eval_points)))
        start = time.perf_counter() - self.seconds
        if self.step and (self.step % every == 0 or self.step == cfg.steps) and self.curve[-1]["step"] != self.step:
            yield self._eval(start)  # a checkpoint taken between a step and its held-out measurement
        while self.step < cfg.steps:
            step = self.step + 1
            lr = lr_at(step - 1, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            pick = torch.randperm(len(self.train_seqs), generator=gen)[: cfg.batch_size].tolist()
            loss = self._loss([self.train_seqs[i] for i in pick])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
            opt.step()
            value = loss.item()
            self.window.append(value)
            self.step, self.seconds = step, time.perf_counter() - start
            yield {"kind": "step", "step": step, "loss": value, "lr": lr, "seconds": self.seconds}
            if step % every == 0 or step == cfg.steps:
                yield self._eval(start)
        draft.eval()
        yield {
            "kind": "trained",
            "seconds": self.seconds,
            "curve": self.curve,
            "kl_before": self.kl_before,
            "before": self.before,
            "validation": self.val_seqs,
            "weights": self.prepared["weights"],
        }

    def _eval(self, start: float) -> dict:
        """Held-out KL after `self.step` steps: the curve's next point (train loss: mean since the last one)."""
        pair, draft = self.pair, self.model
        draft.eval()
        kl = mean_kl(pair.target.model, draft, self.val_seqs, pair.vocab_size, pair.device)
        draft.train()
        point = {
            "step": self.step,
            "train_loss": sum(self.window) / len(self.window) if self.window else None,
            "kl": kl,
        }
        self.window = []
        self.curve.append(point)
        self.seconds = time.perf_counter() - start
        return {"kind": "eval", **point}

    # --- checkpoints ---

    def save_checkpoint(self, directory: str | Path) -> None:
        """The prepared data (written once) and the training state after `self.step` steps, each replaced
        atomically (a kill mid-write leaves the previous checkpoint)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        if not (path / self.DATA).exists():
            _atomic_save(path / self.DATA, {"fingerprint": self._fingerprint(), **self._data()})
        opt, gen = self._training_state()
        _atomic_save(
            path / self.STATE,
            {
                "step": self.step,
                "curve": self.curve,
                "window": self.window,
                "seconds": self.seconds,
                "draft": self.model.state_dict(),
                "optimizer": opt.state_dict(),
                "sampler": gen.get_state(),
                "torch_rng": torch.get_rng_state(),
            },
        )

    def load_checkpoint(self, directory: str | Path, discard_other: bool = False, fix: str = CHECKPOINT_FIX) -> bool:
        """Restore what save_checkpoint wrote; False (nothing changed) when there is no checkpoint there. A
        checkpoint of other settings (models, prompts, any setting: the run it holds would not be this one) is
        refused in one line naming what differs and `fix`, never silently restarted over; `discard_other`
        (--overwrite) removes it and returns False. With only the data saved, training starts at step 1 without
        regenerating it."""
        path = Path(directory)
        if not (path / self.DATA).exists():
            return False
        saved = torch.load(path / self.DATA, weights_only=True)
        changes = checkpoint_changes(saved.get("fingerprint") or {}, self._fingerprint())
        if changes and discard_other:
            shutil.rmtree(path)
            return False
        if changes:
            raise DraftLabError(
                f"{path.parent} holds the checkpoint of an unfinished run with other settings "
                f"({'; '.join(changes)}); {fix}"
            )
        self._restore(saved)
        opt, gen = self._optimizer()
        if (path / self.STATE).exists():
            state = torch.load(path / self.STATE, weights_only=True)
            self.model.load_state_dict(state["draft"])
            opt.load_state_dict(state["optimizer"])
            gen.set_state(state["sampler"])
            torch.set_rng_state(state["torch_rng"])
            self.step, self.curve, self.window = int(state["step"]), list(state["curve"]), list(state["window"])
            self.seconds = float(state["seconds"])
        return True

    def _data(self) -> dict:
        """What the checkpoint's data file holds besides the fingerprint: the prepared data, written once."""
        return {
            "train": [_seq_dict(s) for s in self.train_seqs],
            "validation": [_seq_dict(s) for s in self.val_seqs],
            "prepared": self.prepared,
            "before": self.before,
            "kl_before": self.kl_before,
        }

    def _restore(self, saved: dict) -> None:
        """The prepared data back from a checkpoint's data file (before the training state is loaded)."""
        self.train_seqs = [_seq_from(d) for d in saved["train"]]
        self.val_seqs = [_seq_from(d) for d in saved["validation"]]
        self.prepared, self.before, self.kl_before = saved["prepared"], saved["before"], saved["kl_before"]
        self.curve = [{"step": 0, "train_loss": None, "kl": self.kl_before}]

    def _fingerprint(self) -> dict:
        """What a checkpoint must match to be resumed: the models, settings and prompts (not the step count's
        schedule alone: a changed --steps changes the learning-rate schedule, so it is part of it)."""
        return {
            "config": asdict(self.cfg),
            "target": self.pair.target.name,
            "draft": self.draft.name,
            "train": self.train_prompts,
            "validation": self.val_prompts,
            "type_weights": self.type_weights or {},
            "position_weights": {str(k): v for k, v in (self.position_weights or {}).items()},
        }


def _seq_dict(s: Sequence) -> dict:
    return {
        "prompt_ids": s.prompt_ids,
        "continuation": s.continuation,
        "topk_ids": s.topk_ids,
        "topk_logp": s.topk_logp,
        "positions": s.positions,
        "weights": s.weights,
    }


def _seq_from(d: dict) -> Sequence:
    return Sequence(
        list(d["prompt_ids"]),
        list(d["continuation"]),
        d["topk_ids"],
        d["topk_logp"],
        list(d["positions"]),
        d["weights"],
    )


def _atomic_save(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def evaluate_saved(
    pair: ModelPair,
    draft: LoadedModel,
    val_prompts: list[str],
    val: list[Sequence],
    max_new_tokens: int,
    k: int = EVAL_K,
) -> dict:
    """Held-out KL and alpha of a draft (e.g. the saved one, reloaded) against the pair's target."""
    evaluated = ModelPair(pair.target, draft, pair.device, pair.dtype, pair.vocab_size)
    kl = mean_kl(pair.target.model, draft.model, val, pair.vocab_size, pair.device)
    return {"kl": kl, **greedy_alpha(evaluated, val_prompts, max_new_tokens, k, val)}


# --- output --------------------------------------------------------------------------------------------------


def saved_dtype(source: str) -> torch.dtype:
    """The dtype a model directory's config.json records (float32 when it says nothing)."""
    try:
        cfg = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return torch.float32
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(str(name), torch.float32)


def check_distill_out(out: str | Path, overwrite: bool = False, checkpoint: str | None = None) -> Path:
    """`draftlab distill --out`, before anything is written: never a shipped model's directory (engine/zoo, with or
    without `overwrite`); an existing directory must be empty, or hold only `checkpoint` (the same command's
    interrupted run, which it continues), unless `overwrite`; then check_out_dir."""
    from engine import zoo

    path = Path(out).expanduser()
    resolved, shipped = path.resolve(), zoo.ZOO_DIR.resolve()
    if resolved == shipped or shipped in resolved.parents:
        raise DraftLabError(
            f"--out {out} is inside the shipped models' folder ({shipped}); distilled models go "
            f"elsewhere, e.g. --out models/my-draft (shipped models are never overwritten)"
        )
    if path.is_dir() and not overwrite:
        entries = sorted(entry.name for entry in path.iterdir() if entry.name != checkpoint)
        if entries:
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise DraftLabError(
                f"--out {out} is not empty (it holds {shown}); pass a new or empty directory, or "
                f"--overwrite to write into it anyway"
            )
    return check_out_dir(path)


def check_out_dir(out: str | Path) -> Path:
    """Refuse an --out that cannot take a model directory, before any work: it must be a directory (or not
    exist yet) that this process can create and write. It is left as it was: the folders this check creates to
    probe are removed again (training creates them when it first writes), so bad input later leaves none behind."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise DraftLabError(f"--out {out} is a file, not a directory; pass a new or existing directory")
    missing = [p for p in [path, *path.parents] if not p.exists()]  # deepest first: what mkdir creates
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".draftlab-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise DraftLabError(
            f"--out {out} is not writable ({exc.strerror or exc}); pass a directory you can write to"
        ) from None
    finally:
        for folder in missing:
            try:
                folder.rmdir()  # only if still empty: never anything another process put there
            except OSError:
                break
    return path


def save_model(model, tokenizer, out: Path, dtype: torch.dtype) -> None:
    """save_pretrained (safetensors, in `dtype`) and the tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def write_card(out: Path, record: dict) -> None:
    """MODEL_CARD.md (render_card) and the same record as distill.json."""
    (out / "MODEL_CARD.md").write_text(render_card(record), encoding="utf-8")
    (out / "distill.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _fmt(value, spec=".4f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def render_card(c: dict) -> str:
    """MODEL_CARD.md of a distilled draft from the run's record (see app/commands/distill.py)."""
    curve = "\n".join(f"| {p['step']} | {_fmt(p['train_loss'])} | {_fmt(p['kl'])} |" for p in c["curve"])
    focus = c.get("focus")
    if focus:
        types = ", ".join(f"{k} {v:.2f}" for k, v in sorted(focus["type_weights"].items()))
        positions = ", ".join(
            f"{k}: {v:.2f}" for k, v in sorted(focus["position_weights"].items(), key=lambda kv: int(kv[0]))
        )
        focus_text = (
            f"Per-token loss weights from experiment {focus['experiment_id']}'s run {focus['run_id']} "
            f"({focus['how']}): weight = type weight x draft-position weight, normalised to mean 1 over the "
            f"training tokens.\n\n- token type weights: {types}\n- draft position weights: {positions}\n"
            f"- token type = SPEC type of the target's token; position = the slot it takes when the "
            f"original draft speculates greedily with k={c.get('profile_k') or c['k']} (bonus slots weigh 1)\n"
        )
    else:
        focus_text = "None: every continuation token weighs 1.\n"
    eff = "\n".join(f"| {ty} | {v['tokens']} | {v['mean_weight']:.2f} |" for ty, v in c["weights"]["by_type"].items())
    sequences = (
        f"{noun(c.get('samples', 1), 'continuation')} of each prompt ({c['train_sequences']} sequences of up to "
        f"{c['max_new_tokens']} new tokens,"
    )
    held_out = (
        f"`{c['validation']}` ({plural(c['validation_prompts'], 'prompt')}, "
        f"{plural(c['validation_tokens'], 'target token', thousands=True)}){c.get('validation_note', '')}"
    )
    optimizer = (
        f"AdamW lr {c['lr']:g} ({c['warmup_steps']} warm-up steps, cosine to {c['lr'] * c['min_lr_ratio']:.2g}), "
        f"betas (0.9, 0.95), grad clip {c['grad_clip']}, seed {c['seed']}"
    )
    wall_time = (
        f"{duration(c['train_seconds'])} training, {duration(c['total_seconds'])} in all (generation, evaluation "
        f"and saving included), on {c['hardware']}" + (", finished " + c["finished"] if c.get("finished") else "")
    )
    return f"""# {c["name"]}

A draft distilled toward `{c["target"]}` from `{c["draft"]}` by `draftlab distill` (engine/training/distill.py): same
architecture and size as `{c["draft"]}` ({c["parameters"]:,} parameters), same tokenizer as the target.

## Data

- prompts: `{c["prompts"]}` ({plural(c["train_prompts"], "prompt")}); continuations: the target's {c["continuations"]}
  {sequences}
  {c["train_tokens"]:,} tokens in all), generated once and cached with the target's top-{c["top_k"]} next-token
  distribution at every continuation position
- loss: forward KL(p_target || p_draft) over the target's top-{c["top_k"]} (renormalised), per continuation token
- held-out: {held_out}

## Training

| | |
|---|---|
| steps | {c["steps"]} x {c["batch_size"]} sequences |
| optimizer | {optimizer} |
| wall time | {wall_time} |
| weights | {c["dtype"]} safetensors |

Loss curve (train: weighted top-k KL, mean since the previous row; held-out: full-vocabulary KL, nats/token):

| step | train loss | held-out KL |
|---|---|---|
{curve}

## Focus

{focus_text}
Mean loss weight per token type over the training tokens:

| type | tokens | mean weight |
|---|---|---|
{eff}

## Before / after (held-out `{c["validation"]}`, greedy, k={c["k"]})

| | {c["draft"]} | {c["name"]} |
|---|---|---|
| KL(p_t ‖ p_d), nats/token | {_fmt(c["kl_before"])} | {_fmt(c["kl_after"])} |
| alpha | {_fmt(c["alpha_before"], ".3f")} | {_fmt(c["alpha_after"], ".3f")} |
| tokens per round | {_fmt(c["tokens_per_round_before"], ".2f")} | {_fmt(c["tokens_per_round_after"], ".2f")} |
| output == target-only | {c["lossless_before"]} | {c["lossless_after"]} |

(after: measured on the saved {c["dtype"]} weights, reloaded.)

## Reproduce

```
{c["command"]}
```
"""


def config_record(cfg: TrainingConfig) -> dict:
    d = asdict(cfg)
    d["warmup_steps"] = cfg.warmup_steps or min(50, max(1, cfg.steps // 10))
    return d
