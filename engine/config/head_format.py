"""The two directory layouts an EAGLE-3 head is saved in, and what each one's aux-layer ids mean: reading either
into one description (`HeadSpec`, ids in DraftLab's convention), writing either config, and where a head's SGLang
copy lives. Plain Python, no torch: the run configuration (which drafter a --draft runs with) and storage (the
deploy tabs) read it; engine/models/eagle3.py loads and converts the weights.

    speculators  what vLLM serves as {"method": "eagle3", "model": DIR} and DraftLab writes: config.json with
                 `speculators_model_type: "eagle3"`, the Llama layer under `transformer_layer_config`, and
                 `eagle_aux_hidden_state_layer_ids` at the top level in vLLM's convention, which is DraftLab's:
                 id i = the INPUT of decoder layer i = transformers' hidden_states[i]. Weights `layers.0.*`.
                 (vllm/transformers_utils/configs/speculators/algos.py reads a missing norm_before_residual as
                 True: so does this module.)
    sglang       what SGLang loads (python/sglang/srt/models/llama_eagle3.py, LlamaForCausalLMEagle3) and SpecForge
                 writes: an HF config with `architectures: ["LlamaForCausalLMEagle3"]`, the Llama keys at the top
                 level, `draft_vocab_size`, and `eagle_config: {"eagle_aux_hidden_state_layer_ids": [...],
                 "use_aux_hidden_state": true}` in SGLang's convention: id j = the OUTPUT of decoder layer j, one
                 LOWER than vLLM's (models/llama.py set_eagle3_layers_to_capture captures at j + 1, before layer
                 j + 1 runs). No ids: SGLang captures [2, L/2, L-3], vLLM's default. Weights `midlayer.*`; SGLang
                 loads `d2t` (its hot token ids), skips `t2d`, and always replaces the head's embedding with the
                 target's (eagle_worker's set_embed; unless the head is narrower than the target). Its midlayer
                 takes the residual BEFORE hidden_norm and has no norm before `fc`: a head with
                 norm_before_residual or norm_before_fc cannot be served there.

A head in the SGLang layout names no target; DraftLab adds `verifier_name_or_path` when it writes one (SGLang and
SpecForge ignore unknown keys), so a round trip keeps it.

    spec = head_spec("heads/demo")              # either layout; spec.aux_layers in DraftLab's convention
    sglang_config(spec)["eagle_config"]         # {"eagle_aux_hidden_state_layer_ids": [i - 1, ...], ...}
    sglang_dir("heads/demo")                    # heads/demo/sglang: where the SGLang copy of a head goes
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import DraftLabError

# A head's directory, or a shipped demo's name: anything str() makes a path of.
PathName = str | os.PathLike[str]
# A config.json read as a JSON object.
Config = dict[str, Any]

SPECULATORS, SGLANG = "speculators", "sglang"
LAYOUTS = (SPECULATORS, SGLANG)
SPECULATORS_TYPE = "eagle3"
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
# Where each layout keeps the head's one decoder layer (the other weights are named alike in both).
LAYER_PREFIX = {SPECULATORS: "layers.0.", SGLANG: "midlayer."}
# The keys of a head's config that are not its Llama decoder layer's (SGLang's config holds both at the top level;
# speculators' layer is its transformer_layer_config): everything else is carried from one layout to the other.
NOT_LAYER_KEYS = frozenset(
    {
        "architectures",
        "model_type",
        "num_hidden_layers",
        "draft_vocab_size",
        "target_hidden_size",
        "eagle_config",
        "norm_before_residual",
        "norm_before_fc",
        "verifier_name_or_path",
        "speculators_model_type",
        "speculators_config",
        "speculators_version",
        "transformer_layer_config",
        "eagle_aux_hidden_state_layer_ids",
        "auto_map",
    }
)


@dataclass(frozen=True)
class HeadSpec:
    """One head's config, whatever its layout. aux_layers: DraftLab's convention (id i = the input of decoder layer
    i), None when the file names none (then every engine reads [2, L/2, L-3] of an L-layer target)."""

    layout: str
    layer: Config  # the Llama decoder layer's config keys (not NOT_LAYER_KEYS)
    draft_vocab_size: int
    target_hidden_size: int | None
    aux_layers: tuple[int, ...] | None
    norm_before_residual: bool
    norm_before_fc: bool
    verifier: str | None
    speculative_tokens: int | None = None  # speculators' proposal_methods (what vLLM drafts by default)


def local_dir(name: PathName) -> Path:
    """The directory a draft name points at: a shipped demo model's, else the path as given (~ expanded)."""
    from engine import zoo

    text = str(name).strip()
    return zoo.resolve(text) or Path(text).expanduser()


def read_config(path: PathName) -> Config | None:
    """The config.json of directory `path` as a dict, or None when there is none (or it is not a JSON object)."""
    file = local_dir(path) / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def config_layout(config: Config | None) -> str | None:
    """Which head layout a config.json is in (SPECULATORS or SGLANG), None when it is not an EAGLE-3 head's."""
    if not isinstance(config, dict):
        return None
    if config.get("speculators_model_type") == SPECULATORS_TYPE:
        return SPECULATORS
    if SGLANG_ARCHITECTURE in (config.get("architectures") or ()):
        return SGLANG
    return None


def head_layout(path: PathName) -> str | None:
    """The layout of the EAGLE-3 head in directory `path`, None when it holds no head (a causal LM, nothing)."""
    return config_layout(read_config(path))


def is_head(path: PathName) -> bool:
    """Whether `path` is an EAGLE-3 head directory (either layout), not a causal LM."""
    return head_layout(path) is not None


def is_causal_lm_dir(path: PathName) -> bool:
    """Whether `path` is a local model directory (or a shipped demo) that is not an EAGLE-3 head: an HF id that is
    not on disk is neither (nothing can be said of it before it loads)."""
    config = read_config(path)
    return config is not None and config_layout(config) is None


def sglang_dir(head: PathName) -> Path:
    """Where the SGLang-layout copy of the head in directory (or shipped name) `head` goes: its `sglang`
    subdirectory (what train-head and `draftlab convert-head --to sglang` write, and what the deploy tab serves)."""
    return local_dir(head) / SGLANG


def serving_dir(head_name: PathName, layout: str) -> tuple[Path, bool]:
    """Where the head of `head_dir` is in `layout`, and whether it is there yet: the head itself when it is in that
    layout (a directory not readable here counts as the speculators layout, the one DraftLab runs and writes), else
    its `<layout>` subdirectory (sglang_dir for SGLang), present once it holds a head in that layout."""
    head = local_dir(head_name)
    if (head_layout(head) or SPECULATORS) == layout:
        return head, True
    converted = head / layout
    return converted, head_layout(converted) == layout


def _refuse(path: PathName, why: str, fix: str) -> DraftLabError:
    return DraftLabError(f"EAGLE-3 head {str(path)!r} {why}; {fix}")


def _ids(raw: object, path: PathName, where: str) -> tuple[int, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
        raise _refuse(path, f"has {where} {raw!r}, not a list of layer ids", "save it with a list such as [2, 6, 9]")
    return tuple(raw)


def _layer(source: Config) -> Config:
    """The layer's keys of a config; transformers 5's `rope_parameters` also spelled as rope_theta / rope_scaling,
    which is what SGLang and older readers take."""
    layer = {key: value for key, value in source.items() if key not in NOT_LAYER_KEYS}
    rope = layer.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" in rope:
            layer.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            layer.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    return layer


def spec_from_config(config: Config, path: PathName = "the head") -> HeadSpec:
    """The HeadSpec of a head's config.json (either layout); a DraftLabError says in one line what is missing."""
    layout = config_layout(config)
    if layout == SPECULATORS:
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise _refuse(path, "has no transformer_layer_config", "save the head with its Llama layer config")
        methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
        tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
        verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        return HeadSpec(
            SPECULATORS,
            _layer(layer),
            int(config.get("draft_vocab_size") or layer.get("vocab_size") or 0),
            config.get("target_hidden_size"),
            _ids(config.get("eagle_aux_hidden_state_layer_ids"), path, "eagle_aux_hidden_state_layer_ids"),
            bool(config.get("norm_before_residual", True)),
            bool(config.get("norm_before_fc", False)),
            verifier or None,
            tokens if isinstance(tokens, int) else None,
        )
    if layout == SGLANG:
        eagle = config.get("eagle_config") or {}
        if not isinstance(eagle, dict):
            raise _refuse(path, "has an eagle_config that is not an object", "save it as SpecForge does")
        if eagle.get("use_aux_hidden_state", True) is False:
            raise _refuse(
                path,
                "sets eagle_config.use_aux_hidden_state false (it reads no aux hidden states)",
                "use a head trained on the target's aux hidden states (EAGLE-3)",
            )
        sglang_ids = _ids(
            eagle.get("eagle_aux_hidden_state_layer_ids"), path, "eagle_config.eagle_aux_hidden_state_layer_ids"
        )
        return HeadSpec(
            SGLANG,
            _layer(config),
            int(config.get("draft_vocab_size") or config.get("vocab_size") or 0),
            config.get("target_hidden_size"),
            None if sglang_ids is None else tuple(j + 1 for j in sglang_ids),  # output of j = input of j+1
            bool(config.get("norm_before_residual", False)),
            bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
            config.get("verifier_name_or_path") or None,
        )
    raise _refuse(
        path,
        'has no config.json of an EAGLE-3 head (speculators_model_type "eagle3", or architectures '
        f'["{SGLANG_ARCHITECTURE}"])',
        "point --draft at a head directory in the speculators or the SGLang layout",
    )


def head_spec(path: PathName) -> HeadSpec:
    """The HeadSpec of the head in directory `path` (either layout); a DraftLabError when it holds none."""
    config = read_config(path)
    if config is None:
        raise _refuse(
            path, "has no readable config.json", "give an EAGLE-3 head directory (speculators or SGLang layout)"
        )
    return spec_from_config(config, path)


def speculators_config(spec: HeadSpec, speculative_tokens: int | None = None) -> Config:
    """The speculators-format config.json of a head (SPEC "EAGLE-3 heads"; vLLM's convention for aux ids)."""
    layer = {key: value for key, value in spec.layer.items() if key != "torch_dtype"}
    layer.update(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1)
    if "torch_dtype" in spec.layer:
        layer["torch_dtype"] = spec.layer["torch_dtype"]
    tokens = speculative_tokens or spec.speculative_tokens or 3
    config: Config = {
        "speculators_model_type": SPECULATORS_TYPE,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.target_hidden_size,
        "norm_before_residual": spec.norm_before_residual,
        "norm_before_fc": spec.norm_before_fc,
        **({} if spec.aux_layers is None else {"eagle_aux_hidden_state_layer_ids": list(spec.aux_layers)}),
        "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(tokens)}],
            "verifier": {"name_or_path": spec.verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }
    if spec.target_hidden_size is None:
        del config["target_hidden_size"]
    return config


def sglang_problem(spec: HeadSpec) -> str | None:
    """Why SGLang cannot serve this head as trained (its LlamaForCausalLMEagle3 computes another function), or None."""
    if spec.norm_before_residual:
        return (
            "normalises the state before taking the residual (norm_before_residual), which SGLang's "
            "LlamaForCausalLMEagle3 does not (its midlayer takes the residual before hidden_norm)"
        )
    if spec.norm_before_fc:
        return (
            "normalises the aux states before fc (norm_before_fc), which SGLang's LlamaForCausalLMEagle3 has no "
            "norm for"
        )
    if spec.aux_layers is not None and len(set(spec.aux_layers)) < len(spec.aux_layers):
        return (
            f"reads one layer twice (aux ids {list(spec.aux_layers)}), which SGLang captures once (its "
            f"layers_to_capture is a membership test)"
        )
    if spec.aux_layers is not None and min(spec.aux_layers) < 1:
        return (
            f"reads the embedding (aux ids {list(spec.aux_layers)}: id 0), which SGLang cannot capture (its id "
            f"would be -1, and before layer 0 its residual is not set)"
        )
    return None


def sglang_config(spec: HeadSpec) -> Config:
    """The SGLang / SpecForge config.json of a head: aux ids one lower than DraftLab's (SGLang's convention). A
    DraftLabError when SGLang cannot compute this head (sglang_problem)."""
    problem = sglang_problem(spec)
    if problem is not None:
        raise DraftLabError(f"this EAGLE-3 head {problem}; serve it with vLLM (the speculators directory)")
    layer = {key: value for key, value in spec.layer.items()}
    eagle: Config = {"use_aux_hidden_state": True}
    if spec.aux_layers is not None:
        eagle = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in spec.aux_layers], **eagle}
    config: Config = {
        "architectures": [SGLANG_ARCHITECTURE],
        "model_type": "llama",
        **layer,
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "draft_vocab_size": spec.draft_vocab_size,
    }
    if spec.target_hidden_size is not None:
        config["target_hidden_size"] = spec.target_hidden_size
    config["eagle_config"] = eagle
    if spec.verifier:
        config["verifier_name_or_path"] = spec.verifier
    return config


def layout_config(spec: HeadSpec, layout: str) -> Config:
    """The config.json of `spec` in `layout` (SPECULATORS or SGLANG)."""
    if layout == SGLANG:
        return sglang_config(spec)
    if layout == SPECULATORS:
        return speculators_config(spec)
    raise DraftLabError(f"unknown head layout {layout!r}; use {' or '.join(LAYOUTS)}")


def with_verifier(spec: HeadSpec, verifier: str | None) -> HeadSpec:
    """The same head naming `verifier` as its target (when given)."""
    return replace(spec, verifier=verifier) if verifier else spec


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def check_verifier(path: PathName, verifier: str | None, target_names: list[str], required: bool = True) -> None:
    """Refuse a head trained for another target: its verifier must be the run's target, by the name the run gave
    (a demo name, an HF id) or the same directory. `required=False` (the SGLang layout names no target): a head
    without a verifier is checked by its shapes alone."""
    shown = target_names[0] if target_names else "the target"
    if not verifier:
        if not required:
            return
        raise _refuse(
            path,
            "names no target (speculators_config.verifier.name_or_path is empty)",
            f"set it to the target it was trained for, e.g. {shown!r}",
        )
    if not any(_same_model(verifier, name) for name in target_names if name):
        raise _refuse(
            path,
            f"was trained for target {verifier!r}, not this run's target {shown!r}",
            f"run it with --target {verifier} or use a head trained for {shown}",
        )


def check_for_target(
    spec: HeadSpec, path: PathName, target_names: list[str], num_layers: int, hidden_size: int, vocab_size: int
) -> tuple[int, ...]:
    """Check that the head can draft for a target of `num_layers` decoder layers, hidden states `hidden_size` wide
    and `vocab_size` output ids (its verifier, aux ids, widths); return its aux ids in DraftLab's convention (the
    engines' default [2, L/2, L-3] when it names none). A DraftLabError says in one line why not."""
    check_verifier(path, spec.verifier, target_names, required=spec.layout == SPECULATORS)
    aux = spec.aux_layers
    if aux is None:  # vLLM's and SGLang's default for a Llama target
        aux = (2, num_layers // 2, num_layers - 3)
    if not all(0 <= i < num_layers for i in aux):
        if spec.layout == SGLANG:
            raise _refuse(
                path,
                f"reads target layers {[i - 1 for i in aux]!r} in SGLang's convention (the output "
                f"of layer j), but the target has decoder layers 0..{num_layers - 1}: SGLang's ids go "
                f"from 0 to {num_layers - 2}",
                "train it for this target",
            )
        raise _refuse(
            path,
            f"reads target layers {list(aux)!r}, but the target has decoder layers 0..{num_layers - 1}",
            "train it for this target (eagle_aux_hidden_state_layer_ids: ids of its decoder layers)",
        )
    target_hidden = spec.target_hidden_size or spec.layer.get("hidden_size")
    if target_hidden != hidden_size:
        raise _refuse(
            path,
            f"reads target hidden states of width {target_hidden}, the target's are {hidden_size}",
            "use a head trained for this target",
        )
    if spec.layer.get("vocab_size") != vocab_size:
        raise _refuse(
            path,
            f"scores a target vocabulary of {spec.layer.get('vocab_size')} ids, the target has {vocab_size}",
            "use a head trained for this target",
        )
    return tuple(aux)
