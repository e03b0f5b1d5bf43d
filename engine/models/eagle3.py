"""EAGLE-3 heads (Li et al. 2025, arXiv 2503.01840): loading one (vLLM's speculators layout, which vLLM serves as
`{"method": "eagle3", "model": DIR}`, or SGLang's / SpecForge's: engine/config/head_format.py), its forward as plain
torch over transformers' Llama parts, saving one in either layout and converting between them.

A head is one decoder layer that reads the TARGET's own hidden states. It follows vLLM faithfully
(vllm/model_executor/models/llama_eagle3.py: LlamaDecoderLayer with layer_idx 0, LlamaModel, Eagle3LlamaForCausalLM):
  - `fc` [hidden, 3 x target_hidden] (no bias) combines the target's hidden states of the layers
    `eagle_aux_hidden_state_layer_ids` (vLLM's convention: id i = the input of decoder layer i = transformers'
    `hidden_states[i]`), concatenated in ascending id order (`combine`, vLLM's combine_hidden_states);
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
`layers.0.mlp.{gate,up,down}_proj.weight`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`. SGLang's layout names the
layer `midlayer.` (read as `layers.0.`, as vLLM does), its config's aux ids are one lower (SGLang's convention: the
output of layer j), and SGLang always drafts with the target's embedding: `load_head` computes what the layout's
engine computes. A head names its target (speculators: `speculators_config.verifier.name_or_path`; SGLang: none,
unless DraftLab wrote it); one whose target is not the run's is refused in one line.

`convert_head(src, out, to="sglang"|"speculators")` (`draftlab convert-head`) and `save_sglang` write SGLang's layout,
ids one lower, refusing a head SGLang would compute differently (norm_before_residual, norm_before_fc).

The head's forward has the signature engine/decoding/batched_cache.py calls (input_ids, attention_mask, position_ids,
cache, logits_to_keep) plus `hidden_states` [B, W, hidden] (the combined target states, or the head's own pre-norm
output), so one BatchCache keeps its KV cache for B rows with holes, rollback and compaction like any draft model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from engine.config import head_format
from engine.config.head_format import SGLANG, SPECULATORS, HeadSpec, check_verifier  # noqa: F401 - check_verifier: public here
from engine.errors import DraftLabError
from engine.models import weight_files


def head_config(path) -> dict | None:
    """The config.json of an EAGLE-3 head directory (speculators or SGLang layout), or None when `path` is not one."""
    config = head_format.read_config(path)
    return config if head_format.config_layout(config) else None


def is_head(path) -> bool:
    """Whether `path` is an EAGLE-3 head directory (speculators or SGLang layout), not a causal LM."""
    return head_format.is_head(path)


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
        for name, heads in (
            ("q_proj", config.num_attention_heads),
            ("k_proj", config.num_key_value_heads),
            ("v_proj", config.num_key_value_heads),
        ):
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
        attended, _ = self.self_attn(
            torch.cat([embeds, state], -1),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
        )
        residual = attended + residual
        return self.mlp(self.post_attention_layernorm(residual)) + residual


class Eagle3Head(nn.Module):
    """An EAGLE-3 head (see the module docstring); `aux_layers` are the target's hidden_states it reads."""

    def __init__(
        self,
        config: LlamaConfig,
        *,
        draft_vocab_size: int,
        target_hidden_size: int,
        aux_layers: list[int],
        norm_before_residual: bool = False,
        norm_before_fc: bool = False,
        verifier: str | None = None,
    ):
        super().__init__()
        hidden = config.hidden_size
        self.config = config
        self.aux_layers = sorted(aux_layers)  # vLLM concatenates the aux states in ascending id order
        self.verifier = verifier
        self.draft_vocab_size = draft_vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.input_norm = (
            LlamaRMSNorm(len(aux_layers) * target_hidden_size, eps=config.rms_norm_eps) if norm_before_fc else None
        )
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
            .index_fill(0, self.target_ids(), True)
            .all()
        )

    def combine(self, states: torch.Tensor) -> torch.Tensor:
        """The head's input state from the target's aux hidden states concatenated [..., 3 x target_hidden]."""
        if self.input_norm is not None:
            states = self.input_norm(states)
        return self.fc(states)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        attention_mask=None,
        position_ids=None,
        cache=None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        output_hidden_states=None,
        **kwargs,
    ) -> Eagle3Output:
        """Logits over the target vocabulary for tokens input_ids [B, W] with their states hidden_states
        [B, W, hidden]; the KV cache `cache` grows by W columns."""
        embeds = self.embed_tokens(input_ids)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(input_ids.shape[1], device=input_ids.device) + past)[None]
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
        )
        rotary = self.rotary_emb(embeds, position_ids=position_ids)
        prenorm = self.layers[0](embeds, hidden_states, mask, rotary, cache)
        kept = prenorm[:, -logits_to_keep:] if logits_to_keep else prenorm
        draft_logits = self.lm_head(self.norm(kept))
        logits = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        logits[..., self.target_ids()] = draft_logits
        return Eagle3Output(logits, (hidden_states, prenorm))


def _refuse(path, why: str, fix: str) -> DraftLabError:
    return DraftLabError(f"EAGLE-3 head {str(path)!r} {why}; {fix}")


HEAD_FIX = "copy the head again, or train or convert it again (draftlab train-head / convert-head)"


def check_weights(path) -> None:
    """Refuse, in one line, a head directory whose safetensors files do not read (truncated, garbage), before
    anything else is loaded (engine/models/weight_files.py, the check a causal LM's files get)."""
    path = head_format.local_dir(path)
    weight_files.check_readable(path, f"EAGLE-3 head {str(path)!r}", HEAD_FIX)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    """The head's tensors (engine/models/weight_files.py: a file that does not read is named in one line)."""
    state = weight_files.read_weights(path, f"EAGLE-3 head {str(path)!r}", HEAD_FIX)
    if not state:
        raise _refuse(path, "has no weights (no *.safetensors or *.bin file)", "point --draft at a saved head")
    return state


def lab_weight_name(name: str) -> str:
    """A head weight's name as Eagle3Head has it: SGLang's `midlayer.` (and an HF `model.` prefix) read as
    `layers.0.`, as vLLM reads them."""
    name = name.removeprefix("model.")
    return (
        head_format.LAYER_PREFIX[SPECULATORS] + name.removeprefix(head_format.LAYER_PREFIX[SGLANG])
        if name.startswith(head_format.LAYER_PREFIX[SGLANG])
        else name
    )


def _layer_config(spec: HeadSpec) -> LlamaConfig:
    config = LlamaConfig(**{**{k: v for k, v in spec.layer.items() if k != "torch_dtype"}, "num_hidden_layers": 1})
    config._attn_implementation = "sdpa"
    return config


def load_head(path, target_model, target_names: list[str], device, dtype, overrides: dict | None = None) -> Eagle3Head:
    """The EAGLE-3 head in directory `path` (speculators or SGLang layout, engine/config/head_format.py) for
    `target_model` (a transformers causal LM), on `device` in `dtype`, computing what the engine of its layout
    computes: a speculators head shares the target's embedding when it has none (vLLM), an SGLang one always uses
    the target's (SGLang's set_embed) unless it is narrower. Its aux ids are read in DraftLab's convention (an
    SGLang file's + 1). A DraftLabError says in one line why a head cannot draft for the target. `overrides`:
    HeadSpec fields read as given instead of the config's (engine/models/head_check.py tries other aux ids and
    norms)."""
    path = head_format.local_dir(path)
    spec = replace(head_format.head_spec(path), **(overrides or {}))
    target = target_model.config.get_text_config(decoder=True)
    width = target.hidden_size
    vocab = target_model.get_output_embeddings().weight.shape[0]
    aux = head_format.check_for_target(spec, path, target_names, target.num_hidden_layers, width, vocab)
    config = _layer_config(spec)
    head = Eagle3Head(
        config,
        draft_vocab_size=int(spec.draft_vocab_size or config.vocab_size),
        target_hidden_size=width,
        aux_layers=list(aux),
        norm_before_residual=spec.norm_before_residual,
        norm_before_fc=spec.norm_before_fc,
        verifier=spec.verifier,
    )
    state = {lab_weight_name(name): tensor for name, tensor in _weights(path).items()}
    if spec.layout == SGLANG and config.hidden_size == width:
        state.pop("embed_tokens.weight", None)  # SGLang serves it with the target's embedding, whatever it holds
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
        raise _refuse(
            path,
            f"does not have the EAGLE-3 weights of its {spec.layout} layout ({what})",
            "save it as vLLM's speculators or SGLang's layout names them (engine/models/eagle3.py)",
        )
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
    layer = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(t.vocab_size),
        "hidden_size": int(t.hidden_size),
        "intermediate_size": int(t.intermediate_size),
        "num_hidden_layers": 1,
        "num_attention_heads": int(t.num_attention_heads),
        "num_key_value_heads": int(getattr(t, "num_key_value_heads", None) or t.num_attention_heads),
        "head_dim": int(getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads),
        "max_position_embeddings": int(t.max_position_embeddings),
        "rms_norm_eps": float(getattr(t, "rms_norm_eps", None) or getattr(t, "layer_norm_eps", None) or 1e-6),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "rope_theta": float(theta),
    }
    if rope.get("rope_type", "default") != "default":
        layer["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return layer


def new_head(
    target_model, aux_layers: list[int], draft_ids: torch.Tensor, verifier: str, norm_before_fc: bool = False
) -> Eagle3Head:
    """A fresh head for `target_model` reading `aux_layers`, drafting over the target ids `draft_ids` (sorted):
    its embedding is the target's (shared, frozen, not saved), its final norm and lm_head start as the target's own
    rows for the draft vocabulary (the head then first learns to produce a state the target's head reads)."""
    layer = layer_config(target_model)
    config = LlamaConfig(**{k: v for k, v in layer.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "sdpa"
    t = target_model.config.get_text_config(decoder=True)
    draft_ids = torch.as_tensor(draft_ids, dtype=torch.long).sort().values
    head = Eagle3Head(
        config,
        draft_vocab_size=int(draft_ids.numel()),
        target_hidden_size=int(t.hidden_size),
        aux_layers=list(aux_layers),
        norm_before_fc=norm_before_fc,
        verifier=verifier,
    )
    head.embed_tokens = target_model.get_input_embeddings()
    with torch.no_grad():
        head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        head.t2d.zero_().index_fill_(0, draft_ids, True)
        out = target_model.get_output_embeddings().weight
        head.lm_head.weight.copy_(out[draft_ids].to(head.lm_head.weight.dtype))
        final = getattr(getattr(target_model, "model", None), "norm", None)
        if (
            final is not None
            and getattr(final, "weight", None) is not None
            and final.weight.shape == head.norm.weight.shape
        ):
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


def head_spec_of(head: Eagle3Head, dtype=None) -> HeadSpec:
    """What a head's config.json says of it (engine/config/head_format.py), in either layout; `dtype`: its
    torch_dtype."""
    raw = head.config.to_dict()
    layer = {k: v for k, v in raw.items() if k in layer_keys()}
    rope = dict(raw.get("rope_parameters") or {})
    layer["rope_theta"] = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default":
        layer["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if dtype is not None:
        layer["torch_dtype"] = str(dtype).removeprefix("torch.")
    return HeadSpec(
        SPECULATORS,
        layer,
        head.draft_vocab_size,
        head.fc.in_features // len(head.aux_layers),
        tuple(head.aux_layers),
        head.layers[0].norm_before_residual,
        head.input_norm is not None,
        head.verifier,
    )


def speculators_config(head: Eagle3Head, speculative_tokens: int = 3) -> dict:
    """The head's config.json in the speculators format (SPEC "EAGLE-3 heads"; vLLM's convention for aux ids)."""
    return head_format.speculators_config(head_spec_of(head), speculative_tokens)


def layer_keys() -> set[str]:
    return {
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rms_norm_eps",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
        "rope_theta",
        "rope_scaling",
        "tie_word_embeddings",
    }


def layout_weights(state: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Head weights (Eagle3Head's names or either layout's) named as `layout` names them: `layers.0.*`
    (speculators) or `midlayer.*` (SGLang), the others alike."""
    prefix = head_format.LAYER_PREFIX
    out = {}
    for name, tensor in state.items():
        name = lab_weight_name(name)
        if layout == SGLANG and name.startswith(prefix[SPECULATORS]):
            name = prefix[SGLANG] + name.removeprefix(prefix[SPECULATORS])
        out[name] = tensor.contiguous()
    return out


def _write(out: Path, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("*.safetensors"), *out.glob("*.bin")]:  # a head is read from every weight file here
        stale.unlink()
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out


def save_head(head: Eagle3Head, out, dtype=torch.float16, speculative_tokens: int = 3, extra: dict | None = None):
    """Write `head` to directory `out` in the speculators format: config.json (+ `extra` keys) and
    model.safetensors (floating weights in `dtype`; d2t/t2d as they are)."""
    config = {**head_format.speculators_config(head_spec_of(head, dtype), speculative_tokens), **(extra or {})}
    return _write(Path(str(out)).expanduser(), config, head_weights(head, dtype))


def save_sglang(head: Eagle3Head, out, dtype=torch.float16) -> Path:
    """Write `head` to directory `out` in SGLang's layout (engine/config/head_format.py): its config.json with the aux
    ids one lower, `midlayer.*` weights in `dtype`. A DraftLabError when SGLang cannot compute this head."""
    config = head_format.sglang_config(head_spec_of(head, dtype))
    return _write(Path(str(out)).expanduser(), config, layout_weights(head_weights(head, dtype), SGLANG))


def convert_head(src, out, to: str, overwrite: bool = False, verifier: str | None = None) -> list[str]:
    """Write the head in directory `src` (either layout) to directory `out` in layout `to` (SGLANG or SPECULATORS):
    its config with the aux ids in that layout's convention (SGLang's one lower), its weights renamed, tensors as
    they are. `verifier` names its target where the source names none (an SGLang head). Returns notes on what the
    other engine does differently; a DraftLabError says in one line why it cannot convert."""
    src_dir, out_dir = Path(str(src)).expanduser(), Path(str(out)).expanduser()
    if to not in head_format.LAYOUTS:
        raise DraftLabError(f"unknown head layout {to!r}; use --to {' or --to '.join(head_format.LAYOUTS)}")
    spec = head_format.with_verifier(head_format.head_spec(src_dir), verifier)
    if spec.layout == to:
        raise _refuse(src_dir, f"is already in the {to} layout", "use it as it is, or convert it to the other one")
    if out_dir.exists() and out_dir.resolve() == src_dir.resolve():
        raise DraftLabError(
            f"--out {str(out)!r} is the head itself; give another directory (e.g. "
            f"{head_format.sglang_dir(src) if to == SGLANG else src_dir / to})"
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise DraftLabError(f"--out {str(out)!r} is a file; give a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise DraftLabError(f"--out {str(out)!r} is not empty; pass --overwrite to replace its head, or another --out")
    if to == SPECULATORS and not spec.verifier:
        raise _refuse(
            src_dir,
            "names no target (SGLang's layout has none)",
            "pass --verifier MODEL, the target it was trained for (vLLM and DraftLab check it)",
        )
    config = head_format.layout_config(spec, to)  # SGLang: refuses a head it cannot compute
    state = {lab_weight_name(name): tensor for name, tensor in _weights(src_dir).items()}
    notes = []
    own_embedding = "embed_tokens.weight" in state and spec.layer.get("hidden_size") == (
        spec.target_hidden_size or spec.layer.get("hidden_size")
    )
    if own_embedding and to == SPECULATORS:
        del state["embed_tokens.weight"]  # SGLang served it with the target's: so will vLLM without one
        notes.append(
            "embed_tokens dropped: SGLang served this head with the target's embedding, as vLLM and "
            "DraftLab do when the speculators directory has none."
        )
    elif own_embedding:
        notes.append(
            "Check: this head has an embedding of its own (embed_tokens); SGLang replaces it with the "
            "target's, vLLM and DraftLab use it: the two engines compute the same head only if it is the "
            "target's."
        )
    if spec.aux_layers is not None:
        ids = list(spec.aux_layers)
        notes.append(
            f"aux layer ids: {ids} in vLLM's and DraftLab's convention (the input of layer i) = "
            f"{[i - 1 for i in ids]} in SGLang's (the output of layer j), written "
            + ("to eagle_config." if to == SGLANG else "at the top level.")
        )
    else:
        notes.append(
            "aux layer ids: none named; vLLM and SGLang both read the target's layers [2, L/2, L-3] "
            "(vLLM's convention)."
        )
    _write(out_dir, config, layout_weights(state, to))
    return notes
