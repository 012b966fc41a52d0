"""kvscope's Scheduler + KVCacheManager + BlockPool, stepped without a model: the same objects
and the same post-step update (`Scheduler.update_from_output`) that LLMEngine.step() runs."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.core.kv_cache_manager import KVCacheManager
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler

from .workloads import OracleRequest, Workload


class KvscopeScheduler:
    name = "kvscope"

    def __init__(self, w: Workload) -> None:
        self.w = w
        config = EngineConfig(block_size=w.block_size, num_kv_blocks=w.num_blocks,
                              max_num_batched_tokens=w.max_num_batched_tokens, max_num_seqs=w.max_num_seqs,
                              max_model_len=w.max_model_len, enable_prefix_caching=w.enable_prefix_caching,
                              enable_chunked_prefill=w.enable_chunked_prefill,
                              scheduler_reserve_full_isl=w.scheduler_reserve_full_isl)
        self.kv = KVCacheManager(w.num_blocks, w.block_size, w.enable_prefix_caching, w.max_model_len)
        self.scheduler = Scheduler(config, self.kv, w.max_model_len)

    def add(self, r: OracleRequest) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        self.scheduler.add(Request(r.request_id, list(r.prompt), params, eos_token_id=None))

    def step(self) -> dict:
        out = self.scheduler.schedule()
        sampled = {s.request.request_id: self.w.sampled_token(s.request.request_id, len(s.request.output_token_ids))
                   for s in out.scheduled if s.sample}
        finished = self.scheduler.update_from_output(out, sampled, 0.0, 0.0)
        self.events = self.kv.pool.take_events()  # this step's block events, as the engine takes them
        return {"scheduled": {s.request.request_id: s.num_tokens for s in out.scheduled},
                "computed_before": {s.request.request_id: s.num_computed_before for s in out.scheduled},
                "preempted": sorted(out.preempted), "finished": sorted(finished), "sampled": sampled}

    def state(self) -> dict:
        sch, pool = self.scheduler, self.kv.pool
        return {"waiting": [r.request_id for r in sch.waiting], "running": [r.request_id for r in sch.running],
                "block_tables": {r.request_id: list(r.block_table) for r in sch.running},
                "num_computed_tokens": {r.request_id: r.num_computed_tokens for r in sch.running},
                "free_queue": list(pool.free_queue),
                "cached_blocks": [b.block_id for b in pool.blocks if b.block_hash is not None]}
