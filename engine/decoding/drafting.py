"""Drafting strategies: what proposes the tokens of a round, for the B rows the loop still runs (batch 1 is the
one-row case; there is no second set of drafters).

The loop (engine/decoding/speculative.py) only talks to the `Drafter` protocol below, the way transformers' candidate
generators plug into generate(). Each strategy is one class here, declared once in engine/config/drafter_specs.py (its
name, parameter and bounds, and the capabilities the rest of the product reads: needs a draft model, needs the
target's hidden states, constant k or not, its mapping per serving engine) and registered here under that name by
`@drafter(name)` on its class (DRAFTERS; a declaration without a class fails at import):

    model            ModelDrafter: the draft model, a constant k per round (Leviathan et al.)
    heuristic        HeuristicDrafter: the draft model; k starts at --k, +2 after a round whose drafts were all
                     accepted, else -1 (min 1): transformers' num_assistant_tokens_schedule="heuristic"
    confidence:T     ConfidenceDrafter: the draft model; a round stops after the first draft whose top probability
                     is below T (that draft is kept, as transformers' assistant_confidence_threshold does)
    prompt-lookup:N  PromptLookupDrafter: no model; the longest n-gram (N >= n >= 1) ending the sequence that
                     occurred earlier proposes the tokens that followed its earliest occurrence
    suffix:D         SuffixDrafter (engine/decoding/suffix_tree.py): no model; the most frequent continuation of the
                     longest match of the context's suffix in suffix trees of depth D (vLLM's suffix decoding)
    eagle3           Eagle3Drafter: an EAGLE-3 head (engine/models/eagle3.py) as the draft model, fed the target's own
                     hidden states from each verify forward (TargetStates); a constant k per round
    early-exit:L     EarlyExitDrafter: the draft model cut to its first L decoder layers, then its final norm and LM
                     head (`early_exit`, a copy sharing the weights); LayerSkip's self-speculation with the target as
                     its own draft; a constant k per round

    make_drafter("confidence:0.5", draft_model=m, vocab_size=V, k=4, cfg=cfg)

With SamplingConfig.tree_topk > 1, a drafter whose spec `branches` (model, eagle3) drafts a token tree instead of
one chain (engine/decoding/token_trees.py; the target verifies it with engine/decoding/tree_verification.py).

Every drafter is lossless through the same verification (engine/decoding/verification.py); a drafter without a
distribution proposes point masses (p_d = 1 on its token) and no logits (KL is NaN). With
SamplingConfig.draft_sampling = "greedy" a model drafter proposes its argmax as a point mass too (its logits still
give KL; the confidence policy still reads its distribution).

Randomness: row r draws its drafts from generators[r], the generator of its prompt, in the order a one-row decode
of that prompt draws them, so a row never depends on the rows beside it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import torch

from engine.config.drafter_specs import SPECS, DeclarationError, DrafterSpec, parse_drafter
from engine.decoding.aux_states import decoder_layers
from engine.decoding.batched_cache import BatchCache, left_pad, to_device
from engine.decoding.sampling import SamplingConfig, probabilities, sample_rows
from engine.decoding.suffix_tree import Request, SuffixCache
from engine.decoding.token_trees import DraftTree, draft_tree
from engine.decoding.torch_types import Model
from engine.errors import DraftLabError
from engine.models.vocab_bridge import VocabBridge

# Realign a drafter's cache when its width exceeds this many times its longest row plus the slack (holes from
# rejected drafts; engine/decoding/batched_cache.py). The loop applies the same rule to the target's cache.
COMPACT_SLACK = 16
# A drafter's parameter, as engine.config.drafter_specs.parse_drafter reads it from the spec (`confidence:0.5`).
DrafterParameter = int | float | None


@dataclass
class Proposal:
    """What a drafter proposes for the b running rows of one round."""

    tokens: torch.Tensor  # [b, K] proposed ids, 0 past row r's ks[r]
    probs: torch.Tensor  # [b, K, V] processed draft distributions (one-hot rows for point masses), 0 past ks[r]
    raw_logits: torch.Tensor | None  # [b, K, V] unprocessed draft logits (for KL), None without a model
    ks: list[int]  # drafts each row proposed (host)
    valid: torch.Tensor | None  # [b, K] True for the first ks[r] slots of row r; None when every ks[r] == K
    forwards: int  # batched draft forwards spent on this proposal
    # A token tree (engine/decoding/token_trees.py; SamplingConfig.tree_topk > 1): tokens/probs/raw_logits/valid are
    # its nodes [b, N], each scored at its parent, and ks each row's depth. None: a chain.
    tree: DraftTree | None = None

    @classmethod
    def empty(cls, batch: int, vocab_size: int, device: torch.device) -> Proposal:
        """No drafts in any row: the round is one plain target step."""
        rows = torch.empty(batch, 0, vocab_size, device=device)
        return cls(torch.empty(batch, 0, dtype=torch.long, device=device), rows, rows, [0] * batch, None, 0)

    @classmethod
    def point_masses(cls, follows: list[list[int]], vocab_size: int, device: torch.device) -> Proposal:
        """Tokens proposed without a distribution (row r proposes follows[r]): p_d is a one-hot row per token, so
        verification accepts token x with probability p_t(x) and corrects from p_t with x removed."""
        ks = [len(f) for f in follows]
        width = max(ks, default=0)
        if width == 0:
            return cls.empty(len(follows), vocab_size, device)
        tokens = to_device([f + [0] * (width - len(f)) for f in follows], device)
        slots = slot_mask(ks, width, device)
        probs = torch.nn.functional.one_hot(tokens, vocab_size).float()
        if slots is not None:
            probs = probs.masked_fill(~slots[..., None], 0.0)
        return cls(tokens, probs, None, ks, slots, forwards=0)


def slot_mask(ks: list[int], width: int, device: torch.device) -> torch.Tensor | None:
    """[b, width] True for row r's first ks[r] slots; None when every row fills the width."""
    if all(k == width for k in ks):
        return None
    return torch.arange(width, device=device)[None, :] < to_device(ks, device)[:, None]


class Drafter(Protocol):
    """The one drafting protocol. `seqs[r]` is row r's committed tokens on the device (1-D), `history[r]` the same
    on the host; both hold only the rows still running, in batch order. One round:

        propose(seqs, history, generators, caps) -> Proposal   row r proposes at most caps[r] tokens
        rollback(kept)      device tensor [b]: row r keeps its first kept[r] tokens (before the round's transfer)
        trailing_holes()    a 0-d device tensor read with that transfer (None: the drafter keeps no device cache)
        settle(lengths, accepted, trailing, states)   after the transfer: row r's round started at lengths[r]
                            and kept accepted[r] drafts; trailing is what trailing_holes() read; states is None,
                            except for a drafter whose spec needs_hidden_states: then a TargetStates holding the
                            target's hidden_states of the drafter's `hidden_layers` from the round's verify forward
                            (no extra target forward), for the positions each row committed
    and between rounds `select(rows)` (finished rows leave) and `maybe_compact(ratio)`. `start` begins a batch;
    `finish(prompt_indices, outputs)` ends it with every row's output (a drafter that learns from earlier
    responses keeps them there). The first round's verify forward is the target's prefill: its states are the
    first a drafter reading them gets."""

    spec: ClassVar[DrafterSpec]  # its declaration (@drafter sets it)
    # hidden_layers: list[int]   only when spec.needs_hidden_states: the target's hidden_states indices it reads

    def start(self, seqs: list[torch.Tensor], history: list[list[int]], prompt_indices: list[int]) -> None: ...

    def propose(
        self, seqs: list[torch.Tensor], history: list[list[int]], generators: list[torch.Generator], caps: list[int]
    ) -> Proposal: ...

    def rollback(self, kept: torch.Tensor) -> None: ...

    def trailing_holes(self) -> torch.Tensor | None: ...

    def settle(
        self, lengths: list[int], accepted: list[int], trailing: int | None, states: TargetStates | None = None
    ) -> None: ...

    def select(self, rows: list[int]) -> None: ...

    def maybe_compact(self, ratio: float) -> None: ...

    def finish(self, prompt_indices: list[int], outputs: list[list[int]]) -> None: ...

    @classmethod
    def from_spec(
        cls,
        param: DrafterParameter,
        *,
        draft_model: Model | None,
        vocab_size: int,
        k: int,
        cfg: SamplingConfig,
        eos_ids: Iterable[int],
    ) -> Drafter:
        """The drafter of a spec whose parameter is `param` (how make_drafter builds a registered class)."""
        ...


@dataclass
class TargetStates:
    """What a drafter that reads the target's hidden states (DrafterSpec.needs_hidden_states) gets from one verify
    forward: `states` [b, P + K, layers x hidden], the target's hidden_states of the drafter's `hidden_layers`
    concatenated, where row r's `fed[r]` pending tokens fill the last of the first P columns (left-padded) and
    column P + i scored draft i."""

    states: torch.Tensor
    fed: list[int]
    pending_width: int

    def committed(self, row: int, accepted: int) -> torch.Tensor:
        """Row `row`'s states at the positions it committed this round, in order: its pending tokens, then its
        `accepted` drafts ([fed + accepted, D]; a view: no copy, no sync)."""
        return self.states[row, self.pending_width - self.fed[row] : self.pending_width + accepted]


# --- the registry: engine/config/drafter_specs.py declares each drafter, @drafter(name) registers its class -------

DRAFTERS: dict[str, type[Drafter]] = {}  # the class of every declared drafter, by name (complete: checked at import)
_Class = TypeVar("_Class", bound="type[Drafter]")


def drafter(name: str) -> Callable[[_Class], _Class]:
    """Class decorator: the class implements the drafter engine/config/drafter_specs.py declares as `name`, and gets
    that declaration as its `spec`. A name SPECS lacks, or a second class for a name, fails at import."""
    if name not in SPECS:
        raise DeclarationError(
            f"@drafter({name!r}): engine/config/drafter_specs.py declares no drafter {name!r} (it declares "
            f"{', '.join(SPECS)}); add its DrafterSpec to SPECS"
        )

    def register(cls: _Class) -> _Class:
        if name in DRAFTERS:
            raise DeclarationError(
                f"@drafter({name!r}) on {cls.__name__}: {DRAFTERS[name].__name__} already implements {name!r}"
            )
        cls.spec = SPECS[name]
        DRAFTERS[name] = cls
        return cls

    return register


# --- drafting with a draft model -------------------------------------------------------------------------------


@drafter("model")
class ModelDrafter:
    """A small causal LM drafting for B rows with one cache (engine/decoding/batched_cache.py), a constant k per round
    (fewer when a row's cap is lower). A round's first draft forward feeds each row what its cache lacks (left-padded:
    one token, or two after a bonus round, so the draft stays in step without an extra forward); each further step
    feeds the last draft of the rows still drafting (the others' columns are holes). A row's last draft is never
    fed: its continuation is only needed if it is accepted. Subclasses change the policy through `next_ks` (k for
    the next round) and `stop_rows` (end a row's round early)."""

    spec: ClassVar[DrafterSpec]  # set by @drafter

    def __init__(self, model: Model, vocab_size: int, k: int, cfg: SamplingConfig) -> None:
        self.lm = BatchCache(model, vocab_size)
        self.k = k  # each row's k at the start of a prompt
        self.cfg = cfg
        self.ks: list[int] = []  # each row's k for the next round
        self.cached: list[int] = []  # real tokens in each row's cache (host)
        self.proposed: list[int] = []
        # A draft scoring only part of the target's vocabulary (another tokenizer's intersection,
        # engine/models/vocab_bridge.py) gives no raw logits: KL(p_t || p_d) is infinite, recorded NaN.
        self.full_vocabulary = bool(getattr(model, "covers_target", lambda: True)())

    @classmethod
    def from_spec(
        cls,
        param: DrafterParameter,
        *,
        draft_model: Model | None,
        vocab_size: int,
        k: int,
        cfg: SamplingConfig,
        eos_ids: Iterable[int],
    ) -> Drafter:
        return cls(draft_model, vocab_size, k, cfg)

    def start(self, seqs: list[torch.Tensor], history: list[list[int]], prompt_indices: list[int]) -> None:
        self.lm.reset(len(seqs))
        self.ks = [self.k] * len(seqs)
        self.cached = [0] * len(seqs)
        if any(s.shape[0] > 1 for s in seqs):  # all but the last prompt token: the first proposal feeds that one
            ids, valid = left_pad([s[:-1] for s in seqs], self.lm.device)
            self.lm.forward(ids, valid, keep=1)
            self.cached = [s.shape[0] - 1 for s in seqs]

    def propose(
        self, seqs: list[torch.Tensor], history: list[list[int]], generators: list[torch.Generator], caps: list[int]
    ) -> Proposal:
        lm, cfg = self.lm, self.cfg.for_draft()  # the draft's own temperature, when set (lossless: see below)
        # Draft i (1-based) of a row of length L is predicted at draft position L + i - 2, which must exist.
        ks = [max(0, min(k, cap, lm.max_positions - s.shape[0] + 1)) for k, cap, s in zip(self.ks, caps, seqs)]
        if max(ks, default=0) == 0:
            self.proposed = ks
            return Proposal.empty(len(seqs), lm.vocab_size, lm.device)
        ids, valid = self.draft_inputs(seqs)
        if self.cfg.tree_topk > 1:  # a token tree: the top tree_topk children per node (deterministic)
            root = self.draft_forward(ids, valid)
            topk, size = self.cfg.tree_topk, self.cfg.tree_tokens
            drafted = draft_tree(lm, root, ks, topk, size, cfg, self.tree_step)
            self.cached, self.proposed = [s.shape[0] for s in seqs], ks  # the draft's cache: the committed prefix
            if drafted is None:
                return Proposal.empty(len(seqs), lm.vocab_size, lm.device)
            tree = drafted.tree
            raw = drafted.raw if self.full_vocabulary else None
            return Proposal(tree.tokens, drafted.probs, raw, ks, tree.valid, drafted.forwards, tree)
        tokens, probs, raw = [], [], []
        # probs are the distribution each draft was drawn from (at the draft's temperature): the target's
        # acceptance test min(1, p_t / p_d) and its residual use exactly these, which keeps any draft temperature
        # lossless. A greedy target verifies by argmax and needs no draft distribution at all.
        greedy_drafts = cfg.draft_sampling == "greedy" and not self.cfg.greedy
        for i in range(max(ks)):
            logits = self.draft_forward(ids, valid)
            p = probabilities(logits, cfg)
            if greedy_drafts:  # the argmax as a point mass (Proposal.point_masses' rule)
                token = p.argmax(-1)
                probs.append(torch.nn.functional.one_hot(token, p.shape[-1]).to(p.dtype))
            else:
                token = sample_rows(p, cfg, generators, [i < k for k in ks])
                probs.append(p)
            tokens.append(token)
            raw.append(logits)
            ks = self.stop_rows(p, i, ks)
            going = [i + 1 < k for k in ks]
            if not any(going):
                break
            ids, valid = tokens[-1][:, None], to_device(going, lm.device, torch.bool)[:, None]
        self.cached = [s.shape[0] + max(0, k - 1) for s, k in zip(seqs, ks)]
        self.proposed = ks
        width = len(tokens)
        slots = slot_mask(ks, width, lm.device)
        tokens, probs, raw = torch.stack(tokens, 1), torch.stack(probs, 1), torch.stack(raw, 1)
        if slots is not None:
            tokens = tokens.masked_fill(~slots, 0)
            probs = probs.masked_fill(~slots[..., None], 0.0)
        return Proposal(tokens, probs, raw if self.full_vocabulary else None, ks, slots, forwards=width)

    def draft_inputs(self, seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, valid) of a round's first draft forward: what each row's cache lacks, left-padded."""
        return left_pad([s[c:] for s, c in zip(seqs, self.cached)], self.lm.device)

    def draft_forward(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """One draft forward: the logits [b, V] that predict each row's next draft."""
        return self.lm.forward(ids, valid, keep=1)[:, 0]

    def tree_step(
        self,
        ids: torch.Tensor,
        valid: torch.Tensor,
        attend: torch.Tensor,
        positions: torch.Tensor,
        parent_slots: torch.Tensor,
    ) -> torch.Tensor:
        """One token-tree step (engine/decoding/token_trees.py TreeStep): the logits [b, topk, V] of the fed nodes."""
        return self.lm.forward(ids, valid, keep=ids.shape[1], attend=attend, positions=positions)

    def stop_rows(self, p: torch.Tensor, step: int, ks: list[int]) -> list[int]:
        """Each row's number of drafts this round, after draft `step` (0-based) was drawn from p [b, V] (a policy
        hook; never shortened here). It may look at p but not at the drawn tokens: deciding whether to draft on from
        the distribution keeps the loop lossless, and the drawn token is always kept."""
        return ks

    def next_ks(self, ks: list[int], proposed: list[int], accepted: list[int]) -> list[int]:
        """Each row's k for the next round (a policy hook; constant here)."""
        return ks

    def rollback(self, kept: torch.Tensor) -> None:
        self.lm.rollback(kept)

    def trailing_holes(self) -> torch.Tensor | None:
        return self.lm.trailing_holes()

    def settle(
        self, lengths: list[int], accepted: list[int], trailing: int | None, states: TargetStates | None = None
    ) -> None:
        self.cached = [min(c, n + a) for c, n, a in zip(self.cached, lengths, accepted)]
        self.ks = self.next_ks(self.ks, self.proposed, accepted)
        self.lm.trim(trailing or 0)

    def select(self, rows: list[int]) -> None:
        self.lm.select(rows)
        self.ks = [self.ks[r] for r in rows]
        self.cached = [self.cached[r] for r in rows]

    def maybe_compact(self, ratio: float) -> None:
        if self.lm.width > ratio * max(self.cached, default=0) + COMPACT_SLACK:
            self.lm.compact()

    def finish(self, prompt_indices: list[int], outputs: list[list[int]]) -> None:
        pass

    # Optional for a Drafter: the decoder adds this to its own peak (engine/decoding/memory.py).
    def peak_cache_bytes(self) -> int:
        return self.lm.peak_cache_bytes

    def reset_peak_cache_bytes(self) -> None:
        self.lm.reset_peak()


@drafter("heuristic")
class HeuristicDrafter(ModelDrafter):
    """transformers' num_assistant_tokens_schedule="heuristic" (AssistedCandidateGenerator.
    update_candidate_strategy), per row: after each round k += 2 if every proposed draft was accepted (counting the
    drafts actually proposed, k_r, not k), else k = max(1, k - 1). k restarts at --k with every prompt
    (transformers' "heuristic_transient"; plain "heuristic" carries k over to the next generate() call, which would
    make a prompt depend on its predecessors, on resumes and on the warm-up)."""

    def next_ks(self, ks: list[int], proposed: list[int], accepted: list[int]) -> list[int]:
        return [heuristic_next_k(k, p, a) for k, p, a in zip(ks, proposed, accepted)]


def heuristic_next_k(k: int, proposed: int, accepted: int) -> int:
    """The heuristic schedule's k for the next round (transformers' rule, verbatim)."""
    return k + 2 if accepted == proposed else max(1, k - 1)


@drafter("confidence")
class ConfidenceDrafter(ModelDrafter):
    """Drafts at most k tokens and stops a row's round after the first draft whose distribution's top probability
    is below T (llama.cpp --draft-p-min, transformers' assistant_confidence_threshold). The low-confidence draft
    itself is KEPT and verified, as in transformers (its ConfidenceCriteria is checked after the token is
    appended); llama.cpp drops it. Deciding on the top probability of the processed distribution, not on the drawn
    token, keeps the loop lossless. One host read of the top probabilities per step that can continue. T is fixed
    (transformers re-fits it during generation when scikit-learn is installed)."""

    def __init__(self, model: Model, vocab_size: int, k: int, cfg: SamplingConfig, threshold: float) -> None:
        super().__init__(model, vocab_size, k, cfg)
        self.threshold = threshold

    @classmethod
    def from_spec(
        cls,
        param: DrafterParameter,
        *,
        draft_model: Model | None,
        vocab_size: int,
        k: int,
        cfg: SamplingConfig,
        eos_ids: Iterable[int],
    ) -> Drafter:
        return cls(draft_model, vocab_size, k, cfg, float(_given(param)))

    def stop_rows(self, p: torch.Tensor, step: int, ks: list[int]) -> list[int]:
        if not any(step + 1 < k for k in ks):
            return ks
        low = (p.max(-1).values < self.threshold).tolist()
        return [step + 1 if low[r] and step + 1 < k else k for r, k in enumerate(ks)]


@drafter("early-exit")
class EarlyExitDrafter(ModelDrafter):
    """LayerSkip's self-speculation (Elhoushi et al. 2024; transformers' generate(assistant_early_exit=L)): the draft
    model cut to its first L decoder layers, then its own final norm and LM head, drafting as `model` does (a constant
    k per round). With the target as --draft it drafts with the target's own first layers, what LayerSkip checkpoints
    are trained for; any causal LM cut to L layers drafts too. The cut is a copy sharing the weights (`early_exit`):
    the draft model itself is never changed, so the very object verifying may be passed as its own draft."""

    @classmethod
    def from_spec(
        cls,
        param: DrafterParameter,
        *,
        draft_model: Model | None,
        vocab_size: int,
        k: int,
        cfg: SamplingConfig,
        eos_ids: Iterable[int],
    ) -> Drafter:
        return cls(early_exit(draft_model, int(_given(param))), vocab_size, k, cfg)


def early_exit(model: Model, layers: int) -> Model:
    """`model` cut to its first `layers` decoder layers, then its own final norm and LM head. A structural copy: the
    modules from the root down to the one holding the decoder layer list are copied (their parameters, buffers and
    every other submodule shared), that one gets a new list of the first `layers` layers, and each copied module's
    config is a copy counting `layers` layers (num_hidden_layers, GPT-2's n_layer, layer_types), so a KV cache is
    sized for them. `model` itself is left as it is. The layer list is the one aux_states.decoder_layers finds
    (Llama-style `model.layers`), else the model's only ModuleList as long as its layer count (GPT-2's `transformer.h`).
    A draft seen through another tokenizer (VocabBridge) is cut inside its bridge."""
    if isinstance(model, VocabBridge):
        return VocabBridge(early_exit(model.draft, layers), model.mapping, model.target_width)
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    count = int(getattr(text, "num_hidden_layers", 0) or 0)
    name = config.name_or_path or config.model_type
    lists = [
        (path, module)
        for path, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and count > 0 and len(module) == count
    ]
    found = decoder_layers(model)
    paths = [path for path, module in lists if module is found] or [path for path, _ in lists]
    if len(paths) != 1 or not paths[0]:
        raise DraftLabError(
            f"drafter early-exit:{layers} cannot find the decoder layers of the draft {name} (one list as long as "
            f"its config's num_hidden_layers); use --drafter model, or a Llama- or GPT-2-style draft"
        )
    if layers >= count:
        fix = (
            f"use early-exit:L with L below {count}, e.g. early-exit:{max(1, count // 4)}"
            if count > 1
            else "use a draft with more layers, or --drafter model"
        )
        raise DraftLabError(
            f"drafter early-exit:{layers} drafts with the first {layers} decoder layers, but the draft {name} has "
            f"{count}; {fix}"
        )
    cut = copy.copy(text)
    cut.num_hidden_layers = layers  # GPT-2's n_layer too (its attribute_map)
    if getattr(text, "layer_types", None) is not None:
        cut.layer_types = list(text.layer_types[:layers])
    configs = {id(text): cut}
    if text is not config:  # a config holding the decoder's (text_config): the copy holds the cut one
        outer = copy.copy(config)
        for key, value in vars(config).items():
            if value is text:
                setattr(outer, key, cut)
        configs[id(config)] = outer

    def copied(module: torch.nn.Module) -> torch.nn.Module:
        if "forward" in vars(module):  # a wrapper (accelerate's dispatch hook) bound to the original module
            raise DraftLabError(
                f"drafter early-exit:{layers} cannot cut the draft {name}: its forward is wrapped (dispatched over "
                f"devices); load the draft on one device"
            )
        twin = copy.copy(module)
        twin._modules = copy.copy(module._modules)  # its own submodule table: replacing one leaves `module`'s
        if id(getattr(module, "config", None)) in configs:
            twin.config = configs[id(module.config)]
        return twin

    *route, attribute = paths[0].split(".")
    root = holder = copied(model)
    for part in route:
        holder._modules[part] = copied(holder._modules[part])
        holder = holder._modules[part]
    holder._modules[attribute] = torch.nn.ModuleList(list(holder._modules[attribute])[:layers])
    return root


@drafter("eagle3")
class Eagle3Drafter(ModelDrafter):
    """An EAGLE-3 head (engine/models/eagle3.py) drafting for B rows from the target's own hidden states: one chain, a
    constant k per round (vLLM's EagleProposer with top-k 1). Head entry t of a row holds (token t + 1, the target's
    states at position t) at position t, so a row of length L predicts draft 1 from entry L - 2; draft i > 1 feeds
    draft i - 1 with the head's own pre-norm output (vLLM's hidden_prenorm). The target's states arrive with
    `settle` (TargetStates: the round's pending tokens and accepted drafts) and are fed by the next round's first
    draft forward: no extra target forward. A prompt's first round has no states yet, so it proposes nothing (one
    plain target step: the prefill, whose states seed the head; vLLM also drafts only after the prefill). Entries
    fed with the head's own states never outlive their round: `rollback` keeps only those fed with the target's,
    and the next round feeds the accepted positions again with the target's states (vLLM overwrites them too).
    With a draft vocabulary smaller than the target's the head gives no raw logits (KL is NaN: it is infinite)."""

    def __init__(self, head: Model, vocab_size: int, k: int, cfg: SamplingConfig) -> None:
        super().__init__(head, vocab_size, k, cfg)
        self.head = head
        self.hidden_layers = list(head.aux_layers)
        self.full_vocabulary = head.covers_target()
        self.pending: list[list[torch.Tensor]] = []  # per row: target states not yet fed to the head, in order
        self.base: list[int] = []  # per row: head entries fed with the target's states
        self.state: torch.Tensor | None = None  # [b, W, hidden]: the head states of the next draft forward's columns

    def start(self, seqs: list[torch.Tensor], history: list[list[int]], prompt_indices: list[int]) -> None:
        self.lm.reset(len(seqs))
        self.ks = [self.k] * len(seqs)
        self.cached = [0] * len(seqs)
        self.pending = [[] for _ in seqs]

    def propose(
        self, seqs: list[torch.Tensor], history: list[list[int]], generators: list[torch.Generator], caps: list[int]
    ) -> Proposal:
        if not all(self.pending):  # the prefill has not run: no target states yet
            self.proposed = [0] * len(seqs)
            return Proposal.empty(len(seqs), self.lm.vocab_size, self.lm.device)
        self.base = list(self.cached)
        proposal = super().propose(seqs, history, generators, caps)
        self.cached = list(self.base)  # the entries fed with the head's own states go with the rollback
        if not self.full_vocabulary:
            proposal.raw_logits = None
        return proposal

    def draft_inputs(self, seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        states = [torch.cat(p) for p in self.pending]
        tokens = [s[c + 1 :] for s, c in zip(seqs, self.cached)]  # entry t: token t + 1 with the states at t
        if any(t.shape[0] != h.shape[0] for t, h in zip(tokens, states)):
            raise RuntimeError(
                f"EAGLE-3 drafter out of step: tokens {[t.shape[0] for t in tokens]} vs target "
                f"states {[h.shape[0] for h in states]}"
            )
        ids, valid = left_pad(tokens, self.lm.device)
        width = ids.shape[1]
        padded = states[0].new_zeros(len(states), width, states[0].shape[-1])
        for r, h in enumerate(states):
            padded[r, width - h.shape[0] :] = h
        self.state = self.head.combine(padded)
        self.pending = [[] for _ in seqs]
        self.base = [s.shape[0] - 1 for s in seqs]
        return ids, valid

    def draft_forward(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        logits, prenorm = self.lm.forward(ids, valid, keep=1, hidden_layers=[1], inputs={"hidden_states": self.state})
        self.state = prenorm[:, -1:]
        return logits[:, 0]

    def tree_step(
        self,
        ids: torch.Tensor,
        valid: torch.Tensor,
        attend: torch.Tensor,
        positions: torch.Tensor,
        parent_slots: torch.Tensor,
    ) -> torch.Tensor:
        """A token-tree step: each node is fed with its parent's own output state (the chain's rule, per branch)."""
        if self.state is None:
            raise RuntimeError("the EAGLE-3 drafter stepped a tree before its root's forward")
        state = self.state.gather(1, parent_slots[..., None].expand(-1, -1, self.state.shape[-1]))
        logits, prenorm = self.lm.forward(
            ids,
            valid,
            keep=ids.shape[1],
            hidden_layers=[1],
            inputs={"hidden_states": state},
            attend=attend,
            positions=positions,
        )
        self.state = prenorm[:, -ids.shape[1] :]
        return logits

    def rollback(self, kept: torch.Tensor) -> None:
        self.lm.rollback(to_device(self.cached, self.lm.device))

    def settle(
        self, lengths: list[int], accepted: list[int], trailing: int | None, states: TargetStates | None = None
    ) -> None:
        super().settle(lengths, accepted, trailing)
        if states is None:
            raise RuntimeError("the EAGLE-3 drafter was settled without the target's hidden states")
        for r, a in enumerate(accepted):
            self.pending[r].append(states.committed(r, a))

    def select(self, rows: list[int]) -> None:
        super().select(rows)
        self.pending = [self.pending[r] for r in rows]


# --- drafting without a model ----------------------------------------------------------------------------------


class HostDrafter:
    """A model-free drafter: per-row state on the host, fed from the host copy of each row's tokens, so a round
    reads nothing from the device and the device-cache steps of the protocol do nothing. A subclass implements
    `begin_row(history, prompt_index)` (the row's state) and `follow(state, history, max_tokens)` (its drafts)."""

    spec: ClassVar[DrafterSpec]  # set by @drafter

    def __init__(self, vocab_size: int, k: int, eos_ids: Iterable[int] = ()) -> None:
        self.vocab_size = vocab_size
        self.k = k
        self.eos_ids = set(eos_ids)
        self.rows: list[Any] = []  # each row's state (begin_row's)

    def start(self, seqs: list[torch.Tensor], history: list[list[int]], prompt_indices: list[int]) -> None:
        self.rows = [self.begin_row(h, i) for h, i in zip(history, prompt_indices)]

    def propose(
        self, seqs: list[torch.Tensor], history: list[list[int]], generators: list[torch.Generator], caps: list[int]
    ) -> Proposal:
        follows = [
            self.cut(self.follow(state, h, min(self.k, cap))) if cap > 0 else []
            for state, h, cap in zip(self.rows, history, caps)
        ]
        return Proposal.point_masses(follows, self.vocab_size, seqs[0].device)

    def begin_row(self, history: list[int], prompt_index: int) -> Any:
        """A new row's state, from its prompt (`history`) and its prompt's index."""
        raise NotImplementedError

    def follow(self, state: Any, history: list[int], max_tokens: int) -> list[int]:
        """The row's drafts (at most max_tokens) after its committed tokens `history`."""
        raise NotImplementedError

    def cut(self, follow: list[int]) -> list[int]:
        """A proposal ends before its first EOS (a draft past the end would never be emitted)."""
        return next((follow[:i] for i, t in enumerate(follow) if t in self.eos_ids), follow)

    def rollback(self, kept: torch.Tensor) -> None:
        pass

    def trailing_holes(self) -> torch.Tensor | None:
        return None

    def settle(
        self, lengths: list[int], accepted: list[int], trailing: int | None, states: TargetStates | None = None
    ) -> None:
        pass  # the accepted tokens and the correction arrive with the next round's history

    def select(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def maybe_compact(self, ratio: float) -> None:
        pass

    def finish(self, prompt_indices: list[int], outputs: list[list[int]]) -> None:
        pass


@drafter("prompt-lookup")
class PromptLookupDrafter(HostDrafter):
    """Prompt lookup decoding (transformers' PromptLookupCandidateGenerator, vLLM's ngram): for n from
    min(N, L - 1) down to 1, the n-gram ending the sequence (prompt + output so far) is looked up; at the first n
    with an earlier occurrence, the tokens after its EARLIEST occurrence (left to right, as transformers takes it),
    up to k of them, stopping at the sequence's end, are proposed, cut before the first EOS. No earlier occurrence
    of even the last token: no drafts, and the round is one plain target step. Per row, an index of each n-gram's
    first occurrence: a round costs O(N^2) dictionary work."""

    def __init__(self, max_ngram: int, vocab_size: int, k: int, eos_ids: Iterable[int] = ()) -> None:
        super().__init__(vocab_size, k, eos_ids)
        self.max_ngram = max_ngram

    @classmethod
    def from_spec(
        cls,
        param: DrafterParameter,
        *,
        draft_model: Model | None,
        vocab_size: int,
        k: int,
        cfg: SamplingConfig,
        eos_ids: Iterable[int],
    ) -> Drafter:
        return cls(int(_given(param)), vocab_size, k, eos_ids)

    def begin_row(self, history: list[int], prompt_index: int) -> NgramIndex:
        return NgramIndex(self.max_ngram)

    def follow(self, index: NgramIndex, history: list[int], max_tokens: int) -> list[int]:
        index.extend(history[len(index.history) :])
        return index.lookup(max_tokens)


class NgramIndex:
    """One row's committed tokens and the index of each n-gram's (n <= N) earliest occurrence."""

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.history: list[int] = []
        self.first: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.history.append(token)
            end = len(self.history)
            for n in range(1, min(self.max_ngram, end) + 1):
                self.first.setdefault(tuple(self.history[end - n :]), end - n)

    def lookup(self, max_tokens: int) -> list[int]:
        seq, length = self.history, len(self.history)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            start = self.first[tuple(seq[length - n :])]
            if start < length - n:  # an occurrence before the one ending the sequence: its earliest one
                return seq[start + n : start + n + max_tokens]
        return []


@drafter("suffix")
class SuffixDrafter(HostDrafter):
    """Suffix decoding (Oliaro et al. 2024; vLLM's `method: "suffix"`, arctic-inference's SuffixDecodingCache):
    each row keeps a suffix tree of depth D over its prompt and output so far, and the drafter keeps one over the
    responses of earlier prompts of the run (engine/decoding/suffix_tree.py: bounded, one response per prompt index, a
    prompt never sees its own earlier response, responses enter when their batch ends). A round proposes the
    better-scoring of the two trees' drafts: the most frequent continuation of the longest matching suffix of the
    context, at most k tokens, at most as many as the match is long, stopping where its estimated probability falls
    below MIN_TOKEN_PROB (vLLM's defaults: max_spec_factor 1, min_token_prob 0.1)."""

    def __init__(self, depth: int, vocab_size: int, k: int, eos_ids: Iterable[int] = ()) -> None:
        super().__init__(vocab_size, k, eos_ids)
        self.cache = SuffixCache(depth)

    @classmethod
    def from_spec(
        cls,
        param: DrafterParameter,
        *,
        draft_model: Model | None,
        vocab_size: int,
        k: int,
        cfg: SamplingConfig,
        eos_ids: Iterable[int],
    ) -> Drafter:
        return cls(int(_given(param)), vocab_size, k, eos_ids)

    def begin_row(self, history: list[int], prompt_index: int) -> Request:
        return self.cache.start_request(prompt_index, history)

    def follow(self, request: Request, history: list[int], max_tokens: int) -> list[int]:
        return self.cache.speculate(request, history, max_tokens)

    def finish(self, prompt_indices: list[int], outputs: list[list[int]]) -> None:
        for index, output in zip(prompt_indices, outputs):
            self.cache.add_response(index, output)


def _given(param: DrafterParameter) -> int | float:
    """The parameter of a drafter whose spec takes one (parse_drafter gives every such spec its value)."""
    if param is None:
        raise ValueError("this drafter's spec takes a parameter, and parse_drafter gives it one")
    return param


def drafter_class(name: str) -> type[Drafter]:
    """The class implementing the drafter `name` (a key of engine.config.drafter_specs.SPECS)."""
    return DRAFTERS[name]


def _check_registry() -> None:
    """Every declared drafter has its class (a class without a declaration already failed at @drafter)."""
    missing = [name for name in SPECS if name not in DRAFTERS]
    if missing:
        raise DeclarationError(
            f"drafters declared in engine/config/drafter_specs.py without a class: {', '.join(missing)}; decorate "
            "the class implementing each with @drafter(name) in engine/decoding/drafting.py"
        )


_check_registry()


def make_drafter(
    spec: str,
    *,
    draft_model: Model | None,
    vocab_size: int,
    k: int,
    cfg: SamplingConfig,
    eos_ids: Iterable[int] = (),
) -> Drafter:
    """The drafter a spec names, proposing up to k tokens a round (its starting k for `heuristic`).
    draft_model may be None for a drafter that needs none; eos_ids end a model-free proposal."""
    name, value = parse_drafter(spec)
    if draft_model is not None and SPECS[name].needs_model:
        head = hasattr(draft_model, "aux_layers")  # an EAGLE-3 head (engine/models/eagle3.py), not a causal LM
        if head and not SPECS[name].needs_hidden_states:
            readers = ", ".join(s.usage for s in SPECS.values() if s.needs_hidden_states)
            raise DraftLabError(
                f"the draft is an EAGLE-3 head, which drafter {name!r} cannot run (it drafts with a "
                f"causal LM); use --drafter {readers}"
            )
        if not head and SPECS[name].needs_hidden_states:
            raise DraftLabError(
                f"drafter {name!r} drafts with an EAGLE-3 head, but the draft is a causal LM; pass "
                f"an EAGLE-3 head directory (speculators or SGLang layout) as --draft, or use --drafter model"
            )
    if SPECS[name].needs_model and draft_model is None:
        free = ", ".join(s.usage for s in SPECS.values() if not s.needs_model)
        raise DraftLabError(
            f"drafter {name!r} drafts with the draft model, but none is loaded; load a draft model "
            f"or use a drafter without one ({free})"
        )
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise DraftLabError(f"k must be a positive integer (got {k!r}); use e.g. --k 4 or --k 1,2,4,8")
    if cfg.tree_topk > 1 and not SPECS[name].branches:
        trees = ", ".join(s.usage for s in SPECS.values() if s.branches)
        raise DraftLabError(
            f"drafter {name!r} drafts one chain, so it cannot draft a token tree (tree topk {cfg.tree_topk}); "
            f"use --tree-topk 1, or a drafter that branches ({trees})"
        )
    if cfg.tree_topk > 1 and cfg.verify != "standard":
        raise DraftLabError(
            f"verify {cfg.verify!r} verifies one chain; a token tree (tree topk {cfg.tree_topk}) verifies with its "
            "own rule; use --verify standard with --tree-topk above 1, or --tree-topk 1"
        )
    return drafter_class(name).from_spec(
        value, draft_model=draft_model, vocab_size=vocab_size, k=k, cfg=cfg, eos_ids=eos_ids
    )
