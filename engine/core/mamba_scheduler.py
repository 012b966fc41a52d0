"""kvscope's schedulers for a KV cache manager with a Mamba group in vLLM's align mode: every
prefill chunk cut where align mode keeps a state (mamba_group.aligned_chunk_tokens, through the
Scheduler's `_chunk_size`), and the states cached in a step forgotten when the next is scheduled."""
from __future__ import annotations

from ..request import Request, RequestStatus
from .async_scheduler import AsyncScheduler
from .kv_cache_groups import MambaSpec
from .mamba_group import aligned_chunk_tokens
from .scheduler import Scheduler, SchedulerOutput


class MambaAlignedScheduler(Scheduler):
    """The Scheduler with each chunk ending where a Mamba group in align mode keeps its state."""

    def schedule(self) -> SchedulerOutput:
        if self.config.scheduling_policy != "unified" or self.kv.hybrid is None or not any(
                isinstance(s, MambaSpec) for s in self.kv.hybrid.specs):
            raise ValueError("Mamba align mode runs vLLM's 'unified' policy with a Mamba KV cache group")
        self.kv.hybrid.mamba.cached_this_step.clear()
        return super().schedule()

    def _chunk_size(self, req: Request, start: int, num_new: int, budget: int, may_chunk: bool) -> int:
        # vLLM chunks a running request's prompt tail (which the alignment leaves) whether or
        # not chunked prefill is on; every chunk then ends where align mode keeps a state.
        n = super()._chunk_size(req, start, num_new, budget, may_chunk or req.status == RequestStatus.RUNNING)
        return aligned_chunk_tokens(start, n, req, self.kv.block_size, self.config.max_num_batched_tokens) if n else 0


class MambaAlignedAsyncScheduler(AsyncScheduler, MambaAlignedScheduler):
    """AsyncScheduler's rules over MambaAlignedScheduler's chunks."""
