"""Which conventions an EAGLE-3 head was trained with, measured in the lab without a server (`draftlab check-head`):
its greedy first-draft acceptance with its aux-layer ids as configured, each id one higher, each one lower, and
with its `norm_before_fc` flipped. A variant clearly better than the configuration says how the head was trained:

  - ids + 1 better: trained in SGLang's convention (SpecForge): its id i named the OUTPUT of layer i, vLLM's and
    DraftLab's id i is the INPUT of layer i (vllm/model_executor/models/llama.py:428-441 appends the state after i
    layers; SGLang's llama.py `set_eagle3_layers_to_capture` captures `val + 1` for a configured id), so vLLM reads
    such a head one layer too early;
  - ids - 1 better: its ids were raised once too often (a head converted twice);
  - the norm flipped better: config.json's norm_before_fc does not say how it was trained (vLLM applies the
    head's `input_norm` exactly when the flag is set; SGLang never does).

The measure: each prompt is continued greedily by the target (max_new_tokens), the target's hidden states of the
whole text are taken once, and the head predicts, at every position of the continuation, the token after the next
from (the next token, the target's states here): the first draft of a round, whose head entries are all fed with
the target's states, so this is the lab's position-1 greedy acceptance over every position rather than only where
rounds start. One target forward per prompt, one head forward per prompt and variant. Variants whose ids fall
outside the target's layers 0..L-1 are left out (transformers' hidden_states[L] is after the final norm, vLLM's
id L before it: the lab cannot feed that one).

Clearly better: the variant's gain over the configuration is at least MARGIN and its 95 % interval (paired by
prompt, each prompt one draw) lies above 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.errors import DraftLabError
from engine.models import eagle3

MARGIN = 0.05  # the least gain in first-draft acceptance a variant needs to count as clearly better
Z95 = 1.959964


def _continuations(target_model, tokenizer, prompts: list[str], max_new_tokens: int, device) -> list[tuple]:
    """Per prompt: (token ids [n] of prompt + greedy continuation, the target's hidden_states over them, prompt
    length)."""
    out = []
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        if ids.shape[1] == 0:
            raise DraftLabError(f"prompt {i} encodes to no tokens; remove empty prompts from the prompt set")
        with torch.no_grad():
            full = target_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                top_p=None,
                top_k=None,
                temperature=None,
            )
            states = target_model(full, output_hidden_states=True).hidden_states
        if full.shape[1] - ids.shape[1] >= 2:  # a draft needs a token after the next
            out.append((full[0], states, ids.shape[1]))
    if len(out) < 2:
        raise DraftLabError(
            "fewer than 2 prompts continue for 2 tokens or more; give more prompts or a larger --max-new-tokens"
        )
    return out


def first_draft_hits(head: eagle3.Eagle3Head, data: list[tuple]) -> list[tuple[int, int]]:
    """Per prompt (hits, positions): the head's greedy first draft against the target's greedy token, at every
    position of the continuation (entry t = token t + 1 with the target's states at t, predicting token t + 2)."""
    out = []
    with torch.no_grad():
        for ids, states, prompt_length in data:
            combined = torch.cat([states[i] for i in head.aux_layers], -1)[:, :-2]
            logits = head(ids[1:-1][None], hidden_states=head.combine(combined.to(head.fc.weight.dtype))).logits[0]
            start = prompt_length - 1  # the first draft after the prefill predicts token prompt_length + 1
            hits = (logits[start:].argmax(-1) == ids[start + 2 :]).sum().item()
            out.append((int(hits), int(ids.shape[0] - start - 2)))
    return out


def paired_gain(variant: list[tuple[int, int]], base: list[tuple[int, int]]) -> tuple[float, float, float]:
    """(gain, lo, hi): the variant's acceptance minus the base's over the same positions, with a 95 % interval over
    prompts (a ratio estimator's standard error, each prompt one draw)."""
    diffs = [(v - b, n) for (v, n), (b, _) in zip(variant, base) if n > 0]
    total = sum(n for _, n in diffs)
    gain = sum(d for d, _ in diffs) / total
    k = len(diffs)
    se = math.sqrt(k / (k - 1) * sum((d - gain * n) ** 2 for d, n in diffs)) / total if k > 1 else float("inf")
    return gain, gain - Z95 * se, gain + Z95 * se


def variants(aux: list[int], norm_before_fc: bool, num_layers: int) -> list[tuple[str, list[int], bool]]:
    """(name, aux ids, norm_before_fc) of every variant measured, the configuration first."""
    out = [("as configured", aux, norm_before_fc)]
    for step, name in ((1, "ids + 1 (trained in SGLang's convention)"), (-1, "ids - 1")):
        shifted = [i + step for i in aux]
        if all(0 <= i < num_layers for i in shifted):
            out.append((name, shifted, norm_before_fc))
    out.append((f"norm_before_fc {'off' if norm_before_fc else 'on'}", aux, not norm_before_fc))
    return out


def convention_check(
    head_dir,
    target_model,
    tokenizer,
    target_names: list[str],
    prompts: list[str],
    max_new_tokens: int = 32,
    device=None,
    dtype=torch.float32,
) -> dict:
    """Measure the head in `head_dir` under each variant (see the module docstring) on `prompts` (texts) with
    `target_model`; returns {"head", "aux_layers", "norm_before_fc", "prompts", "positions", "variants": [{"name",
    "aux_layers", "norm_before_fc", "acceptance", "gain", "gain_lo", "gain_hi", "clearly_better"}], "verdict",
    "suggested": the config.json keys to change, or None}."""
    device = device or next(target_model.parameters()).device
    configured = eagle3.load_head(head_dir, target_model, target_names, device, dtype)
    num_layers = target_model.config.get_text_config(decoder=True).num_hidden_layers
    data = _continuations(target_model, tokenizer, prompts, max_new_tokens, device)
    norm = configured.input_norm is not None
    rows: list[dict[str, Any]] = []
    base: list[tuple[int, int]] | None = None
    for name, aux, norm_fc in variants(configured.aux_layers, norm, num_layers):
        head = (
            configured
            if base is None
            else eagle3.load_head(
                head_dir,
                target_model,
                target_names,
                device,
                dtype,
                overrides={"aux_layers": tuple(aux), "norm_before_fc": norm_fc},
            )
        )
        hits = first_draft_hits(head, data)
        base = base or hits
        gain, lo, hi = paired_gain(hits, base)
        rows.append(
            {
                "name": name,
                "aux_layers": aux,
                "norm_before_fc": norm_fc,
                "acceptance": sum(h for h, _ in hits) / sum(n for _, n in hits),
                "gain": gain,
                "gain_lo": lo,
                "gain_hi": hi,
                "clearly_better": bool(rows) and gain >= MARGIN and lo > 0,
            }
        )
    verdict, suggested = _verdict(rows)
    assert base is not None, "the configured head is always the first variant"
    return {
        "head": str(head_dir),
        "aux_layers": configured.aux_layers,
        "norm_before_fc": norm,
        "prompts": len(data),
        "positions": sum(n for _, n in base),
        "variants": rows,
        "verdict": verdict,
        "suggested": suggested,
    }


def _verdict(rows: list[dict]) -> tuple[str, dict | None]:
    better = [r for r in rows[1:] if r["clearly_better"]]
    if not better:
        return (
            f"the configuration fits: no variant is clearly better (a gain of {MARGIN:g} or more with its "
            f"interval above 0)",
            None,
        )
    best = max(better, key=lambda r: r["gain"])
    gain = f"first-draft acceptance {best['acceptance']:.3f}, {best['gain']:+.3f} over the configuration"
    if best["aux_layers"] != rows[0]["aux_layers"]:
        raised = best["aux_layers"][0] > rows[0]["aux_layers"][0]
        why = (
            "this head was likely trained with SGLang's convention (ids name a layer's output, one lower than vLLM's)"
            if raised
            else "this head's ids look raised once too often"
        )
        return (
            f"{why}: set eagle_aux_hidden_state_layer_ids to {best['aux_layers']} (vLLM's convention; "
            f"SGLang's eagle_config takes each one lower) ({gain})",
            {"eagle_aux_hidden_state_layer_ids": best["aux_layers"]},
        )
    state = "with" if best["norm_before_fc"] else "without"
    return (
        f"this head was likely trained {state} the norm before fc: set norm_before_fc to "
        f"{str(best['norm_before_fc']).lower()} ({gain})",
        {"norm_before_fc": best["norm_before_fc"]},
    )
