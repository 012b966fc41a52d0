"""vLLM 0.32's own v1 Scheduler + KVCacheManager + BlockPool without weights or workers
(explorer.drivers.vllm.bare), stepped with ModelRunnerOutputs that carry the workload's tokens.
With `async_scheduling`, vLLM's AsyncScheduler, scheduled and updated separately as its engine
core's batch queue does."""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import ModelRunnerOutput

from explorer.drivers.vllm.bare import bare_request, bare_scheduler, sampled_output

from .workloads import OracleRequest, Workload


class VllmScheduler:
    name = "vllm"

    def __init__(self, w: Workload, scheduler_cls: type | None = None, async_scheduling: bool = False) -> None:
        """`scheduler_cls`: vLLM's Scheduler or a subclass of it (kvscope's live recorder; None:
        vLLM's Scheduler, or its AsyncScheduler with `async_scheduling`); `async_scheduling`: the
        config says so, as a GPU server's does (the caller then schedules a step before it
        updates the previous one)."""
        self.w = w
        self.async_ = async_scheduling
        self.scheduler = bare_scheduler(block_size=w.block_size, num_blocks=w.num_blocks,
                                        max_model_len=w.max_model_len, max_num_batched_tokens=w.max_num_batched_tokens,
                                        max_num_seqs=w.max_num_seqs, enable_chunked_prefill=w.enable_chunked_prefill,
                                        enable_prefix_caching=w.enable_prefix_caching,
                                        scheduler_reserve_full_isl=w.scheduler_reserve_full_isl,
                                        scheduler_cls=scheduler_cls, async_scheduling=async_scheduling,
                                        sliding_window=w.sliding_window,
                                        kv_cache_groups="full,mamba" if w.mamba_align else w.vllm_group_order,
                                        prefix_cache_retention_interval=w.prefix_cache_retention_interval)
        self.block_pool = self.scheduler.kv_cache_manager.block_pool
        self.requests_seen: dict = {}  # every request added (vLLM drops finished ones)
        self.sampling: dict[int, list[str]] = {}  # id(SchedulerOutput) -> its rows that sample

    def add(self, r: OracleRequest) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        req = self.requests_seen[r.request_id] = bare_request(r.request_id, list(r.prompt), params,
                                                              self.w.block_size)
        self.scheduler.add_request(req)

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def num_waiting_for_stale_outputs(self) -> int:
        """Preempted requests that vLLM will not readmit yet: outputs of their steps from before
        the preemption are still in flight (only ever with more than two steps in flight)."""
        return sum(1 for r in self.scheduler.waiting if r.num_stale_output_tokens and not r.drop_stale_output)

    def step(self) -> dict:
        sch = self.scheduler
        out = sch.schedule()
        record = self._record(out)
        runner_out, sampled = sampled_output(sch, out, self.w.sampled_token)
        outputs = sch.update_from_output(out, runner_out)
        finished = [o.request_id for eco in outputs.values() for o in eco.outputs if o.finish_reason is not None]
        return record | {"finished": sorted(finished), "sampled": sampled}

    def _record(self, out) -> dict:
        new = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        before = new | dict(zip(cached.req_ids, cached.num_computed_tokens))
        return {"scheduled": dict(out.num_scheduled_tokens),
                "computed_before": {r: before[r] for r in out.num_scheduled_tokens},
                "preempted": sorted(out.preempted_req_ids or ())}

    # -- async scheduling: a step's schedule and its update are separate calls -----------------------
    def schedule(self):
        sch = self.scheduler
        out = sch.schedule()
        record = self._record(out)
        # Which rows sample is the model runner's to know when it runs the step: all but the
        # prefill chunks that leave the prompt unfinished (after this schedule, vLLM's
        # is_prefill_chunk). Deciding it at the update instead would sample for a chunk whose
        # successor was scheduled meanwhile, and not for a request preempted meanwhile.
        sampling = [r for r in out.num_scheduled_tokens if not sch.requests[r].is_prefill_chunk]
        self.sampling[id(out)] = sampling
        record["sampling"] = sorted(sampling)
        # Inputs past a request's known tokens: the outputs of its step in flight.
        record["placeholder_inputs"] = {
            r: k for r, n in out.num_scheduled_tokens.items()
            if (k := record["computed_before"][r] + n - sch.requests[r].num_tokens) > 0}
        return out, record

    def update(self, out) -> dict:
        sch = self.scheduler
        ids = list(out.num_scheduled_tokens)
        sampled = {}
        for rid in self.sampling.pop(id(out)):
            req = sch.requests.get(rid)
            if req is not None:  # None: it finished while the step was in flight (vLLM skips it)
                sampled[rid] = self.w.sampled_token(rid, len(req.output_token_ids))
        runner_out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                       sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in ids])
        outputs = sch.update_from_output(out, runner_out)
        finished = [o.request_id for eco in outputs.values() for o in eco.outputs if o.finish_reason is not None]
        return {"finished": sorted(finished), "sampled": sampled}

    def state(self) -> dict:
        sch, kv = self.scheduler, self.scheduler.kv_cache_manager
        return {"waiting": [r.request_id for r in sch.waiting], "running": [r.request_id for r in sch.running],
                "block_tables": {r.request_id: self._tables(kv.get_block_ids(r.request_id)) for r in sch.running},
                "num_computed_tokens": {r.request_id: r.num_computed_tokens for r in sch.running},
                "free_queue": [b.block_id for b in self.block_pool.free_block_queue.get_all_free_blocks()],
                "cached_blocks": [b.block_id for b in self.block_pool.blocks if b.block_hash is not None]}

    def _tables(self, per_group: tuple) -> list[int] | list[list[int]]:
        """One group: its block ids; several: every group's (the null block is 0)."""
        if self.w.sliding_window is None and not self.w.mamba_align:
            return list(per_group[0])
        return [list(ids) for ids in per_group]

    def async_state(self) -> dict:
        sch = self.scheduler
        return {"placeholders": {r.request_id: r.num_output_placeholders for r in sch.running},
                "num_output_tokens": {r.request_id: len(r.output_token_ids) for r in (*sch.waiting, *sch.running)}}
