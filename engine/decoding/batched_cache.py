"""A causal LM plus one KV cache shared by B sequences of different lengths (one sequence is the one-row case).

Layout. The cache has B rows and C columns (one DynamicCache, every layer full-history: `rollback_cache`). A
column of a row holds a real token or a HOLE; `mask` [B, C] says which, and is the attention mask of every
forward, so no query ever attends to a hole. Prompts start left-padded (the padding is holes). Each row's
tokens get their real positions, counted per row (`position_ids` = the number of real tokens before it), which
is what rotary models (Llama) and absolute-position ones (GPT-2) both read, so a row computes exactly what it
computes alone: same keys, same positions, the same set of attended keys.

Windows. transformers counts sliding windows and attention chunks in COLUMNS, and padding or a hole inside a window
would shrink what a row sees. So for a model with sliding-window or chunked layers, a cache of several rows hands
every forward masks counted in each row's real tokens (engine/decoding/attention_masks.py: a 4-D mask, or one per layer
type); full-attention models (GPT-2, Llama) keep the 2-D mask above and build nothing per forward, and so does a
cache of one row (no padding, and its holes are all trailing and trimmed before the next forward: columns are
positions). Chosen by measurement over compacting the holes away every round (benchmarks/bench_sliding_batch.py):
the same speed at batch 4 and 8, and exact where compaction alone is not (rows leaving mid-batch and the draft's
ragged first forward still leave holes). A model the cache cannot decode exactly with several rows (ALiBi
counted in columns, a forward without position_ids, ...: `batch_support`) is refused by `reset` in one line.

Rollback (the choice, and its cost). When rows accept different numbers of drafts, `rollback(lengths)` does
not crop: it turns every column past row r's first lengths[r] real tokens into a hole (one masked update on the
device, no host sync). The rejected drafts' columns stay allocated and are attended to as masked keys; the next
round feeds each row only its new tokens (no re-feeding of accepted ones). Then
  - `trim(n)` crops the n trailing columns that are holes in every row (the count is read with the round's one
    host transfer), so a round in which the row with the most drafts kept them all leaves no trailing holes;
  - `select(rows)` drops finished rows (an index_select per layer, and the leading columns no kept row uses are
    sliced off);
  - `compact()` realigns the rows (a stable gather per layer that moves each row's real tokens to the right,
    left-padding the rest) when the width exceeds compact_ratio x the longest row + a slack
    (engine/decoding/speculative.py: 2x + 16). Moving a column is exact: cached keys already carry their rotary position
    and GPT-2 keys none.
What holes cost: memory and attention over masked columns (at most compact_ratio x the longest row between
compactions) plus the compaction copies; benchmarks/bench_batch.py prints the mean hole share and the time
select and compact took. The alternative (crop to the shortest accepted length and re-feed the rest) costs forward
width instead: every round would re-feed up to k tokens per row.

One shape per forward: `forward(ids, valid)` feeds ids [B, W] where valid [B, W] marks real tokens (a row
with fewer new tokens than W pads them as holes).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import Any

import torch

from engine.decoding.attention_masks import PositionMasks, batch_support, layer_windows, model_mask, tree_support
from engine.decoding.aux_states import AuxStates
from engine.decoding.memory import cache_bytes
from engine.decoding.torch_types import Model
from engine.errors import DraftLabError
from engine.models.cached_model import max_positions, rollback_cache


def to_device(
    values: Sequence[int | float | bool] | Sequence[Sequence[int]],
    device: torch.device,
    dtype: torch.dtype = torch.long,
) -> torch.Tensor:
    """A small host list as a device tensor without a host/device sync (pinned, non-blocking on CUDA)."""
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def left_pad(rows: list[torch.Tensor], device: torch.device, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, W], valid [B, W]) for 1-D token tensors of different lengths, right-aligned."""
    widths = [int(t.shape[0]) for t in rows]
    width = max(widths, default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    for r, t in enumerate(rows):
        if widths[r]:
            ids[r, width - widths[r] :] = t
    starts = to_device([width - w for w in widths], device)
    valid = torch.arange(width, device=device)[None, :] >= starts[:, None]
    return ids, valid


class BatchCache:
    def __init__(self, model: Model, vocab_size: int) -> None:
        self.model = model
        self.vocab_size = vocab_size
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._can_keep = "logits_to_keep" in params
        self.device = next(model.parameters()).device
        self.max_positions = max_positions(model.config) or sys.maxsize
        self.peak_cells = 0  # most (row, column) slots held since reset_peak, holes included
        self._cell_bytes: int | None = None
        self.compactions = 0
        windows = layer_windows(model.config)
        # Sliding-window / chunked layers: masks counted in each row's real tokens (engine/decoding/attention_masks.py);
        # full attention keeps transformers' own masks (a 2-D mask, nothing built per forward).
        self._position_masks = PositionMasks(model, windows) if windows is not None else None
        self._support: str | None = None  # batch_support(model), asked the first time a batch has several rows
        self._tree_support: str | None = None  # tree_support(model), asked at the first token tree's forward
        self.reset(0)

    def reset(self, batch: int) -> None:
        """An empty cache for `batch` rows; a model the cache cannot decode exactly with several rows is refused."""
        if batch > 1:
            if self._support is None:
                self._support = batch_support(self.model) or ""
            if self._support:
                raise DraftLabError(self._support)
        self.cache = rollback_cache(self.model)
        self.holes_inside = False  # a one-row cache with holes before its last real token (`forget`)
        self.mask = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=self.device)  # real tokens per row

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    @property
    def batch(self) -> int:
        return int(self.mask.shape[0])

    def forward(
        self,
        ids: torch.Tensor,
        valid: torch.Tensor,
        keep: int | None = None,
        hidden_layers: list[int] | None = None,
        inputs: dict[str, torch.Tensor] | None = None,
        attend: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> Any:
        """Logits [B, W, V] for ids [B, W] (or the last `keep` columns); valid [B, W] marks real tokens.

        hidden_layers: also return, from the same forward, the model's `hidden_states[i]` for those i concatenated
        [B, W, len x hidden] (transformers' convention: hidden_states[i] is the input of decoder layer i), as
        (logits, states): what an EAGLE-3 head reads from the target. inputs: further model inputs beside the ids
        (an EAGLE-3 head's states, engine/models/eagle3.py).

        One row is dense: it has no padding, and its only holes are trailing ones, which the decoders `trim` before
        the next forward, so every column is a real token at its own position. It goes through the model's own
        causal path (no attention mask, positions from the cache's length), as a plain generate() step does, unless
        `forget` left holes inside it (a token tree's round): then it takes the masked path until `compact`.

        attend [B, W, C + W] and positions [B, W]: a token tree's forward (engine/decoding/token_trees.py) says which
        columns each new token attends to and at which position it sits, at any batch size (`tree_support`)."""
        mask = torch.cat([self.mask, valid], 1)
        kwargs = {self._cache_kw: self.cache, "use_cache": True, **(inputs or {})}
        aux = AuxStates(self.model, hidden_layers) if hidden_layers else None
        if aux is not None:
            kwargs.update(aux.kwargs)
        if attend is not None:  # a token tree: the caller's mask and positions
            if self._tree_support is None:
                self._tree_support = tree_support(self.model) or ""
            if self._tree_support:
                raise DraftLabError(self._tree_support)
            eager = self.model.config._attn_implementation == "eager"
            kwargs["attention_mask"] = model_mask(attend[:, None], eager, next(self.model.parameters()).dtype)
            kwargs["position_ids"] = positions
        elif (
            mask.shape[0] > 1 or self.holes_inside
        ):  # sliding / chunked windows counted in each row's real tokens (engine/decoding/attention_masks.py)
            kwargs["attention_mask"] = (
                self._position_masks(mask, ids.shape[1]) if self._position_masks is not None else mask.long()
            )
            kwargs["position_ids"] = (self.lengths[:, None] + valid.long().cumsum(1) - 1).clamp(min=0)
        if keep and self._can_keep:
            kwargs["logits_to_keep"] = keep
        if aux is not None:
            with aux:
                out = self.model(input_ids=ids, **kwargs)
        else:
            out = self.model(input_ids=ids, **kwargs)
        logits = out.logits[:, :, : self.vocab_size]
        self.mask = mask
        self.lengths = self.lengths + valid.sum(1)
        cells = mask.numel()
        if cells > self.peak_cells:
            self.peak_cells = cells
            if self._cell_bytes is None and cells:
                self._cell_bytes = cache_bytes(self.cache) // cells
        logits = logits[:, -keep:] if keep else logits
        if aux is not None:
            return logits, aux.states(out)
        return logits

    def rollback(self, lengths: torch.Tensor) -> None:
        """Forget, in row r, every real token from index lengths[r] on (device tensor [B]; no sync): their
        columns become holes."""
        real = self.mask.long().cumsum(1)  # 1-based index of each real token in its row
        self.mask = self.mask & (real <= lengths[:, None])
        self.lengths = torch.minimum(self.lengths, lengths)

    def forget(self, columns: torch.Tensor) -> None:
        """Turn the real tokens at columns [B, C] (True) into holes, wherever they sit (a token tree's nodes off the
        accepted path: engine/decoding/tree_verification.py; no sync). Until the next `compact`, even a one-row
        cache then takes its forwards through the mask (holes inside a row are no longer only trailing)."""
        self.mask = self.mask & ~columns
        self.lengths = self.mask.sum(1)
        self.holes_inside = True

    def trailing_holes(self) -> torch.Tensor:
        """How many last columns are holes in every row (a 0-d device tensor: read it with the round's transfer)."""
        used = self.mask.any(0)
        return (~used).flip(0).long().cumprod(0).sum()

    def trim(self, n: int) -> None:
        """Crop the last n columns (they must be holes in every row: `trailing_holes`)."""
        if n > 0:
            self.cache.crop(-n)
            self.mask = self.mask[:, : self.width - n]

    def select(self, rows: list[int]) -> None:
        """Keep only batch rows `rows` (finished rows leave): an index_select per layer, then the leading columns
        that are holes in every kept row are sliced off (one host read). Much cheaper than `compact`'s gather
        (about 10x on CPU), so rows leave often and realignment stays rare. When one row is left it is realigned
        (`compact`): a single row must be dense (`forward`)."""
        if len(rows) == 1:
            self.compact(rows)
            return
        index = to_device(rows, self.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(0)
        lead = int(used.int().argmax()) if bool(used.any()) else mask.shape[1]
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            layer.keys = layer.keys.index_select(0, index)[:, :, lead:]
            layer.values = layer.values.index_select(0, index)[:, :, lead:]
        self.mask = mask[:, lead:]
        self.lengths = self.lengths.index_select(0, index)

    def compact(self, rows: list[int] | None = None) -> None:
        """Keep only batch rows `rows` (all when None), each row's real tokens right-aligned in the fewest columns:
        a gather per layer (one host read of the new width)."""
        mask, lengths = self.mask, self.lengths
        if rows is not None:
            index = to_device(rows, self.device)
            mask, lengths = mask.index_select(0, index), lengths.index_select(0, index)
        width = int(lengths.max()) if lengths.numel() else 0
        order = torch.sort(mask.to(torch.int8), dim=1, stable=True).indices[:, mask.shape[1] - width :]
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            for name in ("keys", "values"):
                t = getattr(layer, name)
                if rows is not None:
                    t = t.index_select(0, index)
                gather = order[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                setattr(layer, name, t.gather(2, gather))
        self.mask = mask.gather(1, order)
        self.lengths = lengths
        self.holes_inside = False
        self.compactions += 1

    @property
    def peak_cache_bytes(self) -> int:
        """Most bytes the KV cache held since the last `reset_peak` (holes included; tensor sizes, no sync)."""
        return self.peak_cells * (self._cell_bytes or 0)

    def reset_peak(self) -> None:
        self.peak_cells = 0
