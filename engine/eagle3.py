"""EAGLE-3 heads (Li et al. 2025, arXiv 2503.01840) in the speculators format vLLM serves as
`{"method": "eagle3", "model": DIR}`: loading one and its forward, as plain torch over transformers' Llama parts.

A head is one decoder layer that reads the TARGET's own hidden states. It follows vLLM faithfully
(vllm/model_executor/models/llama_eagle3.py: LlamaDecoderLayer with layer_idx 0, LlamaModel, Eagle3LlamaForCausalLM):
  - `fc` [hidden, 3 x target_hidden] (no bias) combines the target's hidden states of the layers
    `eagle_aux_hidden_state_layer_ids` (vLLM's convention: id i = the input of decoder layer i = transformers'
    `hidden_states[i]`), concatenated in that order (`combine`, vLLM's combine_hidden_states);
  - the decoder layer normalises the token's embedding (`input_layernorm`) and the state (`hidden_norm`; the
    residual is the state before it, or after it with `norm_before_residual`), feeds their concatenation
    [embedding, state] (2 x hidden) to q/k/v, adds the attention to the residual, then a Llama MLP with its own
    residual: its output before the final `norm` is what the next draft step reads (vLLM's `hidden_prenorm`);
  - `lm_head` scores the draft vocabulary; draft id d is target id d + d2t[d] (`d2t`); logits are returned over
    the TARGET vocabulary with -inf elsewhere (vLLM's compute_logits), so a drafter's distribution is already one
    over the target's ids with zeros outside the draft vocabulary.
`norm_before_fc` (speculators' `input_norm`, an RMSNorm over the 3 states before `fc`) is read too. vLLM applies it
(llama_eagle3.py:184-188 reads `norm_before_fc` from the config, or from `eagle_config` in the HF layout; :405-407
applies `input_norm` in combine_hidden_states; the speculators conversion copies the key, default False:
vllm/transformers_utils/configs/speculators/algos.py:36). SGLang's llama_eagle3.py (sgl-project/sglang @ 03d5a77)
has no `input_norm`: it drops that weight and serves such a head without the norm, one way its acceptance collapses.

What vLLM 0.32 does that the lab copies (checked in its installed source):
  - aux ids: the target appends the state after `i` decoder layers for each id i (vllm/model_executor/models/
    llama.py:428-441, `_maybe_add_hidden_state(.., idx + 1, ..)`: id i = the input of layer i = transformers'
    hidden_states[i]); the ids are captured SORTED and once each (models/interfaces.py:1578
    `tuple(sorted(set(layers)))`), so the concatenation is in ascending id order whatever the config's order;
  - the ids come from the draft config's `eagle_aux_hidden_state_layer_ids` (speculators: algos.py:47-50) or, in
    the HF/SGLang layout, `eagle_config.eagle_aux_hidden_state_layer_ids` (v1/worker/gpu_model_runner.py:5268-5280),
    used as they are, never shifted; absent, the target's default (2, L/2, L-3) (interfaces.py:1712-1725);
  - `norm_before_residual` absent from a speculators config counts as TRUE (algos.py:33-35);
  - a head whose draft vocabulary is the target's has no d2t parameter (llama_eagle3.py:339-345): a saved d2t
    then fails to load ("no module or parameter named 'draft_id_to_target_id'"), so `save_head` leaves it out;
  - no `embed_tokens.weight` in the checkpoint: the target's embedding is shared (llama_eagle3.py:460-461 skips it;
    v1/spec_decode/llm_base_proposer.py:1436-1501 shares the target's);
  - the fc input is `num_aux_hidden_states` (else len(eagle_config's ids), else 3) x target_hidden_size
    (llama_eagle3.py:209-221): a speculators head is read with THREE aux states.

Weights: `embed_tokens.weight` (absent: the target's embedding is shared, as vLLM does), `fc.weight`,
`layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`, `layers.0.self_attn.{q,k,v,o}_proj.weight`,
`layers.0.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d` (the HF/SGLang layout's
`midlayer.` prefix is read as `layers.0.`, as vLLM does). A head names its target in
`speculators_config.verifier.name_or_path`; a head whose verifier is not the run's target is refused in one line.

The head's forward has the signature engine/batched_cache.py calls (input_ids, attention_mask, position_ids, cache,
logits_to_keep) plus `hidden_states` [B, W, hidden] (the combined target states, or the head's own pre-norm
output), so one BatchCache keeps its KV cache for B rows with holes, rollback and compaction like any draft model's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from .errors import DraftLabError

SPECULATORS_TYPE = "eagle3"


def head_dir(path) -> Path:
    """The directory `path` names: a shipped demo name (engine/zoo, e.g. demo-eagle3) or a local path."""
    from . import zoo

    return zoo.resolve(str(path)) or Path(str(path)).expanduser()


def head_config(path) -> dict | None:
    """The config.json of a speculators-format EAGLE-3 head directory, or None when `path` is not one."""
    file = head_dir(path) / "config.json"
    if not file.is_file():
        return None
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and config.get("speculators_model_type") == SPECULATORS_TYPE else None


def is_head(path) -> bool:
    """Whether `path` is an EAGLE-3 head directory (speculators format), not a causal LM."""
    return head_config(path) is not None


@dataclass
class Eagle3Output:
    logits: torch.Tensor  # [B, keep or W, target vocab], -inf outside the draft vocabulary
    hidden_states: tuple  # (the state fed in, the layer's output before the final norm: vLLM's hidden_prenorm)


class Eagle3DecoderLayer(nn.Module):
    """The head's one decoder layer: Llama attention whose q/k/v read [embedding, state] (2 x hidden)."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool):
        super().__init__()
        hidden = config.hidden_size
        self.norm_before_residual = norm_before_residual
        self.self_attn = LlamaAttention(config, layer_idx=0)
        attn = self.self_attn
        for name, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads),
                            ("v_proj", config.num_key_value_heads)):
            setattr(attn, name, nn.Linear(2 * hidden, heads * attn.head_dim, bias=config.attention_bias))
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(self, embeds, state, attention_mask, position_embeddings, cache):
        embeds = self.input_layernorm(embeds)
        if self.norm_before_residual:
            state = self.hidden_norm(state)
            residual = state
        else:
            residual, state = state, self.hidden_norm(state)
        attended, _ = self.self_attn(torch.cat([embeds, state], -1), position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, cache=cache)
        residual = attended + residual
        return self.mlp(self.post_attention_layernorm(residual)) + residual


class Eagle3Head(nn.Module):
    """An EAGLE-3 head (see the module docstring); `aux_layers` are the target's hidden_states it reads."""

    def __init__(self, config: LlamaConfig, *, draft_vocab_size: int, target_hidden_size: int,
                 aux_layers: list[int], norm_before_residual: bool = False, norm_before_fc: bool = False,
                 verifier: str | None = None):
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.aux_layers = sorted(aux_layers)  # vLLM concatenates the aux states in ascending id order
        self.verifier = verifier
        self.draft_vocab_size = draft_vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.input_norm = (LlamaRMSNorm(len(aux_layers) * target_hidden_size, eps=config.rms_norm_eps)
                           if norm_before_fc else None)
        self.fc = nn.Linear(len(aux_layers) * target_hidden_size, hidden, bias=False)
        self.layers = nn.ModuleList([Eagle3DecoderLayer(config, norm_before_residual)])
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id (d + d2t[d])."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def covers_target(self) -> bool:
        """Whether every target id is some draft id's (then no logit is -inf and the draft's KL is finite)."""
        return self.draft_vocab_size >= self.config.vocab_size and bool(
            torch.zeros(self.config.vocab_size, dtype=torch.bool, device=self.d2t.device)
            .index_fill(0, self.target_ids(), True).all())

    def combine(self, states: torch.Tensor) -> torch.Tensor:
        """The head's input state from the target's aux hidden states concatenated [..., 3 x target_hidden]."""
        if self.input_norm is not None:
            states = self.input_norm(states)
        return self.fc(states)

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor, attention_mask=None, position_ids=None,
                cache=None, use_cache: bool | None = None, logits_to_keep: int = 0, output_hidden_states=None,
                **kwargs) -> Eagle3Output:
        """Logits over the target vocabulary for tokens input_ids [B, W] with their states hidden_states
        [B, W, hidden]; the KV cache `cache` grows by W columns."""
        embeds = self.embed_tokens(input_ids)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(input_ids.shape[1], device=input_ids.device) + past)[None]
        mask = create_causal_mask(config=self.config, inputs_embeds=embeds, attention_mask=attention_mask,
                                  cache=cache, position_ids=position_ids)
        rotary = self.rotary_emb(embeds, position_ids=position_ids)
        prenorm = self.layers[0](embeds, hidden_states, mask, rotary, cache)
        kept = prenorm[:, -logits_to_keep:] if logits_to_keep else prenorm
        draft_logits = self.lm_head(self.norm(kept))
        logits = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        logits[..., self.target_ids()] = draft_logits
        return Eagle3Output(logits, (hidden_states, prenorm))


def _refuse(path, why: str, fix: str) -> DraftLabError:
    return DraftLabError(f"EAGLE-3 head {str(path)!r} {why}; {fix}")


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def check_verifier(path, verifier: str | None, target_names: list[str]) -> None:
    """Refuse a head trained for another target: its verifier must be the run's target, by the name the run gave
    (a demo name, an HF id) or the same directory."""
    shown = target_names[0] if target_names else "the target"
    if not verifier:
        raise _refuse(path, "names no target (speculators_config.verifier.name_or_path is empty)",
                      f"set it to the target it was trained for, e.g. {shown!r}")
    if not any(_same_model(verifier, name) for name in target_names if name):
        raise _refuse(path, f"was trained for target {verifier!r}, not this run's target {shown!r}",
                      f"run it with --target {verifier} or use a head trained for {shown}")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if files:
        state = {}
        for file in files:
            state.update(load_file(str(file)))
        return state
    bins = sorted(path.glob("*.bin"))
    if not bins:
        raise _refuse(path, "has no weights (no *.safetensors or *.bin file)", "point --draft at a saved head")
    state = {}
    for file in bins:
        state.update(torch.load(str(file), map_location="cpu", weights_only=True))
    return state


def load_head(path, target_model, target_names: list[str], device, dtype, overrides: dict | None = None
              ) -> Eagle3Head:
    """The EAGLE-3 head in directory `path` for `target_model` (a transformers causal LM, whose embedding it shares
    when it has none), on `device` in `dtype`; a DraftLabError says in one line why a head cannot draft for it.
    `overrides`: config.json keys read as given instead (engine/head_check.py tries other aux ids and norms)."""
    path = head_dir(path)
    raw = head_config(path)
    if raw is None:
        raise _refuse(path, "has no config.json with speculators_model_type \"eagle3\"",
                      "point --draft at a speculators-format EAGLE-3 head directory")
    raw = {**raw, **(overrides or {})}
    verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    check_verifier(path, verifier, target_names)
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise _refuse(path, "has no transformer_layer_config", "save the head with its Llama layer config")
    layer = {key: value for key, value in layer.items() if key not in ("architectures", "model_type")}
    config = LlamaConfig(**{**layer, "num_hidden_layers": 1})
    config._attn_implementation = "sdpa"
    target = target_model.config.get_text_config(decoder=True)
    layers, width = target.num_hidden_layers, target.hidden_size
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if aux is None:  # vLLM's default for a Llama target
        aux = [2, layers // 2, layers - 3]
    if not isinstance(aux, list) or not aux or not all(isinstance(i, int) and 0 <= i < layers for i in aux):
        raise _refuse(path, f"reads target layers {aux!r}, but the target has decoder layers 0..{layers - 1}",
                      "train it for this target (eagle_aux_hidden_state_layer_ids: ids of its decoder layers)")
    if len(set(aux)) != len(aux):
        raise _refuse(path, f"reads target layers {aux!r} with a repeat; vLLM captures each layer once",
                      "list distinct ids in eagle_aux_hidden_state_layer_ids")
    target_hidden = raw.get("target_hidden_size") or config.hidden_size
    if target_hidden != width:
        raise _refuse(path, f"reads target hidden states of width {target_hidden}, the target's are {width}",
                      "use a head trained for this target")
    vocab = target_model.get_output_embeddings().weight.shape[0]
    if config.vocab_size != vocab:
        raise _refuse(path, f"scores a target vocabulary of {config.vocab_size} ids, the target has {vocab}",
                      "use a head trained for this target")
    head = Eagle3Head(config, draft_vocab_size=int(raw.get("draft_vocab_size") or config.vocab_size),
                      target_hidden_size=width, aux_layers=aux,
                      norm_before_residual=bool(raw.get("norm_before_residual", True)),  # vLLM's default
                      norm_before_fc=bool(raw.get("norm_before_fc", False)), verifier=verifier)
    state = {name.replace("midlayer.", "layers.0."): tensor for name, tensor in _weights(path).items()}
    optional = {"embed_tokens.weight", "input_norm.weight"}  # vLLM leaves an unsaved input_norm at ones
    if head.input_norm is None:
        state.pop("input_norm.weight", None)  # vLLM drops it when norm_before_fc is off (llama_eagle3.py:464-465)
    if "embed_tokens.weight" not in state:
        head.embed_tokens = target_model.get_input_embeddings()  # shared with the target, as vLLM does
    if head.draft_vocab_size == config.vocab_size:
        optional |= {"d2t", "t2d"}  # the identity (their zeros / all-true defaults), as vLLM reads such a head
        head.t2d.fill_(True)
    expected = set(head.state_dict())
    missing = sorted(expected - set(state) - optional)
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        what = ", ".join([f"missing {n}" for n in missing[:3]] + [f"unexpected {n}" for n in unexpected[:3]])
        raise _refuse(path, f"does not have the speculators EAGLE-3 weights ({what})",
                      "save it in the speculators format (engine/eagle3.py names the weights)")
    try:
        head.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or ["shape mismatch"])[-1].strip()[:200]
        raise _refuse(path, f"has weights of the wrong shape ({first})", "save it with its own config.json") from exc
    head.to(device=device, dtype=dtype)
    if int(head.target_ids().max()) >= vocab or int(head.target_ids().min()) < 0:
        raise _refuse(path, "maps draft ids outside the target vocabulary (d2t)", "rebuild its d2t for this target")
    return head.eval()


# --- a new head for a target, and saving one ---------------------------------------------------------------------

def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's default aux-layer ids for a target of `num_layers` decoder layers (its convention): (2, L/2, L-3),
    which is SpecForge's (1, L/2 - 1, L - 4) in SGLang's convention (one lower)."""
    if num_layers < 4:
        return sorted({min(i, num_layers - 1) for i in (1, num_layers // 2, num_layers - 1)})[:3] or [0]
    return [2, num_layers // 2, num_layers - 3]


def layer_config(target_model) -> dict:
    """The head's `transformer_layer_config`: one Llama decoder layer as wide as the target (the head reads the
    target's embedding and hidden states), with the target's heads, RoPE and norm epsilon."""
    t = target_model.config.get_text_config(decoder=True)
    rope = dict(getattr(t, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(t, "rope_theta", 10000.0))
    layer = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": int(t.vocab_size),
             "hidden_size": int(t.hidden_size), "intermediate_size": int(t.intermediate_size),
             "num_hidden_layers": 1, "num_attention_heads": int(t.num_attention_heads),
             "num_key_value_heads": int(getattr(t, "num_key_value_heads", None) or t.num_attention_heads),
             "head_dim": int(getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads),
             "max_position_embeddings": int(t.max_position_embeddings), "rms_norm_eps": float(
                 getattr(t, "rms_norm_eps", None) or getattr(t, "layer_norm_eps", None) or 1e-6),
             "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
             "rope_theta": float(theta)}
    if rope.get("rope_type", "default") != "default":
        layer["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return layer


def new_head(target_model, aux_layers: list[int], draft_ids: torch.Tensor, verifier: str,
             norm_before_fc: bool = False) -> Eagle3Head:
    """A fresh head for `target_model` reading `aux_layers`, drafting over the target ids `draft_ids` (sorted):
    its embedding is the target's (shared, frozen, not saved), its final norm and lm_head start as the target's own
    rows for the draft vocabulary (the head then first learns to produce a state the target's head reads)."""
    layer = layer_config(target_model)
    config = LlamaConfig(**{k: v for k, v in layer.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "sdpa"
    t = target_model.config.get_text_config(decoder=True)
    draft_ids = torch.as_tensor(draft_ids, dtype=torch.long).sort().values
    head = Eagle3Head(config, draft_vocab_size=int(draft_ids.numel()), target_hidden_size=int(t.hidden_size),
                      aux_layers=list(aux_layers), norm_before_fc=norm_before_fc, verifier=verifier)
    head.embed_tokens = target_model.get_input_embeddings()
    with torch.no_grad():
        head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        head.t2d.zero_().index_fill_(0, draft_ids, True)
        out = target_model.get_output_embeddings().weight
        head.lm_head.weight.copy_(out[draft_ids].to(head.lm_head.weight.dtype))
        final = getattr(getattr(target_model, "model", None), "norm", None)
        if final is not None and getattr(final, "weight", None) is not None \
                and final.weight.shape == head.norm.weight.shape:
            head.norm.weight.copy_(final.weight.to(head.norm.weight.dtype))
    return head


def head_weights(head: Eagle3Head, dtype=None) -> dict[str, torch.Tensor]:
    """The weights a speculators directory holds: everything but the shared embedding, contiguous, on the CPU. A
    head drafting over the whole target vocabulary is saved without d2t/t2d (vLLM has no d2t parameter then and
    refuses one: llama_eagle3.py:339-345), its lm_head rows put in target-id order."""
    state = {}
    whole = head.draft_vocab_size == head.config.vocab_size
    for name, tensor in head.state_dict().items():
        if name == "embed_tokens.weight" or (whole and name in ("d2t", "t2d")):
            continue
        if whole and name == "lm_head.weight":
            tensor = torch.empty_like(tensor).index_copy_(0, head.target_ids().to(tensor.device), tensor)
        tensor = tensor.detach().cpu()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.contiguous()
    return state


def speculators_config(head: Eagle3Head, speculative_tokens: int = 3) -> dict:
    """The head's config.json in the speculators format (SPEC "EAGLE-3 heads"; vLLM's convention for aux ids)."""
    raw = head.config.to_dict()
    layer = {k: v for k, v in raw.items() if k in layer_keys()}
    rope = dict(raw.get("rope_parameters") or {})
    layer["rope_theta"] = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default":
        layer["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    layer.update(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1)
    return {
        "speculators_model_type": SPECULATORS_TYPE, "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer, "draft_vocab_size": head.draft_vocab_size,
        "target_hidden_size": head.fc.in_features // len(head.aux_layers),
        "norm_before_residual": head.layers[0].norm_before_residual,
        "norm_before_fc": head.input_norm is not None,
        "eagle_aux_hidden_state_layer_ids": list(head.aux_layers),
        "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens)}],
            "verifier": {"name_or_path": head.verifier, "architectures": ["LlamaForCausalLM"]}},
    }


def layer_keys() -> set[str]:
    return {"vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "max_position_embeddings", "rms_norm_eps", "hidden_act", "attention_bias", "mlp_bias",
            "rope_theta", "rope_scaling", "tie_word_embeddings"}


def save_head(head: Eagle3Head, out, dtype=torch.float16, speculative_tokens: int = 3, extra: dict | None = None):
    """Write `head` to directory `out` in the speculators format: config.json (+ `extra` keys) and
    model.safetensors (floating weights in `dtype`; d2t/t2d as they are)."""
    from safetensors.torch import save_file

    out = Path(str(out)).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    save_file(head_weights(head, dtype), str(out / "model.safetensors"))
    config = {**speculators_config(head, speculative_tokens), **(extra or {})}
    config["transformer_layer_config"]["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out
