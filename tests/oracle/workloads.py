"""Random scheduling workloads for the differential test against vLLM's scheduler.

A workload is plain data (so a failing one prints as a Python literal you can paste into a
test): the scheduler knobs, the pool, and requests with arrival steps. Prompts are drawn
over tiny alphabets and often start with a shared prefix, so prefix-cache hits, same-step
hits and duplicate full blocks happen often; pools are small, so preemption does too.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class OracleRequest:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int  # added before this step's schedule (0: before the first step)


@dataclass(frozen=True)
class Workload:
    block_size: int
    num_blocks: int  # including the null block 0
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    scheduler_reserve_full_isl: bool
    requests: tuple[OracleRequest, ...] = field(default_factory=tuple)
    # A second KV cache group of sliding-window layers (None: full attention only), with vLLM's
    # prefix_cache_retention_interval (which of its blocks are cached).
    sliding_window: int | None = None
    prefix_cache_retention_interval: int | None = 0
    # A second KV cache group of Mamba layers in vLLM's "align" cache mode (instead of a sliding
    # window), with the same prefix_cache_retention_interval (which of its states are cached).
    mamba_align: bool = False
    # The order vLLM's scheduler gets its groups in (bare_scheduler's kv_cache_groups, e.g.
    # "sliding,full" as vLLM orders a Gemma 3's); None: full attention first.
    vllm_group_order: str | None = None

    def sampled_token(self, request_id: str, index: int) -> int:
        """The token both engines 'sample' as output number `index`: a fixed function over a
        small alphabet, so outputs repeat and extend shared prefixes too."""
        return 1 + (sum(map(ord, request_id)) * 7 + index * 5) % 3

    def is_feasible(self) -> bool:
        """Every request fits the pool and max_model_len on its own (both engines reject others)."""
        groups = 1 if self.sliding_window is None and not self.mamba_align else 2  # each group its own blocks
        return all(len(r.prompt) + r.max_tokens <= self.max_model_len
                   and groups * -(-(len(r.prompt) + r.max_tokens) // self.block_size) <= self.num_blocks - 1
                   for r in self.requests)


def _prompt(rng: random.Random, shared: list[int], alphabet: int) -> tuple[int, ...]:
    own = [rng.randrange(alphabet) + 1 for _ in range(rng.randint(1, 300))]
    prefix = shared[:rng.randint(0, len(shared))] if rng.random() < 0.7 else []
    return tuple((prefix + own)[:300])


GROUPS = ("full", "full+sliding", "full+mamba")


def random_workload(seed: int, groups: str = "full") -> Workload:
    """One workload, fully determined by `seed` (and `groups`: 'full+sliding' adds a sliding-window
    group to the same requests and knobs, with a random window, and a pool that holds the largest
    request in both groups; 'full+mamba': see _mamba_workload)."""
    w = _full_attention_workload(seed)
    if groups == "full":
        return w
    if groups == "full+mamba":
        return _mamba_workload(seed, w)
    rng = random.Random(f"sliding-{seed}")
    window = rng.choice([rng.randint(1, 8), rng.randint(1, 64)])
    need_one = -(-max(len(r.prompt) + r.max_tokens for r in w.requests) // w.block_size)
    num_blocks = 1 + 2 * need_one + rng.choice([0, rng.randint(0, need_one), rng.randint(0, 4 * need_one)])
    return replace(w, num_blocks=num_blocks, sliding_window=window,
                   prefix_cache_retention_interval=rng.choice([0, 0, None, w.block_size * rng.randint(1, 8)]))


def _mamba_workload(seed: int, w: Workload) -> Workload:
    """The full-attention workload's knobs with a Mamba group in align mode, and prompts reworked
    so that Mamba hits and misses both happen: a Mamba state is cached only at a block boundary
    a request's chunk ended on (with retention 0: only its prompt's last one, or a shared
    prefix's end), so requests resend an earlier prompt, extend it, or share a prefix of it cut
    at any length (a cut between two cached states gives full attention a hit and Mamba none)."""
    rng = random.Random(f"mamba-{seed}")
    alphabet = rng.choice([2, 3, 8, 50])
    prompts: list[tuple[int, ...]] = []
    for _ in w.requests:
        own = tuple(rng.randrange(alphabet) + 1 for _ in range(rng.randint(1, 120)))
        if prompts and rng.random() < 0.75:
            earlier = rng.choice(prompts)
            cut = rng.choice([len(earlier), len(earlier) - 1, rng.randint(0, len(earlier)),
                              len(earlier) // w.block_size * w.block_size])
            own = earlier[:cut] + (() if rng.random() < 0.2 and cut > 0 else own)
        prompts.append(own[:300])
    requests = tuple(replace(r, prompt=p) for r, p in zip(w.requests, prompts))
    longest = max(len(r.prompt) + r.max_tokens for r in requests)
    max_model_len = longest + rng.randint(0, 16)
    budget = w.max_num_batched_tokens  # without chunking, vLLM's budget must hold max_model_len tokens
    if not w.enable_chunked_prefill:
        budget = max(max_model_len + rng.randint(0, 256), w.max_num_seqs)
    need_one = -(-longest // w.block_size) + 2  # full attention's blocks, and two Mamba states at most
    num_blocks = 1 + need_one + rng.choice([0, rng.randint(0, need_one), rng.randint(0, 4 * need_one)])
    return replace(w, requests=requests, max_model_len=max_model_len, max_num_batched_tokens=budget,
                   num_blocks=num_blocks, mamba_align=True,
                   prefix_cache_retention_interval=rng.choice([0, 0, None, w.block_size * rng.randint(1, 8)]))


def _full_attention_workload(seed: int) -> Workload:
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    alphabet = rng.choice([1, 2, 3, 8])
    shared = [rng.randrange(alphabet) + 1 for _ in range(rng.randint(0, 200))]
    reqs = []
    for i in range(rng.randint(2, 12)):
        reqs.append(OracleRequest(f"r{i}", _prompt(rng, shared, alphabet), rng.randint(1, 40), rng.randint(0, 30)))
    longest = max(len(r.prompt) + r.max_tokens for r in reqs)
    max_model_len = longest + rng.randint(0, 16)
    chunked = rng.random() < 0.8
    max_num_seqs = rng.randint(1, 12)
    if chunked:
        budget = rng.choice([rng.randint(1, 32), rng.randint(32, 512)])
    else:  # vLLM requires a budget that holds a whole max_model_len sequence without chunking
        budget = max_model_len + rng.randint(0, 256)
    budget = max(budget, max_num_seqs)  # vLLM: max_num_batched_tokens >= max_num_seqs
    need_one = -(-longest // block_size)  # the largest request must fit on its own
    num_blocks = 1 + need_one + rng.choice([0, rng.randint(0, need_one), rng.randint(0, 4 * need_one)])
    return Workload(block_size, num_blocks, budget, max_num_seqs, max_model_len, rng.random() < 0.85, chunked,
                    rng.random() < 0.8, tuple(reqs))


def shrink_candidates(w: Workload):
    """Smaller feasible workloads to try, roughly most-shrinking first (greedy delta debugging)."""
    return (c for c in _smaller(w) if c.is_feasible())


def _smaller(w: Workload):
    reqs = list(w.requests)
    for i in range(len(reqs)):
        if len(reqs) > 1:
            yield replace(w, requests=tuple(reqs[:i] + reqs[i + 1:]))
    for i, r in enumerate(reqs):
        for cut in (len(r.prompt) // 2, len(r.prompt) - 1):
            if 1 <= cut < len(r.prompt):
                yield replace(w, requests=(*reqs[:i], replace(r, prompt=r.prompt[:cut]), *reqs[i + 1:]))
        if r.max_tokens > 1:
            for mt in (1, r.max_tokens // 2):
                yield replace(w, requests=(*reqs[:i], replace(r, max_tokens=mt), *reqs[i + 1:]))
        if r.arrival_step > 0:
            yield replace(w, requests=(*reqs[:i], replace(r, arrival_step=0), *reqs[i + 1:]))
    if w.num_blocks > 2:
        yield replace(w, num_blocks=w.num_blocks - 1)
