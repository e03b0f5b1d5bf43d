"""The worker's model cache: the one target/draft pair it holds, reused across experiments that need the same
models (and for a draft sweep, the other drafts on the same target; for a draft_dtype sweep, the draft in each
precision), released before another is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from app.runtime.placement import load_device, place
from engine.config.head_format import is_head
from engine.config.variables import DEFAULT_DRAFT_DTYPE
from engine.errors import DraftLabError
from engine.models.loading import ModelPair, resolve_dtype, with_draft
from engine.text.token_types import TokenTyper


class SetupError(Exception):
    """A failure every run of the experiment would hit (models, prompts): fail them all, not one by one."""


@dataclass
class LoadedPair:
    key: tuple  # (target, draft, load device, dtype, trust_remote_code, experiment id)
    pair: ModelPair
    typer: TokenTyper
    encoded: dict = field(default_factory=dict)  # (experiment_id, max_new_tokens) -> prompt ids
    # draft name (None: no draft model) -> a pair on the same target; (draft name, dtype) for a draft loaded in a
    # precision of its own (a run's draft_dtype other than the target's)
    others: dict = field(default_factory=dict)


class ModelCache:
    def __init__(self, loader: Callable[..., ModelPair], log: Callable[[str], None], device: str | None):
        self.loader = loader
        self.log = log
        self.device = device  # the worker's pinned device (see app/placement.place), or None
        self.loaded: LoadedPair | None = None

    def pair(self, experiment: dict, draft: str | None = None, gpus: int | DraftLabError | None = None) -> LoadedPair:
        """The experiment's target with `draft` (default: the experiment's), loaded unless held already. `gpus`:
        the GPU count the job's leases were taken for (its placement plan), or the DraftLabError saying no set of
        GPUs holds the pair (a SetupError here)."""
        draft = draft if draft is not None else (experiment["draft"] or None)  # "" (no draft given): none
        device = load_device(place(experiment["device"], self.device))
        key = (experiment["target"], draft, device, experiment["dtype"], bool(experiment["trust_remote_code"]))
        if self.loaded is not None and self.loaded.key[:-1] == key:
            self.loaded.key = key + (experiment["id"],)
            return self.loaded
        if isinstance(gpus, DraftLabError):  # the placement plan found no set of GPUs that holds the pair
            raise SetupError(str(gpus))
        self.release()
        self.log(
            f"loading {experiment['target']}"
            + (f" + {draft}" if draft else "")
            + (f" over {gpus} GPUs" if isinstance(gpus, int) and gpus > 1 else "")
        )
        # The GPU count the leases were taken for (a plan made on this worker's several GPUs), so the load matches.
        spread = {"gpus": gpus} if isinstance(gpus, int) and device == "auto" else {}
        try:
            pair = self.loader(
                experiment["target"],
                draft,
                device,
                experiment["dtype"],
                bool(experiment["trust_remote_code"]),
                **spread,
            )
        except DraftLabError as exc:
            raise SetupError(str(exc)) from exc
        except torch.cuda.OutOfMemoryError as exc:
            raise SetupError(
                f"CUDA out of memory loading {experiment['target']} + {draft}; use dtype "
                f"bfloat16/float16, smaller models, or more GPUs (`draftlab worker --devices "
                f"cuda:0+cuda:1`, or plain `draftlab worker`, which sees them all)"
            ) from exc
        self.loaded = LoadedPair(key + (experiment["id"],), pair, TokenTyper(pair.tokenizer))
        return self.loaded

    def pair_for(
        self, loaded: LoadedPair, draft: str | None, experiment: dict, draft_dtype: str = DEFAULT_DRAFT_DTYPE
    ) -> ModelPair:
        """The loaded target with `draft` (another candidate of a draft sweep, or None for drafters that need
        no model) in `draft_dtype` (a run's; "same": the target's dtype), loaded once and pair-checked. A draft
        dtype other than the target's loads a copy of its own, cached under (draft, dtype): a sweep's runs never
        share a draft of the wrong precision. Without a draft model the dtype changes nothing."""
        same = draft is None or draft_dtype == DEFAULT_DRAFT_DTYPE
        dtype = loaded.pair.dtype if same else resolve_dtype(draft_dtype, loaded.pair.device)
        if dtype == loaded.pair.dtype and draft == loaded.key[1]:
            return loaded.pair
        key = draft if dtype == loaded.pair.dtype else (draft, draft_dtype)
        if key not in loaded.others:
            if key != draft and is_head(str(draft)):  # it reads the target's hidden states, shares its embedding
                raise DraftLabError(
                    f"draft dtype {draft_dtype} cannot load the EAGLE-3 head {draft}: a head runs in the target's "
                    f"dtype; use --draft-dtype same (or the experiment's --dtype for both)"
                )
            self.log(
                (f"loading draft {draft}" + (f" in {draft_dtype}" if key != draft else ""))
                if draft
                else "drafting without a draft model"
            )
            trust = bool(experiment["trust_remote_code"])
            try:  # the draft loaded in its own dtype (with_draft loads in the pair's), the pair keeping the target's
                loaded.others[key] = replace(
                    with_draft(replace(loaded.pair, dtype=dtype), draft, trust), dtype=loaded.pair.dtype
                )
            except torch.cuda.OutOfMemoryError as exc:
                raise DraftLabError(
                    f"CUDA out of memory loading draft {draft}; use dtype bfloat16/float16 or a smaller draft"
                ) from exc
        return loaded.others[key]

    def adopt(self, pair: ModelPair, experiment: dict, others: dict | None = None) -> None:
        """Use already loaded pairs for this experiment's runs (the CLI loads them first to report bad input):
        `pair` with the first draft, `others` {draft name or None: pair} for the rest of a draft sweep."""
        draft = pair.draft.name if pair.draft is not None else None
        key = (
            experiment["target"],
            draft,
            experiment["device"],
            experiment["dtype"],
            bool(experiment["trust_remote_code"]),
        )
        self.loaded = LoadedPair(key + (experiment["id"],), pair, TokenTyper(pair.tokenizer), others=dict(others or {}))

    def release(self) -> None:
        """Drop the held pair (a training job's pair is its own; another experiment's models are about to load)."""
        if self.loaded is not None:
            device = self.loaded.pair.device
            self.loaded = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
