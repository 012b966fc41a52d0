"""Async scheduling, vLLM's default on a GPU: step N+1 is scheduled while step N still runs,
before N's sampled tokens are known, so the GPU never waits for the scheduler.

The caller keeps steps in flight (two in vLLM's engine core batch queue): it may call
`schedule()` again before `update_from_output` of the step before, and it updates every step,
empty ones too, in the order they were scheduled. Against the synchronous Scheduler, and as
vLLM 0.32's AsyncScheduler decides:
- a step counts as computed when it is scheduled, so the next `schedule()` continues after it;
- a step that samples leaves an output placeholder on its request: the next step's decode
  input is that placeholder (`ScheduledRequest.num_placeholder_inputs`), and the sampled token
  replaces it when the output lands;
- blocks are cached only up to the tokens both known and computed (computed - placeholders);
- a request whose step in flight already samples its last token gets no further step;
- preemption drops the placeholders. The outputs of its steps still in flight ("stale") land
  all the same: their tokens are appended, but touch no placeholder and cache no block, and
  the request is not readmitted until they all have landed (others are admitted past it);
- a request finished or aborted while its step was in flight drops that step's output.
"""
from __future__ import annotations

from collections import deque

from ..config import EngineConfig
from ..request import Request, RequestStatus
from .kv_cache_manager import KVCacheManager
from .scheduler import Scheduler, SchedulerOutput


class AsyncScheduler(Scheduler):
    """The Scheduler for a caller that schedules the next step before updating the previous one."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int) -> None:
        super().__init__(config, kv, max_model_len)
        self._in_flight: deque[SchedulerOutput] = deque()  # scheduled, not updated yet; oldest first
        # request id -> how many of its steps in flight were scheduled before its latest preemption
        self._stale: dict[str, int] = {}

    @property
    def num_steps_in_flight(self) -> int:
        """Steps scheduled and not updated yet (at most 2 in vLLM's batch queue)."""
        return len(self._in_flight)

    # -- scheduling -----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self.config.scheduling_policy != "unified":  # a live knob: checked at every step
            raise ValueError("async scheduling runs vLLM's 'unified' policy only, "
                             f"not {self.config.scheduling_policy!r}")
        out = super().schedule()
        for s in out.scheduled:
            req = s.request
            # Inputs past its known tokens are the outputs of the step in flight.
            s.num_placeholder_inputs = max(0, s.num_computed_before + s.num_tokens - req.num_tokens)
            req.num_computed_tokens += s.num_tokens
            req.num_in_flight_tokens += s.num_tokens  # a sliding window frees none of them yet
            req.last_scheduled = (s.num_computed_before, req.num_computed_tokens)
            if s.is_prefill:
                req.num_prefill_chunks += 1
            if s.sample:
                req.num_output_placeholders += 1
        self._in_flight.append(out)
        return out

    def _schedule_running(self, out: SchedulerOutput, candidates: list[Request], budget: int) -> int:
        # Skipped ones stay running, and so may still be preempted for the others.
        going_on = [r for r in candidates if not self._ends_in_flight(r)]
        return super()._schedule_running(out, going_on, budget)

    def _ends_in_flight(self, req: Request) -> bool:
        """Its step in flight samples its last token: by max_tokens, or max_model_len leaves no
        position for another. `num_computed_tokens + 2 - placeholders` is its length once its
        oldest output in flight lands (vLLM counts that one only: under speculative decoding the
        others may be rejected drafts)."""
        if not req.num_output_placeholders:
            return False
        length_after_landing = req.num_computed_tokens + 2 - req.num_output_placeholders
        return (length_after_landing >= req.num_prompt_tokens + req.params.max_tokens
                or req.num_computed_tokens + 1 >= self.max_model_len)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, allow_chunk: bool,
                          chunk_only_first: bool = False) -> int:
        # A preempted request with stale outputs in flight waits for them: resumed now, it would
        # sample again a position whose token they are about to deliver. vLLM skips it for this
        # step, so the requests behind it may be admitted, and it keeps its place in the queue.
        held = {id(r) for r in self.waiting if self._stale.get(r.request_id)}
        if not held:
            return super()._schedule_waiting(out, budget, allow_chunk, chunk_only_first)
        queue = list(self.waiting)
        self.waiting.clear()
        self.waiting.extend(r for r in queue if id(r) not in held)
        budget = super()._schedule_waiting(out, budget, allow_chunk, chunk_only_first)
        self.waiting.clear()
        self.waiting.extend(r for r in queue if r.status != RequestStatus.RUNNING)
        return budget

    def finish(self, req: Request, reason: str) -> None:
        super().finish(req, reason)
        # Its steps still in flight will drop their outputs: none of them is pending any more
        # (vLLM leaves the count on the request it forgets; no decision reads it again).
        req.num_output_placeholders = 0

    def _preempt(self, req: Request) -> None:
        super()._preempt(req)
        req.num_output_placeholders = 0  # it resumes from its known tokens; no step of it is ahead
        stale = sum(s.request is req for o in self._in_flight for s in o.scheduled)
        if stale:
            self._stale[req.request_id] = stale

    # -- after the forward -----------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int],
                           now_wall: float, now_engine: float) -> list[str]:
        """Land the oldest step in flight: append its sampled tokens (`sampled`: request id ->
        token; a request finished since may be left out) in place of their placeholders and
        finish requests that stop; returns the finished ids. Its tokens were counted as
        computed when it was scheduled."""
        if not self._in_flight or out is not self._in_flight[0]:
            raise ValueError("update_from_output takes the steps in the order schedule() made them")
        self._in_flight.popleft()
        finished = []
        for s in out.scheduled:
            req = s.request
            req.num_in_flight_tokens -= s.num_tokens
            stale = self._land_stale(req.request_id)
            if s.is_prefill:
                self.num_computed_prompt_tokens += s.num_tokens
            # A request finished or aborted since the step was scheduled drops its token (vLLM's too).
            if s.sample and not req.is_finished and self._land_token(req, sampled[req.request_id], stale,
                                                                     now_wall, now_engine):
                finished.append(req.request_id)
        return finished

    def _land_token(self, req: Request, token: int, stale: bool, now_wall: float, now_engine: float) -> bool:
        """Append a sampled token in place of its placeholder; True if it finishes the request.
        A stale token (its step was in flight when the request was preempted) is kept as the
        request's next output all the same, but it has no placeholder, and no blocks to cache."""
        req.append_output(token)
        if not stale:
            req.num_output_placeholders -= 1
            self._cache_landed(req)
        return self._count_token_and_stop(req, now_wall, now_engine)

    def _cache_landed(self, req: Request) -> None:
        """Cache the blocks now both known and computed. The landed token's own KV is computed by
        the step that takes it as input (already in flight, or the next), or never if the token
        stops the request, so it stays out."""
        self.kv.cache_blocks(req, req.num_computed_tokens - req.num_output_placeholders)

    def _land_stale(self, request_id: str) -> bool:
        """Whether this landing output of the request is stale (scheduled before its preemption)."""
        if not self._stale:   # nothing preempted with a step in flight: the common case
            return False
        left = self._stale.pop(request_id, 0)
        if left > 1:
            self._stale[request_id] = left - 1
        return left > 0
