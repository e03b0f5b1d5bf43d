"""transformers' tab: a Python snippet that loads the target (and the draft), sets the drafting on the assistant's
generation_config, where assisted generation reads it, and calls generate() with the run's sampling.

Checked: transformers 5.24.0 (the version DraftLab's engine tests run), generation/configuration_utils.py
(num_assistant_tokens, num_assistant_tokens_schedule "heuristic" | "heuristic_transient" | "constant",
assistant_confidence_threshold, prompt_lookup_num_tokens, max_matching_ngram_size; global defaults 20,
"constant", 0.4, top_k 50), generation/candidate_generator.py (AssistedCandidateGenerator reads
num_assistant_tokens, the schedule and the threshold from the ASSISTANT's generation_config — passing them to
target.generate() does nothing, verified on the demo pair — and re-fits the threshold by ROC when scikit-learn is
installed; PromptLookupCandidateGenerator takes prompt_lookup_num_tokens / max_matching_ngram_size from the
call), generation/stopping_criteria.py (ConfidenceCriteria: stop after a drafted token whose probability < T,
the token kept), generation/utils.py (the criterion only when the threshold > 0); transformers 5.25
EarlyExitCandidateGenerator: generate(assistant_early_exit=L) makes the target its own assistant, so the schedule
and threshold are read from the TARGET's generation_config (checked on a tiny Llama: k per round as set there).
"""

from __future__ import annotations

from storage.serving.engines.common import (
    _drafting,
    _length_note,
    _model_ref,
    _not_expressible,
    _same_distribution_note,
)
from storage.serving.tree_settings import no_tree_note
from storage.serving.verify_settings import no_block_note
from storage.serving.vocab_settings import transformers_vocab

OBJECTS = ("assistant_model", "tokenizer", "assistant_tokenizer")  # generate() arguments the snippet names, not values


def _greedy_drafts_note(cfg: dict) -> list[str]:
    """What transformers cannot do with a run that drafted the argmax under sampling (--draft-sampling greedy)."""
    if cfg["greedy"] or cfg["draft_sampling"] != "greedy":
        return []
    return [
        "Not expressible: transformers' assisted generation samples the assistant's drafts from "
        "its distribution when do_sample=True; DraftLab measured argmax drafts "
        "(--draft-sampling greedy), so expect the acceptance of a probabilistic run instead."
    ]


def _transformers(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "transformers")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    notes: list[str] = []
    load = {"dtype": "auto" if cfg["dtype"] == "auto" else cfg["dtype"]}
    if cfg["trust_remote_code"]:
        load["trust_remote_code"] = True
    load_args = ", ".join(f"{key}={value!r}" for key, value in load.items())
    target = _model_ref(cfg["target"])
    lines = [
        "import torch",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({target!r})",
        f"target = AutoModelForCausalLM.from_pretrained({target!r}, {load_args})",
    ]
    kwargs: dict = {}
    assistant: dict = {}
    if not drafter.needs_model:  # a model-free drafter: its settings are generate() arguments
        kwargs.update(serving.settings(param, cfg["k"]))
        notes += serving.texts(param, cfg["k"])
    elif serving.call is not None:  # the target drafts for itself (assistant_early_exit): no assistant model
        notes += _greedy_drafts_note(cfg)
        assistant = serving.settings(param, cfg["k"])
        lines.append("# the target is its own assistant: assisted generation reads these from its generation_config")
        lines += [f"target.generation_config.{key} = {value!r}" for key, value in assistant.items()]
        kwargs.update(serving.call(param, cfg["k"]))
        notes += serving.texts(param, cfg["k"])
        if _model_ref(cfg["draft"]) != target:
            notes.append(
                f"Not expressible: transformers drafts with the target's own layers; this run drafted with another "
                f"model's ({cfg['draft']}), so the served drafts differ from those measured: measure the drafter "
                f"with --draft {cfg['target']} to serve it here."
            )
    else:
        notes += _greedy_drafts_note(cfg)
        assistant = serving.settings(param, cfg["k"])
        draft = _model_ref(cfg["draft"])
        lines.append(f"draft = AutoModelForCausalLM.from_pretrained({draft!r}, {load_args})")
        lines.append("# assisted generation reads these from the draft's generation_config, not from generate()")
        lines += [f"draft.generation_config.{key} = {value!r}" for key, value in assistant.items()]
        kwargs["assistant_model"] = "draft"
        notes += transformers_vocab(cfg, lines, kwargs)
        notes.append(
            "num_assistant_tokens, num_assistant_tokens_schedule and assistant_confidence_threshold are "
            "set on draft.generation_config: transformers' AssistedCandidateGenerator reads them there "
            "(given to generate() they are ignored, leaving the defaults k=20 and threshold 0.4)."
        )
        notes += serving.texts(param, cfg["k"])
    if cfg["greedy"]:
        kwargs["do_sample"] = False
    else:
        kwargs.update(do_sample=True, temperature=cfg["temperature"], top_k=max(cfg["top_k"], 0), top_p=cfg["top_p"])
        notes.append(
            "top_k=0 disables top-k (transformers' default is 50); the model's generation_config.json "
            "still supplies any other sampling setting it names."
        )
    if cfg["max_new_tokens"] is not None:
        kwargs["max_new_tokens"] = cfg["max_new_tokens"]
    notes += _length_note(
        cfg,
        "Pass max_new_tokens to generate() (without it the model's generation_config "
        "decides, 20 tokens in total by default)",
    )
    rendered = ", ".join(f"{key}={value}" if key in OBJECTS else f"{key}={value!r}" for key, value in kwargs.items())
    lines += [
        "",
        f"torch.manual_seed({cfg['seed']})",
        'inputs = tokenizer("def fibonacci(n):", return_tensors="pt").to(target.device)',
        f"output = target.generate(**inputs, {rendered})",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
    ]
    notes += _same_distribution_note(cfg)
    if cfg.get("_schedule"):
        notes.append(
            f"transformers' assisted generation decodes one request at a time: these settings take the "
            f"schedule's batch {cfg['_schedule']['for_batch']} entry (k={cfg['k']})."
        )
    notes += no_tree_note(cfg, "transformers")
    notes += no_block_note(cfg, "transformers")
    generate_kwargs = {key: value for key, value in kwargs.items() if key not in OBJECTS}
    return {
        "language": "python",
        "snippet": "\n".join(lines) + "\n",
        "generate_kwargs": generate_kwargs,
        "assistant_generation_config": assistant,
        "notes": notes,
    }
