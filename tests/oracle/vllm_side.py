"""vLLM 0.32's own v1 Scheduler + KVCacheManager + BlockPool without weights or workers
(explorer.drivers.vllm.bare), stepped with ModelRunnerOutputs that carry the workload's tokens."""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from explorer.drivers.vllm.bare import bare_request, bare_scheduler, sampled_output  # noqa: E402

from .workloads import OracleRequest, Workload  # noqa: E402


class VllmScheduler:
    name = "vllm"

    def __init__(self, w: Workload, scheduler_cls: type = Scheduler, async_scheduling: bool = False) -> None:
        """`scheduler_cls`: vLLM's Scheduler or a subclass of it (kvscope's live recorder);
        `async_scheduling`: the config selects vLLM's AsyncScheduler (the caller then schedules
        a step before it updates the previous one)."""
        self.w = w
        self.scheduler = bare_scheduler(block_size=w.block_size, num_blocks=w.num_blocks,
                                        max_model_len=w.max_model_len, max_num_batched_tokens=w.max_num_batched_tokens,
                                        max_num_seqs=w.max_num_seqs, enable_chunked_prefill=w.enable_chunked_prefill,
                                        enable_prefix_caching=w.enable_prefix_caching,
                                        scheduler_reserve_full_isl=w.scheduler_reserve_full_isl,
                                        scheduler_cls=scheduler_cls, async_scheduling=async_scheduling)
        self.block_pool = self.scheduler.kv_cache_manager.block_pool
        self.requests_seen: dict = {}  # every request added (vLLM drops finished ones)

    def add(self, r: OracleRequest) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        req = self.requests_seen[r.request_id] = bare_request(r.request_id, r.prompt, params, self.w.block_size)
        self.scheduler.add_request(req)

    def step(self) -> dict:
        sch = self.scheduler
        out = sch.schedule()
        new = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        before = new | dict(zip(cached.req_ids, cached.num_computed_tokens))
        ids = list(out.num_scheduled_tokens)
        runner_out, sampled = sampled_output(sch, out, self.w.sampled_token)
        outputs = sch.update_from_output(out, runner_out)
        finished = [o.request_id for eco in outputs.values() for o in eco.outputs if o.finish_reason is not None]
        return {"scheduled": dict(out.num_scheduled_tokens), "computed_before": {r: before[r] for r in ids},
                "preempted": sorted(out.preempted_req_ids or ()), "finished": sorted(finished), "sampled": sampled}

    def state(self) -> dict:
        sch, kv = self.scheduler, self.scheduler.kv_cache_manager
        return {"waiting": [r.request_id for r in sch.waiting], "running": [r.request_id for r in sch.running],
                "block_tables": {r.request_id: list(kv.get_block_ids(r.request_id)[0]) for r in sch.running},
                "num_computed_tokens": {r.request_id: r.num_computed_tokens for r in sch.running},
                "free_queue": [b.block_id for b in self.block_pool.free_block_queue.get_all_free_blocks()],
                "cached_blocks": [b.block_id for b in self.block_pool.blocks if b.block_hash is not None]}
