"""Each serving engine's settings for a run whose draft has another vocabulary (run column `vocab` "intersection":
the draft drafted over the tokens both tokenizers share, engine/models/vocab_bridge.py), and what each engine does
differently from what DraftLab measured.

- vLLM serves exactly that rule: `"use_heterogeneous_vocab": true` in the speculative config
  (vllm/config/speculative.py: "use_heterogeneous_vocab only works with method='draft_model'" and "currently only
  supports greedy draft sampling"; vllm/v1/spec_decode/vocab_mapping.py builds the intersection).
- transformers takes `assistant_tokenizer=` with `tokenizer=` (universal assisted generation,
  generation/utils.py `_get_candidate_generator`): with do_sample=True the assistant's logits are mapped onto the
  shared tokens (UniversalSpeculativeDecodingGenerator, the intersection rule DraftLab measured); with
  do_sample=False the assistant's drafts are decoded to TEXT and re-tokenized by the target
  (AssistedCandidateGeneratorDifferentTokenizers): the target sees drafts the draft never proposed token for token,
  so acceptance differs from the lab's.
- SGLang's standalone draft needs the target's vocabulary; llama.cpp re-tokenizes a draft of another vocabulary
  through text (common/speculative.cpp). Neither drafts over the intersection.
"""

from __future__ import annotations

INTERSECTION = "intersection"


def intersection(cfg: dict) -> bool:
    """Whether the run drafted with a draft of another vocabulary."""
    return cfg.get("vocab") == INTERSECTION


def vllm_vocab(cfg: dict, spec: dict) -> list[str]:
    """vLLM's speculative config for the run (`spec`, updated in place) and the notes it needs."""
    if not intersection(cfg):
        return []
    notes = []
    spec["use_heterogeneous_vocab"] = True
    if spec.get("method") != "draft_model":
        notes.append(
            f"use_heterogeneous_vocab only works with method 'draft_model' (vllm/config/speculative.py); vLLM refuses "
            f"it with {spec.get('method')!r}."
        )
    if spec.get("draft_sample_method") == "probabilistic":
        spec["draft_sample_method"] = "greedy"
        notes.append(
            "vLLM drafts a draft of another vocabulary greedily only (vllm/config/speculative.py: "
            "use_heterogeneous_vocab currently only supports greedy draft sampling): it serves argmax drafts, "
            "verified as one-hot, not the sampled drafts this run measured; measure with --draft-sampling greedy "
            "for the acceptance vLLM will see."
        )
    coverage = cfg.get("vocab_coverage")
    share = f" ({coverage:.1%} of the target's vocabulary)" if isinstance(coverage, float) else ""
    notes.append(
        f"use_heterogeneous_vocab: the draft has another tokenizer; vLLM drafts over the tokens both share{share} "
        "as DraftLab measured (the same intersection: normalized token strings, a target token outside it read by "
        "the draft as its unk)."
    )
    return notes


def transformers_vocab(cfg: dict, lines: list[str], kwargs: dict) -> list[str]:
    """The transformers snippet's assistant tokenizer (`lines` and `kwargs` updated in place) and its note."""
    if not intersection(cfg):
        return []
    lines.append(f"assistant_tokenizer = AutoTokenizer.from_pretrained({cfg['draft']!r})")
    kwargs["tokenizer"] = "tokenizer"
    kwargs["assistant_tokenizer"] = "assistant_tokenizer"
    if cfg["greedy"]:
        return [
            "assistant_tokenizer=: universal assisted generation. Greedy, transformers decodes the draft's "
            "tokens to text and re-tokenizes it with the target's tokenizer (AssistedCandidateGeneratorDifferent"
            "Tokenizers), not the token intersection DraftLab measured (vLLM's use_heterogeneous_vocab): lossless, "
            "but the drafts the target verifies differ, and so does acceptance."
        ]
    return [
        "assistant_tokenizer=: with do_sample=True transformers maps the draft's logits onto the tokens both "
        "vocabularies share (UniversalSpeculativeDecodingGenerator), the intersection rule DraftLab measured."
    ]


def no_intersection_note(cfg: dict, engine: str) -> list[str]:
    """SGLang and llama.cpp: they do not draft over the intersection; one line each."""
    if not intersection(cfg):
        return []
    if engine == "sglang":
        return [
            "SGLang's standalone draft must share the target's vocabulary: it cannot serve this draft of another "
            "tokenizer as measured; serve it with vLLM (use_heterogeneous_vocab)."
        ]
    return [
        "llama.cpp re-tokenizes a draft of another vocabulary through text (common/speculative.cpp), not over "
        "the shared tokens DraftLab measured: lossless, but acceptance differs; vLLM serves the measured rule."
    ]
