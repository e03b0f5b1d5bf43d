"""Timing a decode without stalling the device.

CUDA kernels run asynchronously, so a host clock read mid-round needs torch.cuda.synchronize(), which drains the
queue and leaves the GPU idle until the host launches again. Instead the loop `mark`s CUDA events at the round's
boundaries and reads the intervals after the round's one host transfer, which waits for the device anyway; the
last mark must come before that transfer. On CPU a mark is a perf_counter reading. `wall` synchronizes: the
per-prompt wall time (SPEC timing protocol), read once at the start and once at the end of a prompt; `now`, read
right after a round's transfer, is when its tokens arrived (no extra synchronization).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from engine.decoding.torch_types import Mark


class RoundClock:
    def __init__(
        self,
        device: torch.device,
        event: Callable[[], Any] | None = None,
        synchronize: Callable[[], None] | None = None,
    ) -> None:
        """`event` (a recorded event with `elapsed_time` in ms) and `synchronize` replace torch.cuda's in tests."""
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        self._event = event or self._cuda_event
        self._synchronize = synchronize or (lambda: torch.cuda.synchronize(self.device))

    def wall(self) -> float:
        """Host seconds, after all queued device work finished."""
        if self.on_cuda:
            self._synchronize()
        return time.perf_counter()

    def now(self) -> float:
        """Host seconds without waiting for the device: right after a host transfer, when what it carried (a
        round's tokens) reached the host, since the transfer itself waited for the work queued before it."""
        return time.perf_counter()

    def mark(self) -> Mark:
        """A point in the device's work queue, taken without waiting for it."""
        return self._event() if self.on_cuda else time.perf_counter()

    def seconds(self, start: Mark, end: Mark) -> float:
        """Seconds between two marks; on CUDA only after a host transfer queued behind `end` returned."""
        return float(start.elapsed_time(end) / 1000.0 if self.on_cuda else end - start)

    def _cuda_event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event
