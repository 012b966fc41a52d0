"""Decides, each step, which requests run and with how many tokens.

Two policies:
- 'unified' (vLLM v1): one token budget; running requests first (a decode takes 1 token, an unfinished prefill
  continues with a chunk), then waiting requests first come first served. Prefill and decode mix in one step.
- 'prefill_first' (nano-vLLM): a step is all prefill (only its first request may be chunked)
  or, when nothing can be prefilled, all decode.
Out of blocks, the most recently admitted running request is preempted (recompute).
With `scheduler_reserve_full_isl` (vLLM 0.32's default), a waiting request is admitted only when blocks for its
whole known sequence fit the pool, not only its first chunk. `update_from_output` advances them after the forward.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..config import EngineConfig
from ..request import Request, RequestStatus
from .kv_cache_manager import KVCacheManager


@dataclass
class ScheduledRequest:
    """One request's share of a step: how many tokens, from which position, and why."""
    request: Request
    num_tokens: int
    num_computed_before: int
    num_cached_tokens: int  # prefix-cache hits taken when admitted in this step
    is_prefill: bool
    chunk_index: int | None  # index of this prefill chunk since admission; None for decode
    sample: bool             # this step computes all the request's known tokens: sample its logits
    num_placeholder_inputs: int = 0  # AsyncScheduler: inputs that a step in flight has yet to sample


@dataclass
class SchedulerOutput:
    """What `Scheduler.schedule` decided for one step (vLLM's SchedulerOutput, trimmed)."""
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    preempted_for: dict[str, str] = field(default_factory=dict)  # victim -> the request it freed blocks for
    new_requests: list[str] = field(default_factory=list)
    token_budget: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Owns the waiting / running / finished queues and the KV cache manager."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int) -> None:
        self.config, self.kv, self.max_model_len = config, kv, max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the preemption victim
        self.finished: list[Request] = []
        self.num_preemptions = 0
        self.num_generated_tokens = 0
        self.num_computed_prompt_tokens = 0  # prompt (and resumed) tokens run through the model

    # -- queue changes --------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def finish(self, req: Request, reason: str) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        req.status, req.finish_reason = RequestStatus.FINISHED, reason
        self.finished.append(req)

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling -----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(token_budget=self.config.max_num_batched_tokens)
        if self.config.scheduling_policy == "prefill_first":
            self._schedule_prefill_first(out)
        else:
            budget = self._schedule_running(out, self.running, out.token_budget)
            if not out.preempted:
                self._schedule_waiting(out, budget, allow_chunk=self.config.enable_chunked_prefill)
        return out

    def _schedule_running(self, out: SchedulerOutput, candidates: list[Request], budget: int) -> int:
        """Give running requests their next tokens, preempting the newest when blocks run out."""
        for req in list(candidates):
            if budget <= 0:
                break
            if req.status != RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new = self._chunk_size(req, req.num_computed_tokens, req.num_tokens_with_placeholders
                                       - req.num_computed_tokens, budget, self.config.enable_chunked_prefill)
            if not num_new:
                continue
            while (new_blocks := self.kv.allocate_slots(req, num_new)) is None:
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                out.preempted_for[victim.request_id] = req.request_id
                if victim is req:
                    break
            if new_blocks is None:
                break
            out.scheduled.append(self._scheduled(req, num_new, cached=0))
            budget -= num_new
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, allow_chunk: bool,
                          chunk_only_first: bool = False) -> int:
        """Admit waiting requests in order while budget, max_num_seqs and the pool allow.
        The first one that does not fit stops admission (no skipping). A prefix hit may be
        on blocks that a request scheduled earlier in this very step is computing."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            hits, num_cached = self.kv.get_computed_blocks(req)
            # A resumed request whose prompt + outputs outgrew the whole budget must be chunked
            # even with chunking off, or it could never run again.
            may_chunk = (allow_chunk and not (chunk_only_first and out.scheduled)) or \
                req.num_tokens - num_cached > self.config.max_num_batched_tokens
            if not (num_new := self._chunk_size(req, num_cached, req.num_tokens - num_cached, budget, may_chunk)):
                break
            if self.kv.allocate_slots(req, num_new, hits,
                                      full_sequence_must_fit=self.config.scheduler_reserve_full_isl) is None:
                break
            self.kv.record_lookup(req.num_tokens, num_cached)
            self.waiting.popleft()
            self.running.append(req)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_cached
            req.num_cached_tokens = num_cached
            req.num_prefill_chunks = 0
            out.scheduled.append(self._scheduled(req, num_new, cached=num_cached))
            out.new_requests.append(req.request_id)
            budget -= num_new
        return budget

    def _chunk_size(self, req: Request, start: int, num_new: int, budget: int, may_chunk: bool) -> int:
        """How many of `num_new` tokens from position `start` this step computes (0: none)."""
        return num_new if num_new <= budget else budget if may_chunk else 0

    def _schedule_prefill_first(self, out: SchedulerOutput) -> None:
        budget = out.token_budget
        # A request whose prefill was chunked in an earlier step continues first.
        partial = [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1]
        for req in partial[:1]:
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if self.kv.allocate_slots(req, num_new) is not None:
                out.scheduled.append(self._scheduled(req, num_new, cached=0))
                budget -= num_new
        self._schedule_waiting(out, budget, allow_chunk=self.config.enable_chunked_prefill, chunk_only_first=True)
        if out.scheduled:
            return
        decoding = [r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
        self._schedule_running(out, decoding, out.token_budget)

    # -- after the forward -----------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int],
                           now_wall: float, now_engine: float) -> list[str]:
        """Advance computed counts, append the sampled tokens (`sampled`: request id -> token) and
        finish requests that stop; returns the finished ids. Their blocks were cached at allocation."""
        finished = []
        for s in out.scheduled:
            req = s.request
            req.num_computed_tokens += s.num_tokens
            req.last_scheduled = (s.num_computed_before, req.num_computed_tokens)
            if s.is_prefill:
                req.num_prefill_chunks += 1
                self.num_computed_prompt_tokens += s.num_tokens
            if s.sample:
                req.append_output(sampled[req.request_id])
                if self._count_token_and_stop(req, now_wall, now_engine):
                    finished.append(req.request_id)
        return finished

    def _count_token_and_stop(self, req: Request, now_wall: float, now_engine: float) -> bool:  # True: finished
        self.num_generated_tokens += 1
        req.metrics.token(now_wall, now_engine)
        if reason := req.check_stop(self.max_model_len):
            self.finish(req, reason)
            req.metrics.record("finished_time", now_wall, now_engine)
        return reason is not None

    @staticmethod
    def _scheduled(req: Request, num_new: int, cached: int) -> ScheduledRequest:
        before, planned = req.num_computed_tokens, req.num_tokens_with_placeholders
        is_decode = num_new == 1 and before == planned - 1 and before >= req.num_prompt_tokens
        return ScheduledRequest(req, num_new, before, cached, not is_decode,
                                None if is_decode else req.num_prefill_chunks, sample=before + num_new == planned)
