"""Run kvscope's scheduler and vLLM 0.32's scheduler side by side on the same workloads and
compare them after every step: tokens scheduled per request, the computed tokens each
scheduled request starts from (prefix hits included), admissions, preemptions, finishes,
queues, every running request's block ids and computed tokens, the free queue in order,
and which blocks hold a cached hash.

    python -m tests.oracle.differential --workloads 1000 [--seed 0]

On a difference it shrinks the workload and prints it as a Python literal with the step,
the field and both engines' values. The last line is JSON counts; exit status 1 on any
difference.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from .kvscope_side import KvscopeScheduler
from .workloads import Workload, random_workload, shrink_candidates

MAX_STEPS = 20_000


@dataclass
class Divergence:
    step: int
    field: str
    kvscope: object
    vllm: object
    state_before: dict

    def describe(self) -> str:
        return (f"step {self.step}: {self.field} differs\n  kvscope: {self.kvscope!r}\n  vllm:    {self.vllm!r}\n"
                f"  state before this step (kvscope's): {self.state_before!r}")


@dataclass
class Counts:
    workloads: int = 0
    steps: int = 0
    preemptions: int = 0
    admissions_with_hits: int = 0
    hit_tokens: int = 0
    same_step_hit_blocks: int = 0
    differences: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: "Counts") -> None:
        for name in ("workloads", "steps", "preemptions", "admissions_with_hits", "hit_tokens",
                     "same_step_hit_blocks", "differences"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures += other.failures

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "failures"}


def _first_difference(a: dict, b: dict) -> str | None:
    return next((k for k in a if a[k] != b[k]), None)


def run_workload(w: Workload) -> tuple[Counts, Divergence | None]:
    """Step both schedulers until both are idle and every request has arrived."""
    from .vllm_side import VllmScheduler

    ours, theirs = KvscopeScheduler(w), VllmScheduler(w)
    counts = Counts(workloads=1)
    last_arrival = max(r.arrival_step for r in w.requests)
    running_before: set[str] = set()
    for step in range(1, MAX_STEPS + 1):
        for r in w.requests:
            if r.arrival_step == step - 1:
                ours.add(r)
                theirs.add(r)
        before = ours.state()
        mine, other = ours.step(), theirs.step()
        state = ours.state()
        for a, b in ((mine, other), (state, theirs.state())):
            key = _first_difference(a, b)
            if key is not None:
                counts.differences = 1
                return counts, Divergence(step, key, a[key], b[key], before)
        counts.steps += 1
        counts.preemptions += len(mine["preempted"])
        admitted = [r for r in mine["scheduled"] if r not in running_before]
        hits = [mine["computed_before"][r] for r in admitted if mine["computed_before"][r] > 0]
        counts.admissions_with_hits += len(hits)
        counts.hit_tokens += sum(hits)
        events = ours.events
        counts.same_step_hit_blocks += len(set(events.hits) & set(events.cached))
        running_before = set(state["running"])
        if step > last_arrival and not state["running"] and not state["waiting"]:
            return counts, None
    raise RuntimeError(f"workload did not finish in {MAX_STEPS} steps: {w!r}")


def shrink(w: Workload, budget_s: float = 60.0) -> Workload:
    """The smallest workload still diverging that greedy shrinking finds within budget_s."""
    deadline = time.monotonic() + budget_s
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for candidate in shrink_candidates(w):
            if time.monotonic() > deadline:
                break
            if run_workload(candidate)[1] is not None:
                w, improved = candidate, True
                break
    return w


def run_many(seeds: range, shrink_budget_s: float = 60.0, max_reports: int = 3) -> Counts:
    total = Counts()
    for seed in seeds:
        w = random_workload(seed)
        counts, div = run_workload(w)
        total.add(counts)
        if div is not None and len(total.failures) < max_reports:
            small = shrink(w, shrink_budget_s)
            _, small_div = run_workload(small)
            total.failures.append(f"seed {seed} diverges; shrunk reproduction:\n{small!r}\n{small_div.describe()}")
    return total


PLANTED_BUGS = ("cache-after-forward", "dedup-full-blocks", "admit-on-first-chunk")


@contextmanager
def planted(bug: str):
    """Put back one of the three ways kvscope used to differ from vLLM (issue 14), to show
    this harness catches each."""
    from engine.core.block_pool import BlockPool
    from engine.core.kv_cache_manager import KVCacheManager

    if bug == "cache-after-forward":  # blocks findable only from the next step on
        cls, name = KVCacheManager, "cache_blocks"
        cache_blocks = cls.cache_blocks
        patch = lambda self, req, n: cache_blocks(self, req, min(n, req.num_computed_tokens))  # noqa: E731
    elif bug == "dedup-full-blocks":  # a second block with a cached hash stays unhashed
        cls, name = BlockPool, "register"
        register = cls.register
        patch = lambda self, b, h, t: None if h in self.cached_blocks_of_hash else register(self, b, h, t)  # noqa: E731
    elif bug == "admit-on-first-chunk":  # only the first chunk must fit the pool
        cls, name = KVCacheManager, "allocate_slots"
        allocate = cls.allocate_slots
        patch = lambda self, req, n, hits=(), full_sequence_must_fit=False: allocate(self, req, n, hits)  # noqa: E731
    else:
        raise ValueError(f"unknown bug {bug!r}; one of {PLANTED_BUGS}")
    original = getattr(cls, name)
    setattr(cls, name, patch)
    try:
        yield
    finally:
        setattr(cls, name, original)


def first_divergent_seed(bug: str, max_workloads: int = 300) -> int | None:
    with planted(bug):
        return next((seed for seed in range(max_workloads) if run_workload(random_workload(seed))[1]), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="first workload seed")
    ap.add_argument("--shrink-seconds", type=float, default=60.0)
    ap.add_argument("--check-planted", action="store_true",
                    help="instead: put back each old difference in turn and print the first seed that catches it")
    args = ap.parse_args(argv)
    from . import vllm_side  # noqa: F401  (import vLLM once, before timing)
    # vLLM's import leaves millions of long-lived objects; keep the cyclic GC from rescanning
    # them every few thousand allocations (it tripled the run time).
    gc.freeze()
    if args.check_planted:
        print(json.dumps({bug: first_divergent_seed(bug) for bug in PLANTED_BUGS}))
        return 0
    t0 = time.monotonic()
    total = run_many(range(args.seed, args.seed + args.workloads), args.shrink_seconds)
    for failure in total.failures:
        print(failure, file=sys.stderr)
    print(f"differential vs vLLM 0.32 scheduler: {args.workloads} workloads in {time.monotonic() - t0:.0f} s")
    print(json.dumps(total.summary()))
    return 1 if total.differences else 0


if __name__ == "__main__":
    sys.exit(main())
