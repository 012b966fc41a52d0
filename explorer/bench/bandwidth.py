"""The machine's memory read bandwidth, measured in the bench's own run (a shared machine's
bandwidth moves with its neighbours, so a number from another day says little)."""
from __future__ import annotations

import time

import torch

BUFFER_BYTES = 512 * 2**20  # far past any CPU cache, so every pass reads DRAM


def read_bandwidth_gb_s(passes: int = 7) -> float:
    """Best of `passes` reads of a 512 MiB fp32 buffer by torch's threads (a sum: one load per
    element, next to no arithmetic), in GB/s. The best pass is the least disturbed one."""
    buf = torch.ones(BUFFER_BYTES // 4, dtype=torch.float32)
    buf.sum()  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return BUFFER_BYTES / best / 1e9
