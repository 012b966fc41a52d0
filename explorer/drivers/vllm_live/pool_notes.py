"""What vLLM's block pool does, noted on the scheduler thread for the recorder, at the cost
of a few appends per call: the server does not wait for kvscope.

`PoolNotes` wraps a few methods of one live BlockPool (instance attributes only: the class
and every other pool are untouched) and notes:
- per step (`events`, the lists of the step being scheduled or updated): the block ids
  vLLM allocated, hit, freed, hashed and evicted, in the order it did (a hit on a block
  hashed earlier in the same step is also a same-step hit);
- since the recorder last read it (`take()`): every block whose refcount or hash changed
  (`dirty`), and each block vLLM hashed with the request and table index that filled it
  (`cached`): the recorder reads the tokens from its own copy of the request, later, on its
  own thread, never here.
"""
from __future__ import annotations

from typing import Any

from ..vllm.capture import BLOCK_EVENTS


def new_events() -> dict[str, list[int]]:
    return {k: [] for k in BLOCK_EVENTS}


class PoolNotes:
    """The recorder's hooks on one vLLM BlockPool (see the module doc)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.events = new_events()          # the step being scheduled or updated
        self.dirty: set[int] = set()
        self.cached: list[tuple[int, Any, int]] = []   # (block id, vLLM Request, index in its table)
        self.cleared = False                # vLLM reset its prefix cache: every block changed
        self._hashed_now: set[int] = set()  # hashed in this step (same-step hits)
        self._originals: list[str] = []
        for name in ("get_new_blocks", "touch", "free_blocks", "_insert_block_hash", "_maybe_evict_cached_block",
                     "cache_full_blocks", "unpin_blocks", "reset_prefix_cache"):
            if hasattr(pool, name):
                self._wrap(name)

    def begin(self, events: dict[str, list[int]]) -> None:
        """Events from now on go to `events` (a step's lists)."""
        self.events = events
        self._hashed_now = set()

    def take(self) -> tuple[list[int], list[tuple[int, Any, int]], bool]:
        """The blocks changed and hashed since the last take, and whether the cache was reset."""
        dirty, cached, cleared = sorted(self.dirty), self.cached, self.cleared
        self.dirty, self.cached, self.cleared = set(), [], False
        return dirty, cached, cleared

    def close(self) -> None:
        for name in self._originals:
            self.pool.__dict__.pop(name, None)
        self._originals.clear()

    def _wrap(self, name: str) -> None:
        original = getattr(self.pool, name)
        hook = getattr(self, "_" + name.lstrip("_"))

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return hook(original, *args, **kwargs)

        setattr(self.pool, name, wrapper)
        self._originals.append(name)

    # -- the hooks ----------------------------------------------------------------------------
    def _get_new_blocks(self, original, num_blocks: int) -> Any:
        blocks = original(num_blocks)
        ids = [b.block_id for b in blocks]
        self.events["allocated"] += ids
        self.dirty.update(ids)
        return blocks

    def _touch(self, original, blocks) -> Any:
        blocks = list(blocks)
        hits = [b.block_id for b in blocks if not b.is_null]
        self.events["hits"] += hits
        if self._hashed_now:
            self.events["same_step_hits"] += [b for b in hits if b in self._hashed_now]
        self.dirty.update(hits)
        return original(blocks)

    def _free_blocks(self, original, ordered_blocks) -> Any:
        blocks = list(ordered_blocks)  # vLLM passes a reversed() iterator: read it once
        result = original(blocks)
        pool = self.pool
        mine = [b for b in blocks if b.pool is None or b.pool is pool]
        self.dirty.update(b.block_id for b in mine)
        self.events["freed"] += [b.block_id for b in mine if b.ref_cnt == 0 and not b.is_null]
        return result

    def _unpin_blocks(self, original, blocks, *args: Any, **kwargs: Any) -> Any:
        blocks = list(blocks)
        self.dirty.update(b.block_id for b in blocks)
        return original(blocks, *args, **kwargs)

    def _insert_block_hash(self, original, key, block, *args: Any, **kwargs: Any) -> Any:
        result = original(key, block, *args, **kwargs)
        self.events["cached"].append(block.block_id)
        self._hashed_now.add(block.block_id)
        self.dirty.add(block.block_id)
        return result

    def _cache_full_blocks(self, original, request, blocks, num_cached_blocks: int, num_full_blocks: int,
                           *args: Any, **kwargs: Any) -> Any:
        result = original(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if not blk.is_null and blk.block_hash is not None:
                self.cached.append((blk.block_id, request, i))
        return result

    def _maybe_evict_cached_block(self, original, block) -> Any:
        evicted = original(block)
        if evicted:
            self.events["evicted"].append(block.block_id)
            self.dirty.add(block.block_id)
        return evicted

    def _reset_prefix_cache(self, original, *args: Any, **kwargs: Any) -> Any:
        done = original(*args, **kwargs)
        if done:
            self.cleared = True
        return done
