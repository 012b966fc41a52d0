"""The machine's memory read bandwidth, measured in the bench's own run (a shared machine's
bandwidth moves with its neighbours, so a number from another day says little), and one
stream's decode steps against reads of as many bytes as its weights, step by step."""
from __future__ import annotations

import statistics
import time

import torch

from engine import LLM, SamplingParams
from engine.cpu_kernels import native
from engine.model.cpu_linear import huge_page_bytes

BUFFER_BYTES = 512 * 2**20  # far past any CPU cache, so every pass reads DRAM


def read_buffer(nbytes: int) -> torch.Tensor:
    """nbytes of fp32 ones on the pages the engine's weights get (2 MiB where Linux grants them:
    a read over 4 KiB pages is slower, and a floor slower than the engine's own pages flatters it)."""
    buf = huge_page_bytes(nbytes // 4 * 4).view(torch.float32)
    buf.fill_(1.0)  # first touch: page faults are not bandwidth
    return buf


def fastest_read_seconds(buf: torch.Tensor) -> float:
    """One read of buf by each reader, the faster one's seconds: torch's sum (one sequential
    stream per thread) and, where kvscope's native kernels run, kv_read_streams (several streams
    side by side per thread, as the engine reads its weights; it reads faster than torch's sum
    on the 2-core AMD EPYC). Next to no arithmetic in either, so the faster is the most this
    machine was seen to read."""
    kernels = native()
    readers = [buf.sum] + ([lambda: kernels.read_streams(buf)] if kernels is not None else [])
    best = float("inf")
    for read in readers:
        t0 = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth_gb_s(passes: int = 7) -> float:
    """The best of `passes` reads of a 512 MiB buffer by torch's threads, in GB/s (the bench's
    headline figure for the machine; the best pass is the least disturbed one)."""
    buf = read_buffer(BUFFER_BYTES)
    return BUFFER_BYTES / min(fastest_read_seconds(buf) for _ in range(passes)) / 1e9


def stream_steps_against_reads(llm: LLM, prompt: list[int], max_tokens: int, weights_sized: torch.Tensor) -> dict:
    """One greedy request run step by step from an empty prefix cache, each decode step followed
    by a read of `weights_sized` (read_buffer of the weights' bytes: a one-row step reads every
    weight once, so that read is its floor). Pairing each step with a read in the same second
    compares the two under the same neighbours: a floor from the best of a few reads against a mean
    step counts the machine's quietest moment against its average one (one minute's reads of the
    same bytes spread by a third on the 2-core AMD EPYC)."""
    eng = llm.engine
    eng.kv.pool.reset_prefix_cache()
    eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    eng.step()  # the prefill: not one row
    steps, reads = [], []
    while eng.has_unfinished_requests():
        t0 = time.perf_counter()
        eng.step()
        steps.append(time.perf_counter() - t0)
        reads.append(fastest_read_seconds(weights_sized))
    return {"share": statistics.median(r / s for r, s in zip(reads, steps)), "pairs": len(steps),
            "step_ms": 1e3 * statistics.median(steps), "read_ms": 1e3 * statistics.median(reads),
            "best_read_over_mean_step": min(reads) / statistics.fmean(steps)}
