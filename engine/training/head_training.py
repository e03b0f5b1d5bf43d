"""Train an EAGLE-3 head (engine/models/eagle3.py) on the target's own hidden states: `draftlab train-head`.

Data, as distillation's (engine/training/data.py; engine/training/distill.py's stages, checkpoints and records
are reused): the target's greedy continuation of every training prompt (exactly what target-only decoding emits),
plus `samples - 1` drawn at temperature 1; prompts that are conversations arrive already rendered through the
target's chat template. The draft vocabulary is the `draft_vocab_size` target ids most frequent in those
continuations (`d2t` / `t2d`).

A step draws `batch_size` sequences and runs the target over them once, without gradients (online, as SpecForge's
online mode: nothing per token is stored, so it scales to real targets): the aux hidden states (vLLM's convention,
`hidden_states[i]` for i in `aux_layers`) and the target's next-token logits. Then the head runs the training-time
test (TTT) for S steps, exactly the chain it drafts at inference (engine/decoding/drafting.py Eagle3Drafter):

    step 0, root p:  token x[p+1] with the target's state at p, at position p     -> predicts x[p+2]
    step j, root p:  token x[p+1+j] with the head's step j-1 output at root p,
                     at position p+j, attending to step 0's entries 0..p and to
                     root p's own entries of steps 1..j (its draft chain)          -> predicts x[p+2+j]

Loss: sum_j 0.8^j x mean over the continuation tokens of forward KL(p_target || p_head) on the draft vocabulary
(the target's distribution renormalised over it; a position whose target argmax lies outside the draft vocabulary
cannot be drafted and is left out, as SpecForge does), weighted per token by the `--focus-from` profile (type of
the predicted token x draft position j+1, mean 1). Measured along the run on the held-out prompts' greedy
continuations (teacher-forced, exact for greedy speculation, since an accepted prefix IS the target's text):
accuracy per step, the conditional acceptance per draft position, and the simulated acceptance length
1 + E[leading correct steps] at k = S. Before and after: greedy speculation through the engine's loop (alpha,
tokens per round, lossless).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from engine.config.head_settings import MAX_TTT_STEPS, parse_aux_layers  # noqa: F401 (parse_aux_layers: the CLI reads it here)
from engine.decoding.aux_states import AuxStates
from engine.errors import DraftLabError
from engine.models import eagle3
from engine.models.loading import LoadedModel, ModelPair
from engine.text.token_types import TokenTyper
from engine.training import data
from engine.training import distill as ds
from engine.training.data import Sequence

STEP_DECAY = 0.8  # loss weight of TTT step j: 0.8^j (SpecForge's)
BEFORE_PROMPTS = 8  # held-out prompts the fresh head is decoded on (its "before" figures through the loop)


@dataclass
class HeadConfig:
    steps: int
    lr: float = 1e-3
    max_new_tokens: int = 128
    batch_size: int = 8  # sequences per step
    ttt_steps: int = 4  # S: draft positions trained (the chain length it learns to draft)
    draft_vocab_size: int = 0  # 0: every target id (at most 32000)
    aux_layers: list[int] | None = None  # None: vLLM's default (2, L/2, L-3)
    warmup_steps: int = 0  # 0: 10 % of steps (at most 50)
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    seed: int = 0
    eval_points: int = 8
    samples: int = 1
    generation_batch: int = 32
    k: int = 0  # draft length of the held-out alpha measurement; 0: ttt_steps
    profile_k: int = 0  # draft length of the focus profile; 0: k
    norm_before_fc: bool = False  # an RMSNorm over the aux states before fc: vLLM 0.32 applies it, SGLang never

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps <= 0:
            raise DraftLabError(f"--steps must be a positive integer (got {self.steps}); use e.g. --steps 600")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise DraftLabError(f"--lr must be a positive number (got {self.lr}); use e.g. --lr 1e-3")
        if not 1 <= self.ttt_steps <= MAX_TTT_STEPS:
            raise DraftLabError(
                f"--ttt-steps must be 1 to {MAX_TTT_STEPS} (got {self.ttt_steps}); use e.g. --ttt-steps 4"
            )
        if self.draft_vocab_size < 0:
            raise DraftLabError(f"--draft-vocab-size must be >= 1 (got {self.draft_vocab_size}); e.g. 32000")
        if self.max_new_tokens <= 0 or self.batch_size <= 0 or self.samples <= 0:
            raise DraftLabError("max new tokens, batch size and samples must be positive")
        self.k = self.k or self.ttt_steps


def aux_layers_for(target_model, wanted: list[int] | None) -> list[int]:
    """The aux-layer ids to train with, checked against the target's decoder layers."""
    layers = target_model.config.get_text_config(decoder=True).num_hidden_layers
    ids = wanted if wanted is not None else eagle3.default_aux_layers(layers)
    if max(ids) >= layers:
        raise DraftLabError(
            f"--aux-layers {','.join(map(str, ids))} names layer {max(ids)}, but the target has "
            f"decoder layers 0..{layers - 1}; use ids below {layers} or auto"
        )
    return sorted(ids)  # vLLM concatenates the aux states in ascending id order (models/interfaces.py:1578)


def check_vocab_size(size: int, vocab: int) -> None:
    """Refuse a draft vocabulary larger than the target's (never clamped silently: the card would record a size
    the head does not have)."""
    if size > vocab:
        raise DraftLabError(
            f"--draft-vocab-size {size} is more than the target's vocabulary of {vocab:,} tokens; "
            f"use 1 to {vocab}, or leave it out for the whole vocabulary (at most 32000)"
        )


def draft_vocabulary(seqs: list[Sequence], vocab: int, size: int) -> torch.Tensor:
    """The `size` target ids most frequent in the continuations (then in the prompts, then by id), sorted."""
    size = min(size or vocab, vocab, 32000 if not size else vocab)
    counts = torch.zeros(vocab, dtype=torch.float64)
    for s in seqs:
        counts.index_add_(
            0,
            torch.tensor(s.continuation, dtype=torch.long) % vocab,
            torch.ones(len(s.continuation), dtype=torch.float64),
        )
        counts.index_add_(
            0,
            torch.tensor(s.prompt_ids, dtype=torch.long) % vocab,
            torch.full((len(s.prompt_ids),), 1e-6, dtype=torch.float64),
        )
    counts -= torch.arange(vocab, dtype=torch.float64) * 1e-12  # ties: the lower id first
    return counts.topk(size).indices.sort().values


# --- the training-time test ------------------------------------------------------------------------------------


def _heads(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    b, t, _ = x.shape
    return x.view(b, t, n, dim).transpose(1, 2)


def ttt_logits(head: eagle3.Eagle3Head, ids: torch.Tensor, states: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's draft-vocabulary logits [B, W, draft_vocab] of each TTT step j < steps for every root p < W,
    with W = T - 1 (module docstring): ids [B, T] the sequences' tokens, states [B, T, aux x hidden] the target's
    aux states (only roots' states are read). The exact computation Eagle3Head.forward does with its KV cache for
    the chain drafted from root p (tests/test_head_training.py checks them equal)."""
    b, t = ids.shape
    w = t - 1
    layer, attn = head.layers[0], head.layers[0].self_attn
    nh, nkv = head.config.num_attention_heads, head.config.num_key_value_heads
    dim, rep = attn.head_dim, head.config.num_attention_heads // head.config.num_key_value_heads
    state = head.combine(states[:, :w])
    causal = torch.ones(w, w, dtype=torch.bool, device=ids.device).tril()
    keys0 = values0 = None
    chain: list[tuple[torch.Tensor, torch.Tensor]] = []
    out = []
    for j in range(steps):
        tokens = torch.zeros(b, w, dtype=torch.long, device=ids.device)
        tokens[:, : max(0, t - 1 - j)] = ids[:, 1 + j :]
        embeds = layer.input_layernorm(head.embed_tokens(tokens).to(state.dtype))
        if layer.norm_before_residual:
            normed = layer.hidden_norm(state)
            residual = normed
        else:
            residual, normed = state, layer.hidden_norm(state)
        x = torch.cat([embeds, normed], -1)
        q, k, v = _heads(attn.q_proj(x), nh, dim), _heads(attn.k_proj(x), nkv, dim), _heads(attn.v_proj(x), nkv, dim)
        positions = (torch.arange(w, device=ids.device) + j)[None].expand(b, w)
        cos, sin = head.rotary_emb(x, position_ids=positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        if keys0 is None or values0 is None:  # step 0 (j == 0): every step attends causally to its keys and values
            keys0, values0 = k, v
        else:
            chain.append((k, v))
        scores = [(q @ keys0.transpose(-1, -2)).masked_fill(~causal, float("-inf"))]
        scores += [(q * ck).sum(-1, keepdim=True) for ck, _ in chain]
        weights = (torch.cat(scores, -1) * attn.scaling).float().softmax(-1).to(q.dtype)
        mixed = weights[..., :w] @ values0
        for i, (_, cv) in enumerate(chain):
            mixed = mixed + weights[..., w + i : w + i + 1] * cv
        attended = attn.o_proj(mixed.transpose(1, 2).reshape(b, w, nh * dim))
        residual = attended + residual
        state = layer.mlp(layer.post_attention_layernorm(residual)) + residual
        out.append(head.lm_head(head.norm(state)))
    return out


@torch.no_grad()
def target_features(target_model, aux_layers: list[int], ids: torch.Tensor, vocab: int):
    """One target forward over right-padded ids [B, T] (causal: real tokens never see the padding): the aux states
    [B, T, len(aux) x hidden] and the logits [B, T, vocab], in float32."""
    with AuxStates(target_model, aux_layers) as aux:
        out = target_model(input_ids=ids, **aux.kwargs)
    states = aux.states(out).float()
    return states, out.logits[..., :vocab].float()


@dataclass
class StepStats:
    """Per TTT step over a batch: the loss and what greedy drafting would accept."""

    loss: torch.Tensor
    tokens: list[int]  # positions counted, per step
    correct: list[int]  # of those, head argmax == target argmax
    reached: list[int]  # roots with every step counted whose steps 0..j-1 were all correct
    hits: list[int]  # ... and step j correct too


def _shifted(x: torch.Tensor, j: int, w: int) -> torch.Tensor:
    """x[:, 1 + j : 1 + j + w] padded with zeros to width w (the value at target position q = p + 1 + j)."""
    out = x.new_zeros(x.shape[0], w, *x.shape[2:])
    part = x[:, 1 + j : 1 + j + w]
    out[:, : part.shape[1]] = part
    return out


def step_stats(
    head: eagle3.Eagle3Head,
    seqs: list[Sequence],
    target_model,
    aux_layers: list[int],
    vocab: int,
    steps: int,
    device,
) -> StepStats:
    """The TTT loss of a batch and its greedy acceptance figures (module docstring)."""
    ids, lengths = data.pad_batch(seqs, device)
    states, logits = target_features(target_model, aux_layers, ids, vocab)
    b, w = ids.shape[0], ids.shape[1] - 1
    draft_ids = head.target_ids()
    in_draft = torch.zeros(vocab, dtype=torch.bool, device=device)
    in_draft[draft_ids] = True
    best, teacher = logits.argmax(-1), logits[..., draft_ids].log_softmax(-1)  # over the draft vocabulary
    del logits
    prompt = torch.tensor([len(s.prompt_ids) for s in seqs], device=device)[:, None]
    length = torch.tensor(lengths, device=device)[:, None]
    roots = torch.arange(w, device=device)[None]
    full = roots + steps <= length - 1  # every step's target position q = p + 1 + j is at most L - 2
    total = torch.zeros((), device=device)
    stats = StepStats(total, [], [], [], [])
    alive = torch.ones(b, w, dtype=torch.bool, device=device)
    for j, draft_logits in enumerate(ttt_logits(head, ids, states, steps)):
        q = roots + 1 + j
        valid = (q >= prompt - 1) & (q <= length - 2)  # predicts a continuation token
        target_best, logp_t = _shifted(best, j, w), _shifted(teacher, j, w)
        use = valid & in_draft[target_best]  # a token outside the draft vocabulary cannot be drafted
        kl = (logp_t.exp() * (logp_t - draft_logits.float().log_softmax(-1))).sum(-1)
        weight = use.float() * focus_weights(seqs, j, w, device)
        if bool(use.any()):
            total = total + STEP_DECAY**j * (kl * weight).sum() / use.sum()
        correct = (draft_ids[draft_logits.argmax(-1)] == target_best) & valid
        counted = valid & full
        stats.tokens.append(int(valid.sum()))
        stats.correct.append(int(correct.sum()))
        stats.reached.append(int((alive & counted).sum()))
        alive = alive & correct
        stats.hits.append(int((alive & counted).sum()))
    stats.loss = total
    return stats


def focus_weights(seqs: list[Sequence], j: int, w: int, device) -> torch.Tensor:
    """The focus weight [B, W] of step j at each root (1 where a sequence has none)."""
    out = torch.ones(len(seqs), w, device=device)
    for row, s in enumerate(seqs):
        table = s.head_weights
        if table is not None:
            values = table[j].to(device)[:w]
            out[row, : values.shape[0]] = values
    return out


def acceptance(tokens: list[int], correct: list[int], reached: list[int], hits: list[int]) -> dict:
    """Accuracy per step, conditional acceptance per draft position, and the simulated acceptance length
    1 + sum_j prod_{i<=j} a_i (the mean tokens a greedy round at k = S emits)."""
    accuracy = [c / n if n else None for c, n in zip(correct, tokens)]
    per_position = [h / r if r else None for h, r in zip(hits, reached)]
    length, survive = 1.0, 1.0
    for rate in per_position:
        survive *= rate or 0.0
        length += survive
    return {"accuracy": accuracy, "per_position": per_position, "acceptance_length": length}


# --- the trainer -----------------------------------------------------------------------------------------------


def focus_tables(
    kinds: list[list[str]], prompt_lengths: list[int], steps: int, type_weights: dict, position_weights: dict
) -> tuple[list[torch.Tensor], dict]:
    """The training-time test's loss weights from a focus profile: for each sequence (its tokens' types, its prompt
    length) a (steps, length - 1) table whose [j, root] entry weighs the token the chain from `root` predicts at
    step j (token root + 2 + j, a continuation token) by its type's weight x position j + 1's weight; entries that
    predict no continuation token keep 1. Normalised to mean 1 over the weighted entries. Also the summary the
    card shows: per type its entries and mean weight, per position the same."""
    pos_w = {int(k): float(v) for k, v in position_weights.items()}
    count: dict[str, int] = {}
    total: dict[str, float] = {}
    at_count, at_total = [0] * steps, [0.0] * steps  # per position j + 1
    tables = []
    for seq_kinds, p_len in zip(kinds, prompt_lengths):
        length = len(seq_kinds)
        per_token = torch.tensor([float(type_weights.get(k, 1.0)) for k in seq_kinds])
        table = torch.ones(steps, max(0, length - 1))
        roots = torch.arange(max(0, length - 1))
        for j in range(steps):
            predicted = roots + 2 + j
            valid = (predicted >= p_len) & (predicted < length)
            table[j, valid] = per_token[predicted[valid]] * pos_w.get(j + 1, 1.0)
            for kind, m in Counter(seq_kinds[max(p_len, 2 + j) : length]).items():
                weight = m * float(type_weights.get(kind, 1.0)) * pos_w.get(j + 1, 1.0)
                count[kind], total[kind] = count.get(kind, 0) + m, total.get(kind, 0.0) + weight
                at_count[j], at_total[j] = at_count[j] + m, at_total[j] + weight
        tables.append(table)
    n = sum(count.values())
    mean = sum(total.values()) / n if n else 1.0
    summary = {
        "by_type": {ty: {"tokens": count[ty], "mean_weight": total[ty] / count[ty] / mean} for ty in sorted(count)},
        "by_position": {
            j + 1: {"tokens": at_count[j], "mean_weight": at_total[j] / at_count[j] / mean}
            for j in range(steps)
            if at_count[j]
        },
    }
    return [t / mean for t in tables], summary


class HeadTrainer(ds.Distiller[HeadConfig]):
    """One head-training run, in the stages and records of ds.Distiller (prepare, train, checkpoints), with the
    head built in prepare() once the draft vocabulary is known. Extra record fields: "eval" carries
    `acceptance_length`, `per_position` and `accuracy` (held-out, teacher-forced); "prepared" the draft vocabulary
    size and aux layers; "before" the fresh head's greedy speculation figures."""

    def __init__(
        self,
        pair: ModelPair,
        train_prompts: list[str],
        val_prompts: list[str],
        cfg: HeadConfig,
        type_weights: dict | None = None,
        position_weights: dict | None = None,
        name: str = "head",
        verifier: str | None = None,
    ):
        self.pair = ModelPair(pair.target, None, pair.device, pair.dtype, pair.vocab_size)
        self.cfg, self.name = cfg, name
        self.verifier = verifier or pair.target.name
        self.train_prompts, self.val_prompts = list(train_prompts), list(val_prompts)
        self.type_weights, self.position_weights = type_weights, position_weights
        self.aux_layers = aux_layers_for(pair.target.model, cfg.aux_layers)
        check_vocab_size(cfg.draft_vocab_size, pair.vocab_size)
        self.train_seqs: list[Sequence] = []
        self.val_seqs: list[Sequence] = []
        self.prepared = self.before = self.kl_before = None
        self.draft_ids: torch.Tensor | None = None
        self.step, self.curve, self.window, self.seconds = 0, [], [], 0.0
        self.opt = self.gen = None

    @property
    def head(self) -> eagle3.Eagle3Head:
        return self.draft.model

    def _build_head(self, draft_ids: torch.Tensor) -> None:
        target = self.pair.target
        target.model.get_input_embeddings().weight.requires_grad_(False)  # shared and frozen, never saved
        torch.manual_seed(self.cfg.seed)
        head = eagle3.new_head(
            target.model, self.aux_layers, draft_ids, self.verifier, norm_before_fc=self.cfg.norm_before_fc
        ).to(self.pair.device, torch.float32)
        self.draft_ids = draft_ids
        self.pair = ModelPair(
            target,
            LoadedModel(self.name, self.name, head, target.tokenizer),
            self.pair.device,
            self.pair.dtype,
            self.pair.vocab_size,
        )

    def prepare(self) -> Iterator[dict]:
        cfg, pair = self.cfg, self.pair
        torch.manual_seed(cfg.seed)
        pair.target.model.eval()
        yield {"kind": "phase", "phase": "target continuations (train)"}
        train: list[Sequence] = []
        total = cfg.samples * len(self.train_prompts)
        # Training responses are decoded in batches, greedy ones too (their last bits may differ from target-only
        # decoding's: harmless for training data); the held-out ones one by one, exactly as target-only decoding.
        for greedy, prompts in ((True, self.train_prompts), (False, self.train_prompts * (cfg.samples - 1))):
            for s in data.sample_batched(pair, prompts, cfg.max_new_tokens, cfg.seed, cfg.generation_batch, greedy):
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
        yield {"kind": "phase", "phase": "draft vocabulary and focus"}
        draft_ids = draft_vocabulary(train, pair.vocab_size, cfg.draft_vocab_size)
        self._build_head(draft_ids)
        summary = self._assign_focus(train)
        self.train_seqs, self.val_seqs = train, val
        self.prepared = {
            "kind": "prepared",
            "train_sequences": len(train),
            "train_tokens": sum(len(s.continuation) for s in train),
            "validation_sequences": len(val),
            "validation_tokens": sum(len(s.continuation) for s in val),
            "weights": summary,
            "draft_vocab_size": int(draft_ids.numel()),
            "aux_layers": self.aux_layers,
        }
        yield self.prepared
        yield {"kind": "phase", "phase": "held-out figures before training"}
        figures = self.measure(self.val_seqs)
        self.kl_before = figures["kl"]
        # The fresh head drafts almost nothing right, so each of its rounds costs k head steps for one token: its
        # figures through the loop come from the first BEFORE_PROMPTS held-out prompts, not all of them.
        few = self.val_prompts[:BEFORE_PROMPTS]
        self.before = ds.greedy_alpha(self.pair, few, cfg.max_new_tokens, cfg.k, self.val_seqs[: len(few)], "eagle3")
        self.curve = [{"step": 0, "train_loss": None, **figures}]
        yield {"kind": "before", **figures, **self.before}

    def _assign_focus(self, seqs: list[Sequence]) -> dict:
        """Per (root, step) loss weights from the focus profile (focus_tables), set on each sequence; the mean
        weight per type and per position."""
        typer = TokenTyper(self.pair.tokenizer)
        kind_of: dict[int, str] = {}
        for t in {t for s in seqs for t in s.ids}:
            kind_of[t] = typer.describe(t)[1]
        kinds = [[kind_of[t] for t in s.ids] for s in seqs]
        tables, summary = focus_tables(
            kinds,
            [len(s.prompt_ids) for s in seqs],
            self.cfg.ttt_steps,
            self.type_weights or {},
            self.position_weights or {},
        )
        for s, table in zip(seqs, tables):
            s.head_weights = table if (self.type_weights or self.position_weights) else None
        return summary

    def _loss(self, seqs: list[Sequence]) -> torch.Tensor:
        return step_stats(
            self.head,
            seqs,
            self.pair.target.model,
            self.aux_layers,
            self.pair.vocab_size,
            self.cfg.ttt_steps,
            self.pair.device,
        ).loss

    @torch.no_grad()
    def measure(self, seqs: list[Sequence], batch: int = 8) -> dict:
        """Held-out, teacher-forced: the loss ("kl": the TTT objective without focus weights), accuracy per step,
        conditional acceptance per draft position and the simulated acceptance length at k = S."""
        was = self.head.training
        self.head.eval()
        tokens, correct, reached, hits = ([0] * self.cfg.ttt_steps for _ in range(4))
        loss, batches = 0.0, 0
        for chunk in data.chunks(seqs, batch):
            st = step_stats(
                self.head,
                chunk,
                self.pair.target.model,
                self.aux_layers,
                self.pair.vocab_size,
                self.cfg.ttt_steps,
                self.pair.device,
            )
            loss += float(st.loss)
            batches += 1
            for acc, new in zip((tokens, correct, reached, hits), (st.tokens, st.correct, st.reached, st.hits)):
                for j, n in enumerate(new):
                    acc[j] += n
        self.head.train(was)
        return {"kl": loss / batches if batches else float("nan"), **acceptance(tokens, correct, reached, hits)}

    def _eval(self, start: float) -> dict:
        import time

        point = {
            "step": self.step,
            "train_loss": sum(self.window) / len(self.window) if self.window else None,
            **self.measure(self.val_seqs),
        }
        self.window = []
        self.curve.append(point)
        self.seconds = time.perf_counter() - start
        return {"kind": "eval", **point}

    # --- checkpoints: the draft vocabulary is data, the head's weights state ---

    def _data(self) -> dict:
        saved = super()._data()
        saved["draft_ids"] = self.draft_ids
        saved["head_weights"] = [s.head_weights for s in self.train_seqs]
        saved["curve0"] = self.curve[:1]
        return saved

    def _restore(self, saved: dict) -> None:
        super()._restore(saved)
        for s, w in zip(self.train_seqs, saved.get("head_weights") or []):
            s.head_weights = w
        self.curve = list(saved.get("curve0") or self.curve)
        self._build_head(saved["draft_ids"])

    def _fingerprint(self) -> dict:
        cfg = asdict(self.cfg)
        return {
            "config": cfg,
            "target": self.pair.target.name,
            "head": self.name,
            "aux": self.aux_layers,
            "train": self.train_prompts,
            "validation": self.val_prompts,
            "type_weights": self.type_weights or {},
            "position_weights": {str(k): v for k, v in (self.position_weights or {}).items()},
        }
