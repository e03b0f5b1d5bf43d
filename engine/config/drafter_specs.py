"""What each drafter spec means: the one description of the drafting strategies, read by the engine, the CLI, the
New-experiment form and its link prefill, the queue, the findings and the deploy mapping.

    model            the draft model, a constant k per round (Leviathan et al.)
    heuristic        the draft model; k starts at --k, +2 after a round whose drafts were all accepted, else -1
    confidence:T     the draft model; a round stops after the first draft whose top probability is below T
    prompt-lookup:N  no model: the continuation of the longest earlier n-gram (n <= N) ending the sequence
    suffix:D         no model: suffix decoding over suffix trees of depth D (`suffix` = `suffix:24`, vLLM's default)
    eagle3           an EAGLE-3 head (the "draft model" is its directory) drafting from the target's hidden states
    early-exit:L     the draft model's first L decoder layers, then its final norm and LM head (LayerSkip: the target
                     itself as --draft is self-speculation), a constant k per round

A new drafter is one entry in SPECS plus its class in engine/decoding/drafting.py, decorated `@drafter(name)` (the
registry there holds the class; a declaration without a class, or a class without a declaration, fails at import).
Every declaration maps every serving engine (SERVING_ENGINES): one without a mapping fails when it is declared.
Plain Python, no torch: storage and pages import it. Numbers in a spec are ASCII (engine/numbers.py).

    parse_drafter("confidence:0.50") -> ("confidence", 0.5)
    canonical_drafter(" confidence:0.50 ") -> "confidence:0.5"
    needs_draft_model("prompt-lookup:3") -> False
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import DraftLabError
from engine.numbers import ascii_float, ascii_int


@dataclass(frozen=True)
class Parameter:
    """The one parameter a drafter's spec carries after the colon (`confidence:0.5`)."""

    kind: type  # int or float
    symbol: str  # its name in the usage text and the form: T, N
    meaning: str  # what it is and its range, for error messages
    example: str  # a valid spec
    low: float  # the range: low < value (low_open) or low <= value, value < high
    high: float
    low_open: bool = False
    default: float | int | None = None  # the form's starting value
    # The value counts the draft's decoder layers (early-exit:L): it must be below their number, checked from a local
    # draft's config.json before anything queues (engine/config/run_config.check_drafters).
    below_draft_layers: bool = False

    def valid(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return bool(above and value < self.high)

    def parse(self, raw: str) -> int | float | None:
        """The parameter from its text, or None when it is not a valid one."""
        value = ascii_int(raw) if self.kind is int else ascii_float(raw)
        return value if value is not None and self.valid(value) else None


@dataclass(frozen=True)
class Serving:
    """How one serving engine runs a drafter (storage/serving/deploy.py assembles the engine's settings from it): the
    engine's name for that drafting (`how`; None: the engine cannot express the drafter, and `notes[0]` says why),
    the drafter-specific settings it takes for parameter p and k (`settings(p, k)`: a dict of keys, or a list of
    (flag, value) pairs for a command line), and what the engine does differently from what DraftLab measured
    (`notes`, formatted with {k} and {p}). A drafter that needs a draft model gets the model and the engine's
    sampling caveats from deploy itself; nothing here names a model. `draft_layout`: the EAGLE-3 head layout the
    engine loads (engine/config/head_format.py: "speculators" or "sglang"; deploy points it at the head in that
    layout, or says how to write it). `sampled(draft_sampling)`: the (flag, value) pairs (value None: a switch) and
    notes the engine takes at temperature > 0 for the run's draft sampling, where they differ from deploy's own.
    `call(p, k)`: the engine drafts with the target itself, no draft model loaded (transformers' assistant_early_exit):
    these are its generate() arguments, and `settings` go on the target's own generation_config (the assistant's,
    the target being its own assistant)."""

    how: str | None
    # (p, k) -> a dict of keys, or (flag, value) pairs: each engine's own shape (deploy reads it per engine)
    settings: Callable[[Any, int], Any] = lambda p, k: {}
    notes: tuple[str, ...] = ()
    draft_layout: str | None = None
    sampled: Callable[[str], tuple[list[tuple[str, str | None]], tuple[str, ...]]] | None = None
    call: Callable[[Any, int], dict[str, Any]] | None = None

    def texts(self, p: int | float | None, k: int) -> list[str]:
        return [note.format(k=k, p=p) for note in self.notes]


def _cannot(engine: str, why: str) -> Serving:
    return Serving(None, notes=(f"Not expressible: {engine} {why}",))


# Each engine's mapping was checked against its own source or docs (storage/serving/deploy.py names the files and
# commits).
_DRAFT_MODEL = {
    "vllm": Serving("draft_model"),
    "sglang": Serving(
        "STANDALONE",
        lambda p, k: [
            ("--speculative-num-steps", k),
            ("--speculative-eagle-topk", 1),
            ("--speculative-num-draft-tokens", k + 1),
        ],
        (
            "STANDALONE drafts k={k} steps deep (--speculative-num-steps); --speculative-num-draft-tokens counts the "
            "root (the last verified token): a chain (topk 1) verifies k + 1, which SGLang requires at topk 1.",
        ),
    ),
    "llama_cpp": Serving(
        "draft model",
        lambda p, k: [("--draft-max", k), ("--draft-min", 0), ("--draft-p-min", 0.0)],
        (
            "--draft-p-min 0.0: llama.cpp's default (0.75) would end rounds early on low-confidence "
            "drafts; 0 keeps k constant, as measured.",
        ),
    ),
    "transformers": Serving(
        "assistant model",
        lambda p, k: {
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        },
        (
            "assistant_confidence_threshold=0.0 turns off transformers' default early stop (0.4), so every round "
            "drafts k tokens as measured.",
        ),
    ),
}
_HEURISTIC = {
    "vllm": Serving(
        "draft_model",
        notes=(
            "Not expressible: vLLM keeps num_speculative_tokens fixed per request; its dynamic k "
            "(num_speculative_tokens_per_batch_size) follows the batch size, not acceptance. This is the heuristic's "
            "starting k={k}; run a constant-k sweep (drafter `model`) to choose the k to serve.",
        ),
    ),
    "sglang": Serving(
        "STANDALONE",
        _DRAFT_MODEL["sglang"].settings,
        _DRAFT_MODEL["sglang"].notes
        + (
            "Not expressible: STANDALONE keeps num-steps fixed (--speculative-adaptive, which moves between step tiers "
            "on an average accept length, is EAGLE-only). This is the heuristic's starting k={k}; choose the served k "
            "from a constant-k sweep.",
        ),
    ),
    "llama_cpp": Serving(
        "draft model",
        _DRAFT_MODEL["llama_cpp"].settings,
        _DRAFT_MODEL["llama_cpp"].notes
        + (
            "Not expressible: llama.cpp has no +2/-1 schedule; --draft-max is the heuristic's starting k={k}. Choose "
            "the served k from a constant-k sweep.",
        ),
    ),
    "transformers": Serving(
        "assistant model",
        lambda p, k: {
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "heuristic_transient",
            "assistant_confidence_threshold": 0.0,
        },
        (
            '"heuristic_transient" restarts k at num_assistant_tokens on every generate() call, as DraftLab restarts '
            'it at every prompt; "heuristic" would carry k over between calls.',
        ),
    ),
}
_CONFIDENCE = {
    "vllm": Serving(
        "draft_model",
        notes=(
            "Not expressible: vLLM has no draft-confidence stop; every round drafts {k} tokens (the confidence:{p:g} "
            "run's upper bound).",
        ),
    ),
    "sglang": Serving(
        "STANDALONE",
        _DRAFT_MODEL["sglang"].settings,
        _DRAFT_MODEL["sglang"].notes
        + (
            "Not expressible: SGLang has no draft-confidence stop; every round drafts k={k}. Leave "
            "--speculative-accept-threshold-single/-acc at 1.0: they relax acceptance (lossy), they do not stop "
            "drafting.",
        ),
    ),
    "llama_cpp": Serving(
        "draft model",
        lambda p, k: [("--draft-max", k), ("--draft-min", 0), ("--draft-p-min", p)],
        (
            "--draft-p-min {p:g} stops a round when the draft's top probability falls below {p:g}, like "
            "confidence:{p:g}, but llama.cpp drops that last draft (DraftLab keeps it) and takes the "
            "probability over the draft sampler's few top candidates.",
        ),
    ),
    "transformers": Serving(
        "assistant model",
        lambda p, k: {
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": p,
        },
        (
            "assistant_confidence_threshold={p:g}: transformers stops after a draft whose own probability is below "
            "{p:g} (DraftLab: whose distribution's top probability is; the same at temperature 0), and with "
            "scikit-learn installed it re-fits the threshold during generation, which DraftLab does not.",
        ),
    ),
}
_PROMPT_LOOKUP = {
    "vllm": Serving(
        "ngram",
        lambda p, k: {"prompt_lookup_max": int(p), "prompt_lookup_min": 1},
        (
            "ngram proposer: tries n-grams from prompt_lookup_max={p} down to prompt_lookup_min=1 like DraftLab; "
            "which earlier occurrence it continues from may differ from DraftLab's earliest one, so check the "
            "acceptance rate in vLLM's spec-decode metrics.",
        ),
    ),
    "sglang": Serving(
        "NGRAM",
        lambda p, k: [("--speculative-num-draft-tokens", k + 1), ("--speculative-ngram-max-bfs-breadth", 1)],
        (
            "Not expressible: the lookup n-gram size N={p} (current SGLang has no option for it; older releases took "
            "--speculative-ngram-max-match-window-size).",
            "NGRAM drafts from a cache of tokens seen before, shared by all requests, not only this prompt: close to "
            "prompt lookup but not the same; check its acceptance rate.",
            "--speculative-num-draft-tokens counts the last verified token too: k + 1 verifies up to k={k} drafts; "
            "--speculative-ngram-max-bfs-breadth 1 keeps one chain (no tree), as DraftLab drafts.",
        ),
    ),
    "llama_cpp": Serving(
        "ngram-simple",
        lambda p, k: [
            ("--spec-type", "ngram-simple"),
            ("--spec-ngram-size-n", int(p)),
            ("--spec-ngram-size-m", k),
            ("--draft-max", k),
        ],
        (
            "ngram-simple matches exactly the last {p} tokens and continues its LAST earlier occurrence; DraftLab "
            "falls back to shorter n-grams (n <= {p}) and continues the earliest one, so acceptance can differ. The "
            "n-gram options changed across llama.cpp builds (checked docs/speculative.md): confirm them with "
            "`llama-server --help`.",
        ),
    ),
    "transformers": Serving(
        "prompt lookup",
        lambda p, k: {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": int(p)},
        (
            "Prompt lookup in transformers tries n-grams from max_matching_ngram_size down to 1 and continues the "
            "earliest match, as DraftLab's prompt-lookup does.",
        ),
    ),
}
# vLLM: vllm/config/speculative.py (method "suffix", suffix_decoding_max_tree_depth default 24,
# suffix_decoding_max_cached_requests 10000, suffix_decoding_max_spec_factor 1.0, suffix_decoding_min_token_prob 0.1)
# and vllm/v1/spec_decode/suffix_decoding.py (arctic-inference's SuffixDecodingCache, num_speculative_tokens caps a
# draft); docs/features/spec_decode (needs `pip install arctic-inference`).
_SUFFIX = {
    "vllm": Serving(
        "suffix",
        lambda p, k: {"suffix_decoding_max_tree_depth": int(p)},
        (
            "Suffix decoding needs arctic-inference installed beside vLLM (`pip install arctic-inference`).",
            "vLLM's global tree caches the responses of up to suffix_decoding_max_cached_requests (10000) earlier "
            "requests, all of your traffic; DraftLab's held the earlier responses of the experiment's own prompts: "
            "acceptance in the server follows how repetitive your traffic is, so check its spec-decode metrics.",
        ),
    ),
    "sglang": _cannot(
        "SGLang",
        "has no suffix decoding (its NGRAM drafts from a cache of earlier tokens, a close "
        "relative: measure it here as prompt-lookup:N); serve this run with vLLM.",
    ),
    "llama_cpp": _cannot(
        "llama.cpp",
        "has no suffix decoding (its ngram-simple and ngram-cache are n-gram lookups: "
        "measure them here as prompt-lookup:N); serve this run with vLLM.",
    ),
    "transformers": _cannot(
        "transformers",
        "has no suffix decoding (prompt_lookup_num_tokens is prompt lookup: "
        "measure it here as prompt-lookup:N); serve this run with vLLM.",
    ),
}


# vLLM: vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM: speculators-format heads, aux-layer ids
# = the input of decoder layer i; an HF config's eagle_config ids are read as they are, unshifted:
# v1/worker/gpu_model_runner.py), vllm/config/speculative.py (method "eagle3", `model`, `num_speculative_tokens`).
# SGLang: python/sglang/srt/models/llama.py (set_eagle3_layers_to_capture adds 1 to each configured id: its ids
# name a layer's OUTPUT, one lower than vLLM's), llama_eagle3.py (LlamaForCausalLMEagle3, `midlayer.*`), the
# model runner (eagle_config.eagle_aux_hidden_state_layer_ids of the draft's config), the EAGLE verify path
# (target-only verification of argmax drafts, or chain speculative sampling of sampled drafts with
# --speculative-use-rejection-sampling, EAGLE/EAGLE3 only). The layouts: engine/config/head_format.py.
def _sglang_eagle3_sampled(draft_sampling: str) -> tuple[list[tuple[str, str | None]], tuple[str, ...]]:
    if draft_sampling == "greedy":
        return [], (
            "SGLang's EAGLE3 drafts the head's argmax and verifies target-only, as DraftLab measured with "
            "--draft-sampling greedy: lossless, the same acceptance rate.",
        )
    return [("--speculative-use-rejection-sampling", None)], (
        "--speculative-use-rejection-sampling samples the head's drafts and verifies them with their probabilities, "
        "as DraftLab measured (--draft-sampling probabilistic); it is recent: an older SGLang lacks the flag: drop "
        "it there, SGLang then drafts the head's argmax and verifies target-only: lossless, with the acceptance "
        "rate of --draft-sampling greedy (measure that).",
    )


_EAGLE3 = {
    "vllm": Serving(
        "eagle3",
        notes=(
            'vLLM loads the head\'s speculators directory (config.json with speculators_model_type "eagle3"); its '
            "eagle_aux_hidden_state_layer_ids are in vLLM's convention, DraftLab's: id i = the input of decoder "
            "layer i (transformers' hidden_states[i]). Check the server's per-position acceptance against the lab's: a "
            "collapse means the head's config or norms are read differently.",
        ),
        draft_layout="speculators",
    ),
    "sglang": Serving(
        "EAGLE3",
        _DRAFT_MODEL["sglang"].settings,
        (
            "EAGLE3 drafts k={k} steps deep (--speculative-num-steps); --speculative-num-draft-tokens counts the root "
            "(the last verified token): a chain (topk 1) verifies k + 1, which SGLang requires at topk 1.",
            'SGLang loads EAGLE-3 heads in its own layout (architectures ["LlamaForCausalLMEagle3"], `midlayer.*` '
            "weights, eagle_config.eagle_aux_hidden_state_layer_ids), whose aux ids are one LOWER than vLLM's: "
            "SGLang's id j = the output of decoder layer j = vLLM's id j + 1. The speculators directory itself would "
            "be misread (acceptance collapses): serve the head's SGLang copy, which `draftlab convert-head --to "
            "sglang` and train-head write as <head>/sglang.",
            "SGLang always drafts with the target's embedding (it replaces the head's own), as DraftLab does for a "
            "head saved without one.",
        ),
        draft_layout="sglang",
        sampled=_sglang_eagle3_sampled,
    ),
    "llama_cpp": _cannot(
        "llama.cpp",
        "drafts with a separate draft model or n-grams; it has no loader for an "
        "EAGLE-3 head that reads the target's hidden states; serve this run with vLLM or SGLang.",
    ),
    "transformers": _cannot(
        "transformers",
        "assisted generation drafts with a whole assistant model or prompt "
        "lookup; it cannot feed an EAGLE-3 head the target's hidden states; serve this run "
        "with vLLM or SGLang.",
    ),
}


# vLLM 0.32: vllm/config/speculative.py (SpeculativeMethod: ngram, medusa, mlp_speculator, draft_model, suffix,
# custom_class, the EAGLE/EAGLE-3/MTP/DFlash heads; nothing skips the target's own layers). SGLang:
# python/sglang/srt/speculative/spec_info.py (SpeculativeAlgorithm: EAGLE, EAGLE3, DFLASH, FROZEN_KV_MTP, STANDALONE,
# NGRAM). llama.cpp: common/speculative.cpp (--spec-type: draft, eagle3, mtp, the ngram-* lookups). transformers 5:
# generation/candidate_generator.py EarlyExitCandidateGenerator (an AssistedCandidateGenerator whose assistant is the
# target: it lowers the base model's config.num_hidden_layers to assistant_early_exit while drafting, so the drafts
# are the first L layers + the final norm + the LM head, with the assistant's own cache); the schedule and threshold
# come from the target's generation_config (verified on a tiny Llama: given to generate() they are ignored; an
# assistant_early_exit on the generation_config re-enters early exit inside the assistant's own generate()).
def _truncated_copy(served_as: str) -> str:
    return (
        f"has no early-exit (layer-skip) drafting: nothing drafts with the target's own first layers. The same drafts "
        f"come from the draft's first {{p}} decoder layers with its final norm and LM head saved as a model of their "
        f"own (num_hidden_layers={{p}}) and served {served_as}; unlike self-speculation it holds a second copy of "
        f"those weights and its own KV cache."
    )


_EARLY_EXIT = {
    "vllm": _cannot("vLLM", _truncated_copy('with method "draft_model"')),
    "sglang": _cannot("SGLang", _truncated_copy("with --speculative-algorithm STANDALONE")),
    "llama_cpp": _cannot("llama.cpp", _truncated_copy("converted to GGUF as -md (--spec-type draft)")),
    "transformers": Serving(
        "assistant early exit",
        lambda p, k: {
            "num_assistant_tokens": k,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        },
        (
            "assistant_early_exit={p} drafts with the target's first {p} decoder layers, its final norm and LM head, "
            "k={k} per round (assistant_confidence_threshold=0.0 turns off the default early stop at 0.4).",
            "transformers cuts the layers by lowering config.num_hidden_layers while drafting, which only a forward "
            "that runs layers[:num_hidden_layers] honours (Llama, Mistral, Qwen2/3, Gemma, Phi-3, ...); GPT-2, "
            "GPT-NeoX, OPT and Falcon run every layer, so there the assistant is the whole target.",
        ),
        call=lambda p, k: {"assistant_early_exit": int(p)},
    ),
}


# The serving engines every drafter declares a mapping for (storage/serving/deploy.py writes each one's settings).
SERVING_ENGINES = ("vllm", "sglang", "llama_cpp", "transformers")


class DeclarationError(TypeError):
    """A drafter's declaration is incomplete (a programming error, raised when it is declared: never a user's)."""


@dataclass(frozen=True)
class DrafterSpec:
    name: str  # the spec's name before the colon; its class in engine/decoding/drafting.py registers under it
    summary: str  # one line: what it proposes
    parameter: Parameter | None = None
    needs_model: bool = True  # drafts with the draft model (False: a run loads none)
    constant_k: bool = True  # every round proposes k drafts (until the budget ends): the formula's assumption
    needs_hidden_states: bool = False  # drafts from the target's hidden states (EAGLE-style heads)
    default_parameter: bool = False  # the bare name is the spec with the parameter's default (`suffix` = `suffix:24`)
    branches: bool = False  # drafts a token tree when tree_topk > 1 (engine/decoding/token_trees.py); else one chain
    # In the New-experiment form's default drafter comparison (pages/widgets/prefill.py), which compares strategies for
    # one draft model; False for a drafter that makes a different draft of it (early exit cuts it to L layers).
    default_sweep: bool = True
    serving: dict[str, Serving] = field(default_factory=dict)  # engine (SERVING_ENGINES) -> Serving

    def __post_init__(self) -> None:
        missing = [engine for engine in SERVING_ENGINES if engine not in self.serving]
        unknown = [engine for engine in self.serving if engine not in SERVING_ENGINES]
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(unknown)}"] if unknown else []
        )
        if problems:
            raise DeclarationError(
                f"drafter {self.name!r} must map every serving engine ({', '.join(SERVING_ENGINES)}): "
                f"{'; '.join(problems)} (an engine that cannot run it: _cannot(engine, why))"
            )
        for engine, serving in self.serving.items():
            if not isinstance(serving, Serving):
                raise DeclarationError(f"drafter {self.name!r}: serving[{engine!r}] is not a Serving")
            if serving.how is None and not serving.notes:
                raise DeclarationError(f"drafter {self.name!r}: {engine} cannot run it but no note says why")

    @property
    def usage(self) -> str:
        """`model` or `confidence:T`."""
        return self.name if self.parameter is None else f"{self.name}:{self.parameter.symbol}"

    def spec(self, value: int | float | None = None) -> str:
        """The canonical spec string of this drafter with `value` as its parameter."""
        return self.name if self.parameter is None or value is None else f"{self.name}:{value!r}"


SPECS: dict[str, DrafterSpec] = {
    spec.name: spec
    for spec in (
        DrafterSpec("model", "the draft model, a constant k per round", branches=True, serving=_DRAFT_MODEL),
        DrafterSpec(
            "heuristic",
            "the draft model; k starts at k, +2 after a fully accepted round, -1 (min 1) otherwise (transformers)",
            constant_k=False,
            serving=_HEURISTIC,
        ),
        DrafterSpec(
            "confidence",
            "the draft model; a round stops after a draft whose top probability is below T",
            Parameter(
                float,
                "T",
                "a probability threshold T with 0 < T < 1",
                "confidence:0.5",
                0.0,
                1.0,
                low_open=True,
                default=0.5,
            ),
            constant_k=False,
            serving=_CONFIDENCE,
        ),
        DrafterSpec(
            "prompt-lookup",
            "no draft model; the continuation of the longest earlier n-gram (n ≤ N) that ends the sequence",
            Parameter(
                int, "N", "the longest n-gram N to match, an integer from 1 to 64", "prompt-lookup:3", 1, 65, default=3
            ),
            needs_model=False,
            constant_k=False,
            serving=_PROMPT_LOOKUP,
        ),
        DrafterSpec(
            "suffix",
            "no draft model; the most frequent continuation of the longest match of the context in suffix trees "
            "of depth D over the prompt, the output and earlier responses (vLLM's suffix decoding)",
            Parameter(int, "D", "the suffix tree depth D, an integer from 1 to 64", "suffix:24", 1, 65, default=24),
            needs_model=False,
            constant_k=False,
            default_parameter=True,
            serving=_SUFFIX,
        ),
        DrafterSpec(
            "eagle3",
            "an EAGLE-3 head (--draft: its directory, vLLM's speculators or SGLang's layout; the drafter a head "
            "runs with when none is named) drafting from the target's own hidden states, a constant k per round",
            needs_hidden_states=True,
            branches=True,
            serving=_EAGLE3,
        ),
        DrafterSpec(
            "early-exit",
            "the draft model's first L decoder layers, then its own final norm and LM head, a constant k per round "
            "(LayerSkip's self-speculation with the target as --draft; transformers' assistant_early_exit)",
            Parameter(
                int,
                "L",
                "the number of draft layers L, an integer from 1 to 9999 below the draft's layer count",
                "early-exit:4",
                1,
                10**4,
                default=4,
                below_draft_layers=True,
            ),
            default_sweep=False,
            serving=_EARLY_EXIT,
        ),
    )
}
DEFAULT_DRAFTER = "model"
# How a draft model proposes (engine/decoding/drafting.py): draws from p_d, or its argmax verified as a point mass.
DRAFT_SAMPLING = ("probabilistic", "greedy")
DEFAULT_DRAFT_SAMPLING = "probabilistic"


def example_specs(**capabilities: bool) -> list[str]:
    """A valid spec of every drafter whose declaration has these capabilities (`needs_model=False`,
    `constant_k=False`, ...), in declaration order: what findings suggest trying, by capability, never by name."""
    return [
        spec.parameter.example if spec.parameter else spec.name
        for spec in SPECS.values()
        if all(getattr(spec, key) == value for key, value in capabilities.items())
    ]


def drafter_usage() -> str:
    """'model, heuristic, confidence:T (0 < T < 1), ...': every spec form, for help texts and error messages."""
    return ", ".join(spec.usage + (f" ({spec.parameter.meaning})" if spec.parameter else "") for spec in SPECS.values())


def parse_drafter(text: object) -> tuple[str, int | float | None]:
    """(name, parameter) of a drafter spec such as "model" or "confidence:0.5"; the parameter is None for a drafter
    that takes none. A DraftLabError names the problem and the fix on one line."""
    if not isinstance(text, str) or not text.strip():
        raise DraftLabError(f"empty drafter spec; use one of {drafter_usage()}")
    shown = text.strip()[:60]
    name, colon, raw = text.strip().partition(":")
    name, raw = name.strip(), raw.strip()
    spec = SPECS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, SPECS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise DraftLabError(f"unknown drafter {shown!r}; {hint}use one of {drafter_usage()}")
    param = spec.parameter
    if param is None:
        if colon:
            raise DraftLabError(f"drafter {name!r} takes no parameter (got {shown!r}); use {name}")
        return name, None
    if not raw and not colon and spec.default_parameter:
        return name, param.default
    if not raw:
        raise DraftLabError(
            f"drafter {name!r} needs {param.meaning} after a colon (got {shown!r}); use e.g. {param.example}"
        )
    value = param.parse(raw)
    if value is None:
        raise DraftLabError(f"drafter {name!r}: {raw[:40]!r} is not {param.meaning}; use e.g. {param.example}")
    return name, value


def drafter_spec(text: object) -> DrafterSpec:
    """The description of the drafter a spec names (the spec checked as parse_drafter does)."""
    return SPECS[parse_drafter(text)[0]]


def canonical_drafter(text: object) -> str:
    """One spelling per drafter configuration ("confidence:0.50 " -> "confidence:0.5"), for records and keys."""
    name, value = parse_drafter(text)
    return SPECS[name].spec(value)  # repr: the shortest spelling that reads back exactly


def needs_draft_model(text: object) -> bool:
    """Whether the drafter drafts with the draft model (False: a run needs no draft model at all)."""
    return drafter_spec(text).needs_model
