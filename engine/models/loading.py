"""Loading a target/draft pair from demo names, HF model ids or local directories, and checking the pair."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from engine import zoo
from engine.config import head_format
from engine.errors import DraftLabError
from engine.models import eagle3, placement, weight_files
from engine.models.cached_model import rollback_cache
from engine.models.vocab_bridge import VocabBridge, VocabMapping, intersect, least_shared
from engine.models.vocab_bridge import describe as describe  # the pair check's words (the page imports them here)
from engine.models.vocab_bridge import prompt_warning as prompt_warning  # the form's warning, the same way

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    name: str  # what the user asked for (demo name, HF id or path)
    source: str  # where it was loaded from
    model: torch.nn.Module
    tokenizer: object

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


@dataclass
class ModelPair:
    target: LoadedModel
    draft: LoadedModel | None  # None: drafting needs no model (prompt lookup)
    device: torch.device
    dtype: torch.dtype
    vocab_size: int  # the target tokenizer's vocabulary; logits beyond it (padding) are ignored
    # "shared": one tokenizer; "intersection": the draft's differs and drafts over the tokens both share
    # (engine/models/vocab_bridge.py, vLLM's use_heterogeneous_vocab), `mapping` its intersection.
    vocab: str = "shared"
    mapping: VocabMapping | None = None

    @property
    def vocab_coverage(self) -> float:
        """Share of the target's vocabulary the draft can propose (1.0 with one tokenizer)."""
        return 1.0 if self.mapping is None else self.mapping.coverage

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Every device the pair's weights are on, in index order: `device` alone, or the GPUs a target too large
        for one GPU is dispatched over (the draft and the inputs on the first, `device`)."""
        models = [self.target.model] + ([self.draft.model] if self.draft is not None else [])
        return placement.model_devices(*models)


def resolve_device(device: str = "auto") -> torch.device:
    if device not in DEVICES:
        raise DraftLabError(f"unknown device {device!r}; use one of {', '.join(DEVICES)}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DraftLabError(
            "--device cuda asked for, but torch sees no CUDA GPU; use --device cpu or install a CUDA build of torch"
        )
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype not in DTYPES:
        raise DraftLabError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def _source(name: str) -> str:
    demo = zoo.resolve(name)
    if demo is not None:
        return str(demo)
    if name in zoo.DEMO_MODELS:
        raise DraftLabError(
            f"demo model {name!r} is not built in this install; train it with `python -m engine.zoo.train --model "
            f"{name}`"
        )
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise DraftLabError(
                f"model directory {name!r} has no config.json; point at a directory saved with save_pretrained()"
            )
        return str(path)
    if zoo.missing_folder(name):  # a path, not an `org/name` hub id
        raise DraftLabError(zoo.missing_folder(name))
    return name  # an HF model id


def load_model(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    max_memory: dict[int, int] | None = None,
) -> LoadedModel:
    """Model in eval mode on `device` plus its tokenizer; a DraftLabError names anything that cannot load.
    max_memory ({GPU index: bytes}, engine.models.placement.plan): the model is dispatched over those GPUs by accelerate
    (`device_map="auto"`) instead, never moved afterwards."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _source(name)
    spread = {}
    if max_memory:
        if importlib.util.find_spec("accelerate") is None:
            raise DraftLabError(
                f"{name!r} is placed over {len(max_memory)} GPUs, which needs accelerate; pip install accelerate"
            )
        spread = {"device_map": "auto", "max_memory": max_memory}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=None, **spread
        )
    except (OSError, ValueError, KeyError) as exc:
        raise _cannot_load(name, exc) from exc
    except SafetensorError as exc:  # garbage or a truncated download: not an OSError
        raise _corrupt_weights(name, source, exc) from exc
    except torch.cuda.OutOfMemoryError as exc:
        raise DraftLabError(
            f"CUDA out of memory loading {name!r}; use a smaller --dtype (bfloat16) or a smaller model"
        ) from exc
    if spread:
        _check_dispatched(name, model)
    else:
        model.to(device)
    model.eval()
    return LoadedModel(name=name, source=source, model=model, tokenizer=tokenizer)


def _corrupt_weights(name: str, source: str, exc: Exception) -> DraftLabError:
    """A weights file safetensors cannot read, named (engine/models/weight_files.py: the first of a local directory's
    files that fails to open)."""
    bad = weight_files.first_unreadable(source)
    fix = (
        "copy or download the model again, or save it again with save_pretrained()"
        if bad is not None
        else "download it again (a hub id: remove the model from the Hugging Face cache first)"
    )
    return weight_files.corrupt(f"model {name!r}", bad and bad[0], exc, fix)


def _cannot_load(name: str, exc: Exception) -> DraftLabError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DraftLabError(
        f"cannot load model {name!r} ({first[:200]}); check the HF model id or local path, and your network/HF_TOKEN"
    )


def check_pair(target_tokenizer, draft_tokenizer, target_width: int, draft_width: int) -> int:
    """Raise unless both tokenizers map every token to the same id; return the shared vocabulary size.

    Embedding/output matrices padded past the vocabulary (width > vocabulary) are fine.
    """
    differ, t_by_id, d_by_id = _differing_ids(target_tokenizer, draft_tokenizer)
    if differ:
        raise DraftLabError(f"{_disagree(differ, t_by_id, d_by_id)}; pick a draft that shares the target's tokenizer")
    vocab = max(t_by_id) + 1 if t_by_id else 0
    for role, width in (("target", target_width), ("draft", draft_width)):
        _check_width(role, width, vocab)
    return vocab


def pair_vocabulary(
    target_tokenizer, draft_tokenizer, target_width: int, draft_width: int
) -> tuple[int, VocabMapping | None]:
    """(the target's vocabulary size, None) when both tokenizers map every token to the same id (`check_pair`); else
    (that size, the token-level intersection the draft drafts over: engine/models/vocab_bridge.py, vLLM's
    use_heterogeneous_vocab), refused in one line when they share too little."""
    differ, t_by_id, d_by_id = _differing_ids(target_tokenizer, draft_tokenizer)
    if not differ:
        return check_pair(target_tokenizer, draft_tokenizer, target_width, draft_width), None
    vocab = max(t_by_id) + 1 if t_by_id else 0
    _check_width("target", target_width, vocab)
    mapping = intersect(target_tokenizer, draft_tokenizer, target_width, draft_width)
    if mapping.shared < least_shared(mapping.target_vocabulary):
        raise DraftLabError(
            f"{_disagree(differ, t_by_id, d_by_id)} and share {mapping.shared} of the target's "
            f"{mapping.target_vocabulary} tokens, too few to draft over (at least "
            f"{least_shared(mapping.target_vocabulary)}); pick a draft whose vocabulary overlaps the target's, or "
            "one that shares its tokenizer"
        )
    return vocab, mapping


def _disagree(differ: list[int], t_by_id: dict[int, str], d_by_id: dict[int, str]) -> str:
    examples = ", ".join(f"id {i}: {t_by_id.get(i)!r} vs {d_by_id.get(i)!r}" for i in differ[:3])
    return (
        f"target and draft tokenizers disagree on {len(differ)} of {len(t_by_id | d_by_id)} token ids "
        f"(target vs draft: {examples})"
    )


def _differing_ids(target_tokenizer, draft_tokenizer) -> tuple[list[int], dict[int, str], dict[int, str]]:
    t_by_id = {i: t for t, i in target_tokenizer.get_vocab().items()}
    d_by_id = {i: t for t, i in draft_tokenizer.get_vocab().items()}
    return sorted(i for i in t_by_id.keys() | d_by_id.keys() if t_by_id.get(i) != d_by_id.get(i)), t_by_id, d_by_id


def _check_width(role: str, width: int, vocab: int) -> None:
    if width < vocab:
        raise DraftLabError(
            f"the {role} model scores {width} tokens but its tokenizer has {vocab}; "
            "the checkpoint does not match its tokenizer"
        )


def _check_dispatched(name: str, model) -> None:
    """A dispatched model must sit on GPUs only: accelerate puts what does not fit the budget on the CPU or disk."""
    spilled = sorted({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()} & {"cpu", "disk"})
    if spilled:
        raise DraftLabError(
            f"{name!r} does not fit the GPUs it was given (accelerate put part of it on "
            f"{' and '.join(spilled)}); give the worker more GPUs or use --dtype bfloat16"
        )


def plan_pair(
    target: str, draft: str | None, dtype: torch.dtype, trust_remote_code: bool = False, free: list[int] | None = None
) -> placement.Placement:
    """How many GPUs the pair takes (engine.models.placement.plan), from the models' configs and each visible GPU's free
    memory (`free`, else measured now); no weights are loaded."""
    free = placement.free_gpu_memory() if free is None else free
    return placement.plan(
        _weight_bytes(target, dtype, trust_remote_code),
        _weight_bytes(draft, dtype, trust_remote_code),
        free,
        target=f"target {target}",
        dtype=dtype,
    )


def _weight_bytes(name: str | None, dtype: torch.dtype, trust_remote_code: bool) -> int:
    if name is None:
        return 0
    if eagle3.is_head(name):  # no causal-LM config to build it from: its weight files, as stored (one layer: small)
        return sum(f.stat().st_size for f in head_format.local_dir(name).glob("*.safetensors"))
    try:
        return placement.weight_bytes(_source(name), dtype, trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise _cannot_load(name, exc) from exc


def load_pair(
    target: str,
    draft: str | None,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    gpus: int | None = None,
) -> ModelPair:
    """Load and check a target/draft pair (the check runs before any generation). draft=None loads the target
    alone, for drafters that need no model (prompt lookup). With device auto and several visible GPUs the target
    goes on the fewest GPUs it fits (plan_pair; `gpus` fixes that count, as a worker that leased them does), over
    several with accelerate; the draft always on the first."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    budget = None  # {GPU index: bytes} for the target when it is spread over several GPUs
    if device == "auto" and dev.type == "cuda" and torch.cuda.device_count() > 1:
        dev, free = torch.device("cuda", 0), placement.free_gpu_memory()
        if gpus is None:
            budget = plan_pair(target, draft, dt, trust_remote_code, free).max_memory
        elif gpus > 1:
            budget = placement.budget(free[:gpus], _weight_bytes(draft, dt, trust_remote_code))
    t = load_model(target, dev, dt, trust_remote_code, max_memory=budget)
    rollback_cache(t.model)  # a model whose KV cache cannot roll back is refused now, not mid-run
    width = _output_width(t.model)
    pair = ModelPair(
        target=t, draft=None, device=dev, dtype=dt, vocab_size=check_pair(t.tokenizer, t.tokenizer, width, width)
    )
    if draft is not None:
        pair = with_draft(pair, draft, trust_remote_code)
    configure_cpu_threads(pair)
    return pair


def with_draft(pair: ModelPair, draft: str | None, trust_remote_code: bool = False) -> ModelPair:
    """The same (already loaded) target with another draft, pair-checked; None: no draft model. A directory holding
    an EAGLE-3 head (speculators format, engine/models/eagle3.py) is loaded as one, never as a causal LM: it shares the
    target's tokenizer, and its verifier must be the target."""
    if draft is None:
        return ModelPair(pair.target, None, pair.device, pair.dtype, pair.vocab_size)
    if eagle3.is_head(draft):  # a speculators-format EAGLE-3 head: drafts for its own target, with its tokenizer
        head = eagle3.load_head(
            draft,
            pair.target.model,
            [pair.target.name, pair.target.source, pair.target.model.config.name_or_path],
            pair.device,
            pair.dtype,
        )
        return ModelPair(
            pair.target,
            LoadedModel(draft, str(head_format.local_dir(draft)), head, pair.target.tokenizer),
            pair.device,
            pair.dtype,
            pair.vocab_size,
        )
    # On the target's first device (pair.device), where the inputs go and a dispatched target returns its logits.
    d = load_model(draft, pair.device, pair.dtype, trust_remote_code)
    width = _output_width(pair.target.model)
    vocab, mapping = pair_vocabulary(pair.target.tokenizer, d.tokenizer, width, _output_width(d.model))
    rollback_cache(d.model)
    return bridged(ModelPair(pair.target, d, pair.device, pair.dtype, vocab), mapping)


def bridged(pair: ModelPair, mapping: VocabMapping | None) -> ModelPair:
    """The pair as it drafts: with `mapping` (a draft whose tokenizer differs), its draft model seen in the target's
    vocabulary (VocabBridge) and the pair an "intersection" one; without, the pair as it is."""
    if mapping is None or pair.draft is None:
        return pair
    d = pair.draft
    model = VocabBridge(d.model, mapping, _output_width(pair.target.model))
    return ModelPair(
        pair.target,
        LoadedModel(d.name, d.source, model, d.tokenizer),
        pair.device,
        pair.dtype,
        pair.vocab_size,
        vocab="intersection",
        mapping=mapping,
    )


SMALL_MODEL_PARAMETERS = 100_000_000


def configure_cpu_threads(pair: ModelPair) -> int:
    """Intra-op threads for CPU decoding: $DRAFTLAB_CPU_THREADS if set; else 1 for small models, whose batch-1
    steps are too short to split (measured on the demo pair: best-k speedup 1.27 on 1 thread, 1.04 on 2, the
    draft slowing most); torch's default otherwise. Returns the thread count in effect."""
    if pair.device.type == "cpu":
        wanted = os.environ.get("DRAFTLAB_CPU_THREADS")
        if wanted:
            torch.set_num_threads(max(1, int(wanted)))
        elif pair.target.parameters < SMALL_MODEL_PARAMETERS:
            torch.set_num_threads(1)
    return torch.get_num_threads()


def _output_width(model) -> int:
    return model.get_output_embeddings().weight.shape[0]
