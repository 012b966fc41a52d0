"""Times the forward pass of a step without adding synchronisation.

On a CPU the forward is done when the call returns: the wall clock is the answer. On a GPU
the call returns once the kernels are queued, so CUDA events bracket the work instead; they
are read after the sampler has copied the sampled tokens to the host, a synchronisation the
step needs anyway, so timing adds none of its own."""
from __future__ import annotations

import time

import torch


class ForwardTimer:
    """Times the forward: CUDA events on a GPU (the host returns before the kernels end), the
    host clock on a CPU."""
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._t0 = self._t1 = 0.0
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # (start, end) on a GPU

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()
        self._t1 = time.perf_counter()

    def seconds(self) -> float:
        """The forward's duration; on a GPU call it after the step's host sync (the sampler)."""
        if self._events is None:
            return self._t1 - self._t0
        start, end = self._events
        end.synchronize()  # already complete after the sampler's copy: returns at once
        return start.elapsed_time(end) / 1e3
