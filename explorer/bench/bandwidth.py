"""The machine's memory read bandwidth, measured in the bench's own run (a shared machine's
bandwidth moves with its neighbours, so a number from another day says little)."""
from __future__ import annotations

import time

import torch

from engine.cpu_kernels import native

BUFFER_BYTES = 512 * 2**20  # far past any CPU cache, so every pass reads DRAM


def read_bandwidth_gb_s(passes: int = 7) -> float:
    """The best of `passes` reads of a 512 MiB fp32 buffer by torch's threads, in GB/s, each pass
    timing two readers: torch's sum (one sequential stream per thread) and, where kvscope's
    native kernels run, kv_read_streams (several streams side by side per thread, as the engine
    reads its weights; it reads faster than torch's sum on the 2-core AMD EPYC). Next to no
    arithmetic in either. The best pass is the least disturbed one, and the fastest reader sets
    the floor, so the engine is measured against the most this machine was seen to read."""
    buf = torch.ones(BUFFER_BYTES // 4, dtype=torch.float32)
    kernels = native()
    readers = [buf.sum] + ([lambda: kernels.read_streams(buf)] if kernels is not None else [])
    buf.sum()  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(passes):
        for read in readers:
            t0 = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - t0)
    return BUFFER_BYTES / best / 1e9
