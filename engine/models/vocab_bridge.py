"""A draft whose tokenizer differs from the target's, drafting over the tokens both vocabularies share, exactly as vLLM
serves it with `use_heterogeneous_vocab` (token-level intersection, TLI: Timor et al., "Lossless Speculative Decoding
Algorithms for Heterogeneous Vocabularies", ICML 2025).

What vLLM does (vllm/v1/spec_decode/vocab_mapping.py, VocabMapping; vllm/v1/spec_decode/draft_model.py and
llm_base_proposer.py, `_greedy_sample` / `_sample_draft_tokens`; vllm/config/speculative.py allows it with
`method: "draft_model"` only, and drafts greedily: probabilistic draft sampling is refused there), and so DraftLab:

- The intersection: each tokenizer's `get_vocab()` strings, normalized by turning the word-initial space marker into a
  space (the marker is probed by tokenizing " a": BPE's "Ġ", SentencePiece's "▁"; both when the probe says nothing);
  the first id of each normalized string (in `get_vocab()` order) stands for it. Every string both sides hold is
  shared, special tokens included (they match by their strings, as any other token); ids past a model's output width
  are left out.
- The context: each target id the draft reads becomes its draft id; a target token outside the intersection becomes
  the draft's unk token (its EOS when it has no unk; neither: refused, as vLLM refuses).
- The draft's logits outside the intersection are -inf, and its proposals are mapped back to target ids.

Here the draft's logits are laid out in the TARGET's vocabulary (`VocabBridge`): a shared token's draft logit at its
target id, -inf at every other target id. Its softmax is then a proper distribution over the shared tokens (what the
draft can propose), so the loop's verification (engine/decoding/verification.py) is unchanged and stays lossless: the
tokens the draft cannot propose have p_d = 0, and the correction's residual max(0, p_t - p_d) gives them their full
p_t. The loop sees a draft model like any other (engine/decoding/drafting.py's ModelDrafter)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from engine.errors import DraftLabError

# vLLM warns below 100 shared tokens; DraftLab refuses a pair sharing fewer than this many (or a tenth of a smaller
# target vocabulary): the draft could propose almost nothing the target says.
MIN_SHARED = 100
SPACE_MARKERS = ("\u0120", "\u2581")  # BPE's "Ġ", SentencePiece's "▁": vLLM's fallback


def space_markers(tokenizer) -> tuple[str, ...]:
    """The string a tokenizer puts before a word-initial space's token (vLLM's `_detect_space_prefix`)."""
    try:
        ids = tokenizer.encode(" a", add_special_tokens=False)
        if ids:
            piece = tokenizer.convert_ids_to_tokens(ids[0])
            if isinstance(piece, str) and len(piece) > 1 and piece.endswith("a") and piece[0] not in (" ", "\t"):
                return (piece[:-1],)
    except (TypeError, ValueError, KeyError, AttributeError):
        pass
    return SPACE_MARKERS


def normalized(token: str, markers: tuple[str, ...]) -> str:
    for marker in markers:
        if token.startswith(marker):
            return " " + token[len(marker) :]
    return token


def _by_string(tokenizer, width: int) -> dict[str, int]:
    """Normalized string -> the first id holding it (in get_vocab() order), ids below `width` only."""
    markers = space_markers(tokenizer)
    first: dict[str, int] = {}
    for token, i in tokenizer.get_vocab().items():
        first.setdefault(normalized(token, markers), i)
    return {s: i for s, i in first.items() if i < width}


def fallback_id(tokenizer, role: str) -> int:
    """The id a token outside the intersection becomes on this side: unk, else EOS (vLLM's `_get_unk_token_id`)."""
    for name in ("unk_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise DraftLabError(
        f"the {role} tokenizer has neither an unk nor an EOS token, so a token outside the shared vocabulary has "
        f"nothing to become (vLLM refuses it too); pick a {role} whose tokenizer defines one"
    )


@dataclass(frozen=True)
class VocabMapping:
    """The token-level intersection of a target and a draft vocabulary."""

    target_to_draft: tuple[int, ...]  # per target id: its draft id, -1 outside the intersection
    draft_to_target: tuple[int, ...]  # per draft id: its target id, -1 outside
    target_vocabulary: int  # tokens in the target tokenizer's vocabulary
    draft_unk: int  # the draft id a target token outside the intersection becomes
    target_unk: int

    @property
    def shared(self) -> int:
        return sum(1 for d in self.target_to_draft if d >= 0)

    @property
    def coverage(self) -> float:
        """Share of the target's vocabulary the draft can propose."""
        return self.shared / max(self.target_vocabulary, 1)

    def shared_target_ids(self) -> set[int]:
        return {t for t, d in enumerate(self.target_to_draft) if d >= 0}


def least_shared(target_vocabulary: int) -> int:
    """The fewest shared tokens a pair may draft over: MIN_SHARED, or a tenth of a smaller target vocabulary."""
    return max(1, min(MIN_SHARED, math.ceil(target_vocabulary / 10)))


def intersect(target_tokenizer, draft_tokenizer, target_width: int, draft_width: int) -> VocabMapping:
    """The intersection as vLLM builds it (VocabMapping.__init__); whether it is large enough is `least_shared`'s."""
    t, d = _by_string(target_tokenizer, target_width), _by_string(draft_tokenizer, draft_width)
    t2d, d2t = [-1] * target_width, [-1] * draft_width
    for s in t.keys() & d.keys():
        t2d[t[s]], d2t[d[s]] = d[s], t[s]
    mapping = VocabMapping(
        tuple(t2d),
        tuple(d2t),
        len(target_tokenizer.get_vocab()),
        fallback_id(draft_tokenizer, "draft"),
        fallback_id(target_tokenizer, "target"),
    )
    return mapping


class VocabBridge(torch.nn.Module):
    """The draft model seen in the target's vocabulary: its forward takes target ids (mapped to draft ids, a token
    outside the intersection as the draft's unk) and returns logits over the target's `target_width` ids (a shared
    token's draft logit at its target id, -inf elsewhere). Everything else (config, cache, signature) is the draft's,
    so the KV cache and the drafters drive it as they drive the draft itself."""

    def __init__(self, draft: torch.nn.Module, mapping: VocabMapping, target_width: int) -> None:
        super().__init__()
        self.draft = draft
        self.mapping = mapping
        self.config = draft.config
        self.generation_config = getattr(draft, "generation_config", None)
        device = next(draft.parameters()).device
        t2d = torch.tensor(mapping.target_to_draft, dtype=torch.long)
        self.register_buffer("to_draft", torch.where(t2d >= 0, t2d, mapping.draft_unk).to(device), persistent=False)
        shared = (t2d >= 0).nonzero()[:, 0]
        self.register_buffer("shared_target", shared.to(device), persistent=False)
        self.register_buffer("shared_draft", t2d[shared].to(device), persistent=False)
        self.target_width = target_width
        # The draft's own signature (the cache reads which arguments it takes), `bridged` the body.

        def forward(input_ids: torch.Tensor, **kwargs):
            return self.bridged(input_ids, **kwargs)

        self.forward = functools.update_wrapper(forward, draft.forward)

    def covers_target(self) -> bool:
        """Whether every target token is shared (then KL against the target is finite)."""
        return self.mapping.shared == self.target_width

    def bridged(self, input_ids: torch.Tensor, **kwargs):
        out = self.draft(input_ids=self.to_draft[input_ids], **kwargs)
        draft_logits = out.logits
        logits = draft_logits.new_full((*draft_logits.shape[:-1], self.target_width), float("-inf"))
        logits[..., self.shared_target] = draft_logits[..., self.shared_draft]
        out.logits = logits
        return out

    def get_output_embeddings(self):
        return self.draft.get_output_embeddings()


def outside_share(mapping: VocabMapping, prompts: list[list[int]]) -> float:
    """Share of the prompts' tokens (target ids) outside the intersection: what the draft reads as its unk."""
    shared = mapping.target_to_draft
    total = sum(len(p) for p in prompts)
    outside = sum(1 for p in prompts for t in p if t >= len(shared) or shared[t] < 0)
    return outside / total if total else 0.0


def describe(mapping: VocabMapping | None) -> str:
    """The pair check's words for a pair's vocabulary."""
    if mapping is None:
        return "tokenizers match: the draft proposes every target token (vocab shared)"
    return (
        f"tokenizers differ: the draft drafts over the {mapping.shared:,} tokens both share, "
        f"{mapping.coverage:.1%} of the target's {mapping.target_vocabulary:,} (vocab intersection, vLLM's "
        "use_heterogeneous_vocab)"
    )


def prompt_warning(mapping: VocabMapping | None, prompts: list[list[int]], limit: float = 0.0) -> str | None:
    """A warning when more than `limit` of the prompts' tokens lie outside the intersection, else None."""
    if mapping is None:
        return None
    share = outside_share(mapping, prompts)
    if share <= limit:
        return None
    return (
        f"{share:.1%} of the prompts' tokens (target tokenization) are outside the vocabulary the draft shares with "
        "the target: the draft reads each as its unk (or EOS) token and cannot propose them, which costs acceptance"
    )


def stamp(results: list, draft_model: torch.nn.Module | None) -> list:
    """A speculative run's PromptResults (engine/decoding/records.py) with their pair's vocabulary: `vocab` and
    `vocab_coverage`, and for a draft with another vocabulary each rejected draft's `outside_vocab` (1 when the
    correction that replaced it is a token the draft could not have proposed). `draft_model`: the one the run drafted
    with (None: a drafter without a model, which proposes target ids: one vocabulary)."""
    mapping = draft_model.mapping if isinstance(draft_model, VocabBridge) else None
    for result in results:
        result.vocab = "shared" if mapping is None else "intersection"
        result.vocab_coverage = 1.0 if mapping is None else mapping.coverage
        if mapping is None:
            continue
        for r in result.rounds:
            for t in r.draft_tokens:
                if t.outcome == "rejected" and t.position - 1 < len(r.emitted_ids):
                    correction = r.emitted_ids[t.position - 1]
                    known = correction < len(mapping.target_to_draft) and mapping.target_to_draft[correction] >= 0
                    t.outside_vocab = int(not known)
    return results
