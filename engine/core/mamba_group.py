"""A Mamba group beside full attention, as vLLM 0.32 runs it in "align" mode (mamba_cache_mode
'align', no speculative decoding, the hash block size equal to the block size).

A Mamba layer carries one state per request, updated token by token. Align mode keeps the state
after the last token of each step in the block of that token's position, so a state at a block's
end can be cached under that block's hash and a later request sharing those tokens resumes from
it. Three rules follow, each enforced here:
- the KV cache side (kv_cache_groups.MambaSpec, MambaStates): a hit is the cached state furthest
  to the right (one block; full attention then keeps as many blocks); a request holds the state it
  started from and the one it writes, the positions before them null; which states are cached
  follows vLLM's prefix_cache_retention_interval (0: only where a hit can resume);
- the scheduler side (`aligned_chunk_tokens`, used by mamba_scheduler.py's schedulers): a prefill
  chunk must end on a block boundary, or at the last block boundary of the request's tokens
  (the prompt's state checkpoint), or at a shared prefix's end, or at the prompt's end; and an
  admission whose hit is a state cached in this same step waits (this step writes that state).
"""
from __future__ import annotations

from ..request import Request
from .block_pool import NULL_BLOCK_ID, BlockPool
from .kv_cache_groups import cdiv


class MambaStates:
    """A Mamba group's bookkeeping (vLLM's MambaManager in align mode, without speculative blocks)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.last_state: dict[str, int] = {}  # request id -> index of the state the next one copies
        self.retired: dict[str, int] = {}  # request id -> its blocks before this index are freed or null
        self.cached_this_step: set[int] = set()  # a hit on these waits: this step's forward writes them
        self.num_freed = 0  # state blocks freed because a later state replaced them

    def blocks_to_allocate(self, table: list[int], hits: list[int], num_tokens: int, block_size: int) -> int:
        """Free blocks needed to hold `num_tokens`: one new state block at most (not clamped at 0),
        plus a free cached hit leaving the queue; more than the pool holds for a hit cached in this
        step, so that admission waits a step."""
        if hits and self.pool.blocks[hits[-1]].block_hash in self.cached_this_step:
            return self.pool.num_blocks + 1
        new = cdiv(num_tokens, block_size) - len(hits) - len(table)
        return min(new, 1) + sum(1 for b in hits if b != NULL_BLOCK_ID and self.pool.blocks[b].ref_count == 0)

    def allocate(self, request_id: str, table: list[int], num_tokens: int, block_size: int) -> list[int]:
        """The state block of the chunk ending at `num_tokens`, null blocks before it; the last
        block held so far is the state it starts from."""
        required, new = cdiv(num_tokens, block_size), []
        if required > len(table):
            if table:
                self.last_state[request_id] = len(table) - 1
            table.extend([NULL_BLOCK_ID] * (required - 1 - len(table)))
            new = self.pool.allocate(required - len(table))
            table.extend(new)
        return new

    def remove_skipped(self, request_id: str, table: list[int], num_done_tokens: int, block_size: int) -> None:
        """Free the states no step reads any more: every block wholly before the last done token
        (last first, past the null gaps), and the state the previous allocation started from."""
        first, last = self.retired.get(request_id, 0), min(max(0, num_done_tokens - 1) // block_size, len(table))
        if first < last:
            freed = [table[i] for i in range(last - 1, first - 1, -1) if table[i] != NULL_BLOCK_ID]
            table[first:last] = [NULL_BLOCK_ID] * (last - first)
            self._free(freed)
            self.retired[request_id] = last
        i = self.last_state.get(request_id)
        if i is not None and i < cdiv(num_done_tokens, block_size) - 1 and table[i] != NULL_BLOCK_ID:
            self._free([table[i]])
            table[i] = NULL_BLOCK_ID

    def recache_prompt_state(self, req: Request, table: list[int], num_full_blocks: int, group: int,
                             block_size: int) -> None:
        """vLLM re-keys the state at the prompt's last block boundary at every caching that ends in
        that state's block, while the request holds it: each such step, a hit on it waits."""
        i = num_full_blocks - 1
        if not 0 <= i < len(table) or table[i] == NULL_BLOCK_ID or \
                num_full_blocks != (req.num_prompt_tokens - 1) // block_size:
            return
        if self.pool.blocks[table[i]].block_hash is None:
            tokens = req.all_token_ids[i * block_size:(i + 1) * block_size]
            self.pool.register(table[i], req.block_hashes[i], tokens, group)
        self.cached_this_step.add(req.block_hashes[i])

    def _free(self, blocks: list[int]) -> None:
        self.pool.free(blocks)
        self.num_freed += len(blocks)

    def forget(self, request_id: str) -> None:
        self.last_state.pop(request_id, None)
        self.retired.pop(request_id, None)


def aligned_chunk_tokens(start: int, num_new: int, req: Request, block_size: int, max_prefill_tokens: int) -> int:
    """How many of `num_new` prefill tokens from position `start` a step may compute so that its
    last state lands where align mode can keep it (vLLM's Scheduler._mamba_block_aligned_split).
    0: no such chunk fits, the request waits. Decode steps are left as they are."""
    prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)  # a resumed request replays its outputs
    if start >= prefill_end:
        return num_new
    end = start + num_new
    if end < prefill_end:  # a chunk the budget cut ends on a block boundary, unless that is no progress
        aligned_end = end // block_size * block_size  # and a block is wider than any step could be
        if aligned_end > start or block_size <= max_prefill_tokens:
            end = aligned_end
    stops = [(req.num_tokens - 1) // block_size * block_size]  # the last state a resend can hit
    if start % block_size:
        stops.append((start // block_size + 1) * block_size)  # back onto a block boundary
    junction = req.shared_prefix_boundary  # where a prefix other requests share ends (floored to a block)
    if start < junction < end:
        stops.append(start + (junction - start) // block_size * block_size)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
