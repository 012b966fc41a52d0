"""Run kvscope's scheduler and vLLM 0.32's scheduler side by side on the same workloads and
compare them after every step: tokens scheduled per request, the computed tokens each
scheduled request starts from (prefix hits included), admissions, preemptions, finishes,
queues, every running request's block ids and computed tokens, the free queue in order,
and which blocks hold a cached hash.

    python -m tests.oracle.differential --workloads 1000 [--seed 0] [--async [--queue-depth 2]]
                                        [--groups full+sliding | full+mamba]

`--async`: kvscope's AsyncScheduler against vLLM's, driven as vLLM's engine core drives it on a
GPU (a batch queue of two: step N+1 is scheduled before step N's update). Both are compared
after every schedule and every update, on the above plus which rows sample, which inputs are
placeholders, each running request's placeholders and each live request's output count.
`--groups full+sliding`: each workload adds a KV cache group of sliding-window layers (a random
window of 1-64 tokens) beside the full-attention one, as Gemma 3 and gpt-oss have; then every
group's block table is compared. `--groups full+mamba`: the second group is Mamba layers in
vLLM's "align" cache mode instead (kvscope's MambaAlignedScheduler, whose prefill chunks end
where a Mamba state can be cached), over workloads whose prompts resend, extend or cut earlier
ones. `--check-planted [--async | --groups full+sliding | --groups full+mamba]` plants each known
fault in turn and prints the first seed that catches it.

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
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .kvscope_side import KvscopeScheduler
from .outcome import print_outcome
from .workloads import GROUPS, Workload, random_workload, shrink_candidates

MAX_STEPS = 20_000
QUEUE_DEPTH = 2  # vLLM's engine core batch queue under async scheduling


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
    # Async only: steps scheduled while another was in flight, and preempted requests found
    # waiting for their stale outputs when a step was scheduled (needs a queue deeper than 2).
    scheduled_ahead: int | None = None
    waiting_for_stale: int | None = None
    # Sliding-window groups only: blocks freed because they left the window.
    window_freed_blocks: int | None = None
    # Mamba groups only: state blocks freed because a later state replaced them, and admissions
    # whose hit the Mamba group cut short of what full attention alone had cached.
    mamba_states_freed: int | None = None
    hits_cut_by_mamba: int | None = None
    differences: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: Counts) -> None:
        for name in ("workloads", "steps", "preemptions", "admissions_with_hits", "hit_tokens",
                     "same_step_hit_blocks", "differences"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("scheduled_ahead", "waiting_for_stale", "window_freed_blocks", "mamba_states_freed",
                     "hits_cut_by_mamba"):
            if getattr(other, name) is not None:
                setattr(self, name, (getattr(self, name) or 0) + getattr(other, name))
        self.failures += other.failures

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "failures" and v is not None}

    def count_schedule(self, record: dict, running_before: set[str], events) -> None:
        """Count what one schedule exercised (`events`: kvscope's block events of it)."""
        self.steps += 1
        self.preemptions += len(record["preempted"])
        admitted = [r for r in record["scheduled"] if r not in running_before]
        hits = [record["computed_before"][r] for r in admitted if record["computed_before"][r] > 0]
        self.admissions_with_hits += len(hits)
        self.hit_tokens += sum(hits)
        self.same_step_hit_blocks += len(set(events.hits) & set(events.cached))


    def count_groups(self, ours: KvscopeScheduler) -> None:
        """What a second KV cache group did so far (kvscope's running totals)."""
        self.window_freed_blocks = ours.num_blocks_left_window
        self.mamba_states_freed, self.hits_cut_by_mamba = ours.num_mamba_states_freed, ours.num_hits_cut_by_mamba


def _first_difference(a: dict, b: dict) -> str | None:
    return next((k for k in a if a[k] != b[k]), None)


def run_workload(w: Workload, async_: bool = False, depth: int = QUEUE_DEPTH) -> tuple[Counts, Divergence | None]:
    """Step both schedulers until both are idle and every request has arrived (`async_`: see
    run_workload_async, with up to `depth` steps in flight)."""
    from .vllm_side import VllmScheduler

    if async_:
        return run_workload_async(w, depth)
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
        counts.count_schedule(mine, running_before, ours.events)
        running_before = set(state["running"])
        counts.count_groups(ours)
        if step > last_arrival and not state["running"] and not state["waiting"]:
            return counts, None
    raise RuntimeError(f"workload did not finish in {MAX_STEPS} steps: {w!r}")


def run_workload_async(w: Workload, depth: int = QUEUE_DEPTH) -> tuple[Counts, Divergence | None]:
    """Both AsyncSchedulers, called in the order of vLLM's EngineCore.step_with_batch_queue (as
    tests/oracle/live_differential.py's Run.run): while fewer than `depth` steps are in flight and
    vLLM has requests, schedule one and go on (after the next arrivals) to schedule again;
    otherwise update the oldest step in flight. Compared after every schedule and every update."""
    from .vllm_side import VllmScheduler

    ours, theirs = KvscopeScheduler(w, async_scheduling=True), VllmScheduler(w, async_scheduling=True)
    counts = Counts(workloads=1, scheduled_ahead=0, waiting_for_stale=0)
    last_arrival = max(r.arrival_step for r in w.requests)
    in_flight: deque = deque()  # (step, kvscope's output, vLLM's output), newest first
    step = 0

    def compare(n: int, when: str, records: tuple[dict, dict], before: dict) -> Divergence | None:
        states = ours.state() | ours.async_state(), theirs.state() | theirs.async_state()
        for a, b in (records, states):
            key = _first_difference(a, b)
            if key is not None:
                counts.differences = 1
                return Divergence(n, f"{key} (after {when} it)", a[key], b[key], before)
        return None

    for it in range(MAX_STEPS):
        for r in w.requests:
            if r.arrival_step == it:
                ours.add(r)
                theirs.add(r)
        if theirs.has_requests() and len(in_flight) < depth:
            step += 1
            before = ours.state()
            counts.waiting_for_stale = (counts.waiting_for_stale or 0) + theirs.num_waiting_for_stale_outputs()
            (mine_out, mine), (their_out, other) = ours.schedule(), theirs.schedule()
            if div := compare(step, "scheduling", (mine, other), before):
                return counts, div
            counts.count_schedule(mine, set(before["running"]), ours.events)
            counts.scheduled_ahead = (counts.scheduled_ahead or 0) + bool(in_flight)
            counts.count_groups(ours)
            in_flight.appendleft((step, mine_out, their_out))
            if len(in_flight) < depth and theirs.has_requests():
                continue  # vLLM's engine core schedules again before it waits for a result
        if in_flight:
            oldest, mine_out, their_out = in_flight.pop()
            before = ours.state()
            if div := compare(oldest, "updating", (ours.update(mine_out), theirs.update(their_out)), before):
                return counts, div
        if it > last_arrival and not in_flight and not theirs.has_requests():
            return counts, None
    raise RuntimeError(f"workload did not finish in {MAX_STEPS} iterations: {w!r}")


def shrink(w: Workload, budget_s: float = 60.0, async_: bool = False, depth: int = QUEUE_DEPTH) -> Workload:
    """The smallest workload still diverging that greedy shrinking finds within budget_s."""
    deadline = time.monotonic() + budget_s
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for candidate in shrink_candidates(w):
            if time.monotonic() > deadline:
                break
            if run_workload(candidate, async_, depth)[1] is not None:
                w, improved = candidate, True
                break
    return w


def run_many(seeds: range, shrink_budget_s: float = 60.0, max_reports: int = 3, async_: bool = False,
             depth: int = QUEUE_DEPTH, groups: str = "full") -> Counts:
    total = Counts()
    for seed in seeds:
        w = random_workload(seed, groups)
        counts, div = run_workload(w, async_, depth)
        total.add(counts)
        if div is not None and len(total.failures) < max_reports:
            small = shrink(w, shrink_budget_s, async_, depth)
            _, small_div = run_workload(small, async_, depth)
            assert small_div is not None  # shrinking keeps only workloads that still diverge
            total.failures.append(f"seed {seed} diverges; shrunk reproduction:\n{small!r}\n{small_div.describe()}")
    return total


PLANTED_BUGS = ("cache-after-forward", "dedup-full-blocks", "admit-on-first-chunk")
# Ways an async scheduler goes wrong, planted in kvscope's AsyncScheduler in turn, each with the
# queue depth that shows it: a request waits for stale outputs only with more than 2 in flight.
# Ways KV cache groups go wrong, planted in kvscope's hybrid coordinator (with --groups full+sliding).
GROUPS_PLANTED_BUGS = ("no-hit-intersection", "sliding-blocks-kept", "no-admission-cap")
# Ways a Mamba group in align mode goes wrong, planted in kvscope's Mamba code (with --groups full+mamba).
MAMBA_PLANTED_BUGS = ("mamba-states-kept", "mamba-hit-from-the-left", "chunks-not-aligned", "same-step-mamba-hit",
                      "mamba-states-cached-densely")
ASYNC_PLANTED_BUGS = {"cache-past-placeholders": 2, "placeholders-kept-on-preempt": 2, "schedule-past-max-tokens": 2,
                      "stale-output-dropped": 2, "readmitted-before-stale-outputs": 3}


@contextmanager
def planted(bug: str):
    """Put back one of the three ways kvscope used to differ from vLLM (issue 14), or plant one
    of the ways an async scheduler goes wrong (ASYNC_PLANTED_BUGS), to show this harness
    catches each."""
    from engine.core import mamba_scheduler
    from engine.core.async_scheduler import AsyncScheduler
    from engine.core.block_pool import BlockPool
    from engine.core.hybrid_kv_cache import GroupedHits, HybridKVCacheCoordinator
    from engine.core.kv_cache_groups import FullAttentionSpec, MambaSpec, SlidingWindowSpec
    from engine.core.kv_cache_manager import KVCacheManager
    from engine.core.mamba_group import MambaStates
    from engine.core.scheduler import Scheduler

    cls: type | ModuleType
    patch: Callable[..., Any]
    if bug == "cache-past-placeholders":  # a landed token's block is cached before its KV is computed
        cls, name = AsyncScheduler, "_cache_landed"
        patch = lambda self, req: self.kv.cache_blocks(req, min(req.num_computed_tokens, req.num_tokens))  # noqa: E731
    elif bug == "placeholders-kept-on-preempt":  # a preempted request resumes with its old placeholders
        cls, name = AsyncScheduler, "_preempt"
        preempt = cls._preempt

        def patch(self, req):
            kept = req.num_output_placeholders
            preempt(self, req)
            req.num_output_placeholders = kept
    elif bug == "schedule-past-max-tokens":  # one step more for a request whose last token is in flight
        cls, name, patch = AsyncScheduler, "_ends_in_flight", lambda self, req: False
    elif bug == "stale-output-dropped":  # the token of a step in flight at a preemption is thrown away
        cls, name = AsyncScheduler, "_land_token"
        land_token = cls._land_token
        patch = lambda self, req, token, stale, *now: not stale and land_token(self, req, token, stale, *now)  # noqa: E731
    elif bug == "readmitted-before-stale-outputs":  # a preempted request resumes before its last outputs land
        cls, name, patch = AsyncScheduler, "_schedule_waiting", Scheduler._schedule_waiting
    elif bug == "no-hit-intersection":  # each group's hit found alone; the full group's length is taken
        cls, name = HybridKVCacheCoordinator, "find_longest_cache_hit"
        find = cls.find_longest_cache_hit

        def patch(self, req, max_length):
            found = find(self, req, max_length)[0]
            alone = self.specs[1].find_longest_cache_hit(self.pool, req.block_hashes, max_length, 1, self.block_size)
            return GroupedHits([found.by_group[0], alone], found.tokens_by_group), len(found) * self.block_size
    elif bug == "sliding-blocks-kept":  # blocks that left the window are never freed
        cls, name, patch = HybridKVCacheCoordinator, "remove_skipped_blocks", lambda self, req, tables, n: None
    elif bug == "no-admission-cap":  # admission reserves a sliding group's whole sequence
        cls, name, patch = SlidingWindowSpec, "admission_cap", lambda self, *args: None
    elif bug == "mamba-states-kept":  # a state block is never freed once a later state replaced it
        cls, name, patch = MambaStates, "remove_skipped", lambda self, *args: None
    elif bug == "mamba-hit-from-the-left":  # a Mamba hit taken as full attention's: the run of cached blocks
        cls, name, patch = MambaSpec, "find_longest_cache_hit", FullAttentionSpec.find_longest_cache_hit
    elif bug == "chunks-not-aligned":  # prefill chunks end wherever the budget ends them
        cls, name, patch = mamba_scheduler, "aligned_chunk_tokens", lambda start, num_new, *args: num_new
    elif bug == "same-step-mamba-hit":  # an admission hits a state this very step writes
        cls, name = MambaStates, "blocks_to_allocate"
        blocks_to_allocate = cls.blocks_to_allocate

        def patch(self, *args):
            self.cached_this_step, written = set(), self.cached_this_step
            try:
                return blocks_to_allocate(self, *args)
            finally:
                self.cached_this_step = written
    elif bug == "mamba-states-cached-densely":  # every state cached, whatever the retention interval
        cls, name, patch = MambaSpec, "cacheable_mask", lambda self, *args: None
    elif bug == "cache-after-forward":  # blocks findable only from the next step on
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
        raise ValueError(f"unknown bug {bug!r}; one of "
                         f"{[*PLANTED_BUGS, *ASYNC_PLANTED_BUGS, *GROUPS_PLANTED_BUGS, *MAMBA_PLANTED_BUGS]}")
    original = getattr(cls, name)
    setattr(cls, name, patch)
    try:
        yield
    finally:
        setattr(cls, name, original)


def first_divergent_seed(bug: str, max_workloads: int = 300, groups: str = "full") -> int | None:
    async_, depth = bug in ASYNC_PLANTED_BUGS, ASYNC_PLANTED_BUGS.get(bug, QUEUE_DEPTH)
    with planted(bug):
        return next((seed for seed in range(max_workloads)
                     if run_workload(random_workload(seed, groups), async_, depth)[1]), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="first workload seed")
    ap.add_argument("--shrink-seconds", type=float, default=60.0)
    ap.add_argument("--check-planted", action="store_true",
                    help="instead: put back each old difference (with --async: plant each async fault) in turn "
                         "and print the first seed that catches it")
    ap.add_argument("--async", dest="async_", action="store_true",
                    help="kvscope's AsyncScheduler against vLLM's, in vLLM's engine-core batch-queue order")
    ap.add_argument("--queue-depth", type=int, default=QUEUE_DEPTH,
                    help="with --async: steps in flight at most (vLLM's batch queue holds 2; a deeper queue, as "
                         "pipeline parallelism keeps, also leaves requests waiting for stale outputs)")
    ap.add_argument("--groups", choices=GROUPS, default="full",
                    help="KV cache groups: full attention only, or full attention + a sliding window or Mamba layers")
    args = ap.parse_args(argv)
    if args.queue_depth < 1:
        ap.error("--queue-depth must be at least 1")
    from . import vllm_side  # noqa: F401  (import vLLM once, before timing)
    # vLLM's import leaves millions of long-lived objects; keep the cyclic GC from rescanning
    # them every few thousand allocations (it tripled the run time).
    gc.freeze()
    if args.check_planted:
        if args.groups != "full":
            bugs = MAMBA_PLANTED_BUGS if args.groups == "full+mamba" else GROUPS_PLANTED_BUGS
            print(json.dumps({bug: first_divergent_seed(bug, groups=args.groups) for bug in bugs}))
            return 0
        bugs = ASYNC_PLANTED_BUGS if args.async_ else PLANTED_BUGS
        print(json.dumps({bug: first_divergent_seed(bug) for bug in bugs}))
        return 0
    t0 = time.monotonic()
    total = run_many(range(args.seed, args.seed + args.workloads), args.shrink_seconds, async_=args.async_,
                     depth=args.queue_depth, groups=args.groups)
    which = ("AsyncScheduler" if args.async_ else "scheduler") + ("" if args.groups == "full" else f", {args.groups}")
    return print_outcome(total, f"differential vs vLLM 0.32 {which}: {args.workloads} workloads in "
                                f"{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
