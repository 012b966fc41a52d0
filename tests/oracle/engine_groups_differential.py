"""kvscope's whole engine on a model with sliding-window layers against vLLM 0.32's scheduler with
the same two KV cache groups. Each random workload runs on a Session over a random 4-layer Qwen3
whose middle layers slide (a real forward, greedy sampling, kvscope's own scheduler and pool);
the run is recorded and replayed through vLLM's Scheduler and KV cache manager, built without
weights with a full-attention group and a sliding-window group, given the tokens kvscope sampled
(explorer.whatif.identity). Every step must schedule the same tokens from the same computed
counts, hit, admit, preempt and finish the same requests, and leave every running request with
the same block ids in both groups (the null block where tokens left the window).

    python -m tests.oracle.engine_groups_differential [--workloads 20] [--seed 0] [--plant NAME]

The workloads are tests/oracle/workloads.py's "full+sliding" ones (shared prefixes, chunked
prompts, small pools that preempt), each run with one of three windows. `--plant` puts one of
the scheduler-level harness's group faults (differential.GROUPS_PLANTED_BUGS) into kvscope's
engine and prints the first workload that catches it (by a difference, or by the engine's own
invariant checks raising). The last line is JSON counts; exit status 1 on any difference.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .outcome import print_outcome
from .workloads import Workload, random_workload

WINDOWS = (4, 16, 40)   # the models' sliding windows, one per workload by seed
LAYER_TYPES = ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
MAX_STEPS = 2_000


@dataclass
class Counts:
    workloads: int = 0
    steps: int = 0
    requests: int = 0
    hit_tokens: int = 0
    preemptions: int = 0
    chunks: int = 0
    window_nulls: int = 0      # null blocks in the sliding group's tables, summed over steps
    differences: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: Counts) -> None:
        for name in ("workloads", "steps", "requests", "hit_tokens", "preemptions", "chunks", "window_nulls",
                     "differences"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures += other.failures

    def summary(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "failures"}


class Models:
    """One random mixed Qwen3 per window, written on first use (transformers writes it: ~1 s)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="kvscope-groups-")
        self._paths: dict[int, Path] = {}

    def path(self, window: int) -> Path:
        if window not in self._paths:
            from benchmarks.checkpoints import write_tiny_qwen3

            self._paths[window] = write_tiny_qwen3(Path(self._dir.name) / f"w{window}", num_layers=4,
                                                   sliding_window=window, layer_types=LAYER_TYPES)
        return self._paths[window]

    def close(self) -> None:
        self._dir.cleanup()


def engine_workload(seed: int) -> Workload:
    """The scheduler harness's "full+sliding" requests and knobs, block sizes 4 and 16 (kvscope's
    attention kernels take any; these keep the forward quick), the window one of WINDOWS."""
    w = random_workload(seed, "full+sliding")
    block_size = 4 if w.block_size < 16 else 16
    window = WINDOWS[seed % len(WINDOWS)]
    interval = w.prefix_cache_retention_interval
    if interval:   # a multiple of the block size, as vLLM requires
        interval = block_size * max(1, interval // w.block_size)
    # The largest request fits alone in both groups; every other workload has no block more, so
    # requests that arrive together run the pool dry and preempt.
    need_one = -(-max(len(r.prompt) + r.max_tokens for r in w.requests) // block_size)
    num_blocks = 1 + 2 * need_one + (need_one if seed % 2 else 0)
    return Workload(block_size, num_blocks, w.max_num_batched_tokens, w.max_num_seqs, w.max_model_len,
                    w.enable_prefix_caching, w.enable_chunked_prefill, w.scheduler_reserve_full_isl, w.requests,
                    sliding_window=window, prefix_cache_retention_interval=interval)


def run_workload(models: Models, w: Workload, seed: int) -> Counts:
    """One workload on kvscope's engine, then its identity replay through vLLM's scheduler."""
    from explorer import Session
    from explorer.whatif import identity
    from explorer.why.proof import recording_of

    c = Counts(workloads=1, requests=len(w.requests))
    s = Session(str(models.path(w.sliding_window or WINDOWS[0])), block_size=w.block_size,
                num_kv_blocks=w.num_blocks, max_num_batched_tokens=w.max_num_batched_tokens,
                max_num_seqs=w.max_num_seqs, max_model_len=w.max_model_len,
                enable_prefix_caching=w.enable_prefix_caching, enable_chunked_prefill=w.enable_chunked_prefill,
                scheduler_reserve_full_isl=w.scheduler_reserve_full_isl,
                prefix_cache_retention_interval=w.prefix_cache_retention_interval, check_invariants=True)
    try:
        waiting = sorted(w.requests, key=lambda r: r.arrival_step)
        for _ in range(MAX_STEPS):
            # Requests arrive before their step; an idle engine takes the next ones at once.
            step = s.current.step
            while waiting and (waiting[0].arrival_step <= step or not s.source.pending()):
                r = waiting.pop(0)
                s.add_request(list(r.prompt), request_id=r.request_id, max_tokens=r.max_tokens, temperature=0.0,
                              ignore_eos=True)
            if not s.step():
                if not waiting:
                    break
        for e in s.history:
            if e.record is None:
                continue
            c.steps += 1
            c.preemptions += len(e.record["preempted"])
            c.hit_tokens += sum(x["num_cached_tokens"] for x in e.record["scheduled"])
            c.chunks += sum(bool(x["is_prefill"] and x["chunk_index"]) for x in e.record["scheduled"])
            c.window_nulls += sum(t.count(0) for r in e.snapshot["queues"]["running"]
                                  for t in r.get("group_block_tables") or ())
        report = identity(recording_of(s.history), s.history)
    except Exception as exc:  # noqa: BLE001 - kvscope's own invariants (check_invariants) caught it first
        c.differences = 1
        c.failures.append(f"workload {seed} ({w.sliding_window}-token window): kvscope's engine raised "
                          f"{type(exc).__name__}: {exc}\n{w!r}")
        return c
    finally:
        s.close()
    if not report.ok:
        c.differences = len(report.differences)
        c.failures.append(f"workload {seed} ({w.sliding_window}-token window): {report.text()}\n{w!r}")
    return c


def run_many(seeds: range, plant: str | None = None) -> Counts:
    from .differential import planted

    total, models = Counts(), Models()
    try:
        with planted(plant) if plant else contextlib.nullcontext():
            for seed in seeds:
                total.add(run_workload(models, engine_workload(seed), seed))
                if plant and total.differences:
                    break
    finally:
        models.close()
    return total


def main(argv: list[str] | None = None) -> int:
    from .differential import GROUPS_PLANTED_BUGS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="first workload seed")
    ap.add_argument("--plant", choices=GROUPS_PLANTED_BUGS, default=None,
                    help="a fault in kvscope's engine: print the first workload that catches it")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    seeds = range(args.seed, args.seed + args.workloads)
    total = run_many(seeds, args.plant)
    if args.plant:
        caught = total.workloads - 1 + args.seed if total.differences else None
        print(json.dumps({"plant": args.plant, "first_seed": caught}))
        return 0 if caught is not None else 1
    return print_outcome(total, f"kvscope's engine (sliding-window groups) vs vLLM 0.32's scheduler: "
                                f"{args.workloads} workloads in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
