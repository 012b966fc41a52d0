"""kvscope's Scheduler + KVCacheManager + BlockPool, stepped without a model: the same objects
and the same post-step update (`Scheduler.update_from_output`) that LLMEngine.step() runs.
With `async_scheduling`, kvscope's AsyncScheduler, scheduled and updated separately."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.core.async_scheduler import AsyncScheduler
from engine.core.kv_cache_groups import FullAttentionSpec, KVCacheSpec, MambaSpec, SlidingWindowSpec
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.mamba_scheduler import MambaAlignedAsyncScheduler, MambaAlignedScheduler
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.request import Request
from engine.sampling_params import SamplingParams

from .workloads import OracleRequest, Workload


class KvscopeScheduler:
    name = "kvscope"

    def __init__(self, w: Workload, async_scheduling: bool = False) -> None:
        self.w = w
        config = EngineConfig(block_size=w.block_size, num_kv_blocks=w.num_blocks,
                              max_num_batched_tokens=w.max_num_batched_tokens, max_num_seqs=w.max_num_seqs,
                              max_model_len=w.max_model_len, enable_prefix_caching=w.enable_prefix_caching,
                              enable_chunked_prefill=w.enable_chunked_prefill,
                              scheduler_reserve_full_isl=w.scheduler_reserve_full_isl)
        groups: list[KVCacheSpec] | None = None
        if w.sliding_window is not None:
            groups = [FullAttentionSpec(), SlidingWindowSpec(w.sliding_window)]
        elif w.mamba_align:
            groups = [FullAttentionSpec(), MambaSpec()]
        # vLLM reserves for one step in flight per concurrent batch (two under async scheduling).
        in_flight = w.max_num_batched_tokens * (2 if async_scheduling else 1)
        self.kv = KVCacheManager(w.num_blocks, w.block_size, w.enable_prefix_caching, w.max_model_len,
                                 kv_cache_groups=groups, max_in_flight_tokens=in_flight,
                                 prefix_cache_retention_interval=w.prefix_cache_retention_interval)
        classes = (MambaAlignedScheduler, MambaAlignedAsyncScheduler) if w.mamba_align else (Scheduler, AsyncScheduler)
        self.scheduler = classes[1 if async_scheduling else 0](config, self.kv, w.max_model_len)
        self.async_ = async_scheduling
        self.requests: dict[str, Request] = {}
        self.hits_cut = 0

    def add(self, r: OracleRequest) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        req = self.requests[r.request_id] = Request(r.request_id, list(r.prompt), params, eos_token_id=None)
        self.scheduler.add(req)

    def step(self) -> dict:
        out, record = self.schedule()
        return record | self.update(out)

    def schedule(self) -> tuple[SchedulerOutput, dict]:
        out = self.scheduler.schedule()
        # The block events of the schedule, where allocations cache blocks and admissions hit them
        # (a synchronous update adds none of either; an async one caches what landed tokens complete).
        self.events = self.kv.pool.take_events()
        # An admission whose full-attention hit was longer than the one all groups share.
        self.hits_cut += sum(1 for s in out.scheduled if s.request.request_id in out.new_requests
                             and s.request.shared_prefix_boundary > s.num_computed_before)
        record = {"scheduled": {s.request.request_id: s.num_tokens for s in out.scheduled},
                  "computed_before": {s.request.request_id: s.num_computed_before for s in out.scheduled},
                  "preempted": sorted(out.preempted)}
        if self.async_:
            record["sampling"] = sorted(s.request.request_id for s in out.scheduled if s.sample)
            record["placeholder_inputs"] = {s.request.request_id: s.num_placeholder_inputs for s in out.scheduled
                                            if s.num_placeholder_inputs}
        return out, record

    def update(self, out: SchedulerOutput) -> dict:
        # As a model runner does: a token for every row that samples, also for a request that
        # finished while the step was in flight (async), whose token the scheduler must drop.
        tokens = {s.request.request_id: self.w.sampled_token(s.request.request_id, len(s.request.output_token_ids))
                  for s in out.scheduled if s.sample}
        alive = {rid: t for rid, t in tokens.items() if not self.requests[rid].is_finished}
        finished = self.scheduler.update_from_output(out, tokens, 0.0, 0.0)
        self.kv.pool.take_events()  # what an async update caches is no schedule's same-step hit
        return {"finished": sorted(finished), "sampled": alive}

    def state(self) -> dict:
        sch, pool = self.scheduler, self.kv.pool
        return {"waiting": [r.request_id for r in sch.waiting], "running": [r.request_id for r in sch.running],
                "block_tables": {r.request_id: self._tables(r) for r in sch.running},
                "num_computed_tokens": {r.request_id: r.num_computed_tokens for r in sch.running},
                "free_queue": list(pool.free_queue),
                "cached_blocks": [b.block_id for b in pool.blocks if b.block_hash is not None]}

    def _tables(self, r: Request) -> list[int] | list[list[int]]:
        """One group: its block table; several: every group's (vLLM's get_block_ids)."""
        if self.kv.hybrid is None:
            return list(r.block_table)
        return [list(t) for t in self.kv.hybrid.tables(r)]

    @property
    def num_blocks_left_window(self) -> int | None:
        if self.w.sliding_window is None or self.kv.hybrid is None:
            return None
        return self.kv.hybrid.num_blocks_left_window

    @property
    def num_hits_cut_by_mamba(self) -> int | None:
        return self.hits_cut if self.w.mamba_align else None

    @property
    def num_mamba_states_freed(self) -> int | None:
        return self.kv.hybrid.mamba.num_freed if self.w.mamba_align and self.kv.hybrid is not None else None

    def async_state(self) -> dict:
        """What async scheduling adds: each running request's placeholders, and every live
        request's outputs (stale outputs land on preempted ones)."""
        sch = self.scheduler
        return {"placeholders": {r.request_id: r.num_output_placeholders for r in sch.running},
                "num_output_tokens": {r.request_id: len(r.output_token_ids) for r in (*sch.waiting, *sch.running)}}
