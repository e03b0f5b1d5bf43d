"""vLLM's tab: `vllm serve` with the run's `--speculative-config` JSON and each request's sampling fields; a k
schedule as `num_speculative_tokens_per_batch_size`: the lab's grid, or the server's answer per concurrency (a
prediction from a server cost profile, storage/serving/profiles.py) as vLLM's entries (`server_ranges`) and in words
(`schedule_text`, which the experiment page shows too).

Checked: vllm-project/vllm main, vllm/config/speculative.py @ 002e77c1 (SpeculativeConfig: `method` incl.
"draft_model" and "ngram", `model`, `num_speculative_tokens` (> 0), `prompt_lookup_max` / `prompt_lookup_min`
(when only max is given, min is set EQUAL to max in __post_init__, although docs/.../configuration.md says it
defaults to 1 — so min is always passed here), `draft_sample_method` "greedy" (default: argmax drafts, treated as
one-hot) | "probabilistic", `num_speculative_tokens_per_batch_size` (dynamic k keyed on batch size));
docs/features/speculative_decoding/draft_model.md (`vllm serve T --speculative-config '{"model": D,
"num_speculative_tokens": 5, "method": "draft_model"}'`), n_gram.md, dynamic_speculative_decoding.md;
vllm/sampling_params.py @ 00388f65 (temperature 0 = greedy, top_k "0 (or -1)" = all tokens, min_p,
repetition_penalty, seed).
"""

from __future__ import annotations

import json

from storage.serving.engines.common import (
    _command,
    _draft_for,
    _drafting,
    _length_note,
    _model_ref,
    _not_expressible,
    _openai_request,
    _same_distribution_note,
    _with_prepare,
)
from storage.serving.tree_settings import no_tree_note
from storage.serving.verify_settings import vllm_verify
from storage.serving.vocab_settings import vllm_vocab


def _vllm(cfg: dict) -> dict:
    drafter, serving, param = _drafting(cfg, "vllm")
    if serving.how is None:
        return _not_expressible(cfg, serving)
    notes: list[str] = []
    spec = {"method": serving.how}
    prepare = None
    if drafter.needs_model:
        spec["model"], prepare, notes = _draft_for(cfg, serving)
    spec["num_speculative_tokens"] = cfg["k"]
    spec.update(serving.settings(param, cfg["k"]))
    notes += serving.texts(param, cfg["k"])
    verify_spec, verify_notes = vllm_verify(cfg)  # a block run's rejection_sample_method
    spec.update(verify_spec)
    notes += verify_notes
    if drafter.needs_model:
        if not cfg["greedy"] and cfg["draft_sampling"] == "greedy":
            spec["draft_sample_method"] = "greedy"
            notes.append(
                'draft_sample_method "greedy": the drafts are the draft\'s argmax, verified as one-hot, '
                "as DraftLab measured (--draft-sampling greedy); it is vLLM's default, so an older vLLM "
                "without the key behaves the same — drop the key there."
            )
        elif not cfg["greedy"]:
            spec["draft_sample_method"] = "probabilistic"
            notes.append(
                'draft_sample_method "probabilistic" samples the drafts and verifies with their '
                "probabilities, as DraftLab measured; it is recent (vllm/config/speculative.py on main): an "
                "older vLLM rejects the key — drop it there, its drafts are then the draft's argmax "
                "(verified as one-hot), still lossless but with a different acceptance rate than measured: "
                "measure that with --draft-sampling greedy."
            )
    notes += vllm_vocab(cfg, spec)
    notes += _vllm_server_schedule(cfg, spec) if cfg.get("_server") else _vllm_schedule(cfg, spec)
    notes += no_tree_note(cfg, "vllm")
    config_json = json.dumps(spec)
    groups = [["vllm", "serve", _model_ref(cfg["target"])], ["--speculative-config", config_json]]
    if cfg["dtype"] != "auto":
        groups.append(["--dtype", cfg["dtype"]])
    if cfg["trust_remote_code"]:
        groups.append(["--trust-remote-code"])
    command, snippet = _command(groups)
    request = _openai_request(cfg, top_k_off=-1)
    if not cfg["greedy"]:
        request["seed"] = cfg["seed"]
    notes.append(
        "Send the sampling settings with every request (the `request` fields of /v1/completions): by "
        "default vLLM takes missing ones from the model's generation_config.json."
    )
    notes += _length_note(cfg, "Send max_tokens with each request (/v1/completions otherwise stops at 16)")
    notes += _same_distribution_note(cfg)
    return _with_prepare(
        {
            "language": "bash",
            "command": command,
            "snippet": snippet,
            "speculative_config": config_json,
            "request": request,
            "notes": notes,
        },
        prepare,
    )


def _vllm_schedule(cfg: dict, spec: dict) -> list[str]:
    """A grid's k schedule as vLLM's `num_speculative_tokens_per_batch_size` (checked: vllm-project/vllm
    vllm/v1/spec_decode/dynamic/utils.py @ 14b450ca: entries [bs_lo, bs_hi, k], sorted, non-overlapping, the first
    from 1, k >= 0; a gap takes the k of the range before it, batch sizes past the last range take its k, and
    every k is capped at num_speculative_tokens, which must be > 0): num_speculative_tokens becomes the schedule's
    largest k. No schedule (not a grid, or one k everywhere): nothing changes."""
    grid = cfg.get("_schedule")
    if not grid or not grid["ranges"]:
        return []
    ranges = grid["ranges"]
    if len(ranges) == 1:
        return [
            f"The k schedule measured one k at every batch size ({grid['sizes_text']}): "
            f"num_speculative_tokens={ranges[0][2]} alone expresses it."
        ]
    spec["num_speculative_tokens"] = max(k for _, _, k in ranges)
    spec["num_speculative_tokens_per_batch_size"] = ranges
    notes = [
        f"num_speculative_tokens_per_batch_size carries the k schedule measured at batch sizes "
        f"{grid['sizes_text']} ([start_bs, end_bs, k]; k = 0 turns speculation off in that range); "
        f"num_speculative_tokens={spec['num_speculative_tokens']} is its largest k (vLLM caps every entry at it). "
        f"Batch sizes between two measured ones take the k of the smaller one; above {grid['largest']} vLLM "
        f"keeps the last entry's k, which was not measured there."
    ]
    if grid["smallest"] > 1:
        notes.append(
            f"The first range starts at batch size 1 as vLLM requires; batch sizes below "
            f"{grid['smallest']} were not measured."
        )
    notes.append(
        "num_speculative_tokens_per_batch_size is recent (vLLM's dynamic speculative decoding): an older "
        "vLLM rejects the key: drop it there and serve the k of your usual batch size."
    )
    notes.append(
        "vLLM's batch size is the number of requests in a decode step, which changes as requests arrive "
        "and finish; DraftLab's is B prompts decoded together from their start: check the schedule "
        "against vLLM's spec-decode metrics at your traffic."
    )
    return notes


def server_ranges(schedule: dict[int, int]) -> list[list[int]]:
    """{concurrency: k} as vLLM's `num_speculative_tokens_per_batch_size` entries [start_bs, end_bs, k]: the first
    from 1, each concurrency's k until the next one's, equal neighbours joined (storage/analysis/schedule.py's rule)."""
    known = sorted(schedule.items())
    out: list[list[int]] = []
    for i, (c, k) in enumerate(known):
        start = 1 if i == 0 else c
        end = known[i + 1][0] - 1 if i + 1 < len(known) else c
        if out and out[-1][2] == k:
            out[-1][1] = end
        else:
            out.append([start, end, k])
    return out


def schedule_text(predicted: dict) -> str:
    """A prediction's k to serve per concurrency in words, each with its predicted speedup and interval:
    "concurrency 1: k=2 (1.31×, 1.20–1.44); concurrency 4: off"."""

    def cell(c: int, k: int) -> str:
        if k == 0:
            return f"concurrency {c}: off"
        p = predicted["concurrency"][str(c)][str(k)]
        return f"concurrency {c}: k={k} ({p['speedup']:.2f}×, {p['speedup_ci'][0]:.2f}–{p['speedup_ci'][1]:.2f})"

    return "; ".join(cell(int(c), int(k)) for c, k in sorted(predicted["schedule"].items(), key=lambda x: int(x[0])))


def _vllm_server_schedule(cfg: dict, spec: dict) -> list[str]:
    """The k to serve at each concurrency, predicted for the server from the run's acceptance and a server cost
    profile (storage/serving/profiles.py): vLLM's num_speculative_tokens (the largest k) and, where the k changes
    with concurrency, num_speculative_tokens_per_batch_size. Where no concurrency's prediction gains, the run's own
    k stays, with the prediction's word against it."""
    predicted = cfg["_server"]["predicted"]
    schedule = {int(c): int(k) for c, k in predicted["schedule"].items()}
    said = schedule_text(predicted)
    source = f"{predicted['profile']['label']}, from run {predicted['run_id']}'s acceptance and the server's step costs"
    if all(k == 0 for k in schedule.values()):
        return [
            f"The server's answer ({source}): no k's predicted speedup has its interval above 1 at any concurrency "
            f"profiled ({said}). These settings keep the lab's k={cfg['k']}; serve the target alone, or confirm "
            f"(`draftlab confirm`) before serving it."
        ]
    ranges = server_ranges(schedule)
    spec["num_speculative_tokens"] = max(k for _, _, k in ranges)
    if len(ranges) > 1:
        spec["num_speculative_tokens_per_batch_size"] = ranges
    return [
        f"k per concurrency is the server's answer, {source}: {said}. "
        + (
            f"num_speculative_tokens_per_batch_size carries it ([start_bs, end_bs, k]; k = 0 turns speculation off "
            f"there), num_speculative_tokens={spec['num_speculative_tokens']} is its largest k."
            if len(ranges) > 1
            else f"One k at every concurrency profiled: num_speculative_tokens={spec['num_speculative_tokens']}."
        )
    ]
