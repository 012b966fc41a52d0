"""What vLLM's block pool does, noted on vLLM's thread at the cost of a few appends per call:
the one observer of the pool for both of kvscope's vLLM drivers (the in-process StepCapture and
the live recorder), so the server does not wait for kvscope.

`PoolNotes` wraps a few methods of one live BlockPool (instance attributes only: the class
and every other pool are untouched), only those vLLM calls once per operation, never once per
block: a prefill of 128 blocks costs one call here, not 256 (vLLM evicts each block it hands
out, and hashes each block it caches, in calls of their own: the evictions are read from the
free queue before `get_new_blocks` hands the blocks out, the new hashes from the blocks after
`cache_full_blocks`). It notes:
- per step (`events`, the lists of the step being scheduled or updated): the block ids
  vLLM allocated, hit, freed, hashed and evicted, in the order it did (a hit on a block
  hashed earlier in the same step is also a same-step hit);
- since the last `take()`: every block whose refcount or hash changed (`dirty`), and each
  block vLLM hashed with the request and table index that filled it (`cached`): the tokens
  are read from the request later (the recorder on its own thread, from its own copy), never
  here.
"""
from __future__ import annotations

from typing import Any

from engine.report.schema import EV


def new_events() -> dict[str, list[int]]:
    return {k: [] for k in EV.ALL}


class PoolNotes:
    """kvscope's hooks on one vLLM BlockPool (see the module doc)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.events = new_events()          # the step being scheduled or updated
        self.dirty: set[int] = set()
        # per cache_full_blocks call: (vLLM Request, [(block id, index in its table)] it hashed,
        # the group's block size)
        self.cached: list[tuple[Any, list[tuple[int, int]], int]] = []
        self.cleared = False                # vLLM reset its prefix cache: every block changed
        self._hashed_now: set[int] = set()  # hashed in this step (same-step hits)
        self._originals: list[str] = []
        for name in ("get_new_blocks", "touch", "free_blocks", "cache_full_blocks", "cache_partial_block",
                     "move_block_hashes", "evict_blocks", "unpin_blocks", "reset_prefix_cache"):
            if hasattr(pool, name):
                self._wrap(name)

    def begin(self, events: dict[str, list[int]]) -> None:
        """Events from now on go to `events` (a step's lists)."""
        self.events = events
        self._hashed_now = set()

    def take(self) -> tuple[list[int], list[tuple[Any, list[tuple[int, int]], int]], bool]:
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
    def _hashed(self, blocks: list) -> list[int]:
        """The ids of `blocks` that hold a prefix-cache hash (`_block_hash`: the field behind
        vLLM's property, read without a call per block)."""
        return [b.block_id for b in blocks if b._block_hash is not None]

    def _get_new_blocks(self, original, num_blocks: int) -> Any:
        pool = self.pool
        evicting: list[int] = []
        if pool.enable_caching and num_blocks <= pool.get_num_free_blocks():
            # vLLM hands out the free queue's first `num_blocks` and evicts each that still holds
            # a hash (_maybe_evict_cached_block): those are read here, before it does.
            b = pool.free_block_queue.fake_free_list_head.next_free_block
            for _ in range(num_blocks):
                if b._block_hash is not None:
                    evicting.append(b.block_id)
                b = b.next_free_block
        blocks = original(num_blocks)
        ids = [b.block_id for b in blocks]
        if evicting:
            self.events["evicted"] += evicting
        self.events["allocated"] += ids
        self.dirty.update(ids)
        return blocks

    def _evict_blocks(self, original, block_ids) -> Any:
        block_ids = set(block_ids)
        blocks = self.pool.blocks
        evicting = self._hashed([blocks[b] for b in block_ids if 0 <= b < len(blocks)])
        result = original(block_ids)
        self.events["evicted"] += evicting
        self.dirty.update(evicting)
        return result

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
        self.dirty.update([b.block_id for b in mine])
        self.events["freed"] += [b.block_id for b in mine if b.ref_cnt == 0 and not b.is_null]
        return result

    def _unpin_blocks(self, original, blocks, *args: Any, **kwargs: Any) -> Any:
        blocks = list(blocks)
        self.dirty.update([b.block_id for b in blocks])
        return original(blocks, *args, **kwargs)

    def _newly_hashed(self, ids: list[int]) -> None:
        self.events["cached"] += ids
        self._hashed_now.update(ids)
        self.dirty.update(ids)

    def _cache_full_blocks(self, original, request, blocks, num_cached_blocks: int, num_full_blocks: int,
                           *args: Any, **kwargs: Any) -> Any:
        result = original(request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs)
        if num_cached_blocks < num_full_blocks:
            # Every block in the range that holds a hash now was hashed by this call: vLLM skips
            # null blocks and, for a group that caches a subset of them, those its mask leaves out.
            start = num_cached_blocks
            pairs = [(b.block_id, i) for i, b in enumerate(blocks[start:num_full_blocks], start)
                     if b._block_hash is not None]
            mask = kwargs.get("block_mask", args[2] if len(args) > 2 else None)
            if mask is not None:
                pairs = [p for p in pairs if mask[p[1] - start]]
            if pairs:
                self._newly_hashed([b for b, _ in pairs])
                self.cached.append((request, pairs, int(args[0] if args else kwargs["block_size"])))
        return result

    def _cache_partial_block(self, original, *args: Any, **kwargs: Any) -> Any:
        key = original(*args, **kwargs)
        if key is not None:  # a fine-grained entry on an existing block (its tokens are not a whole block's)
            block = kwargs["block"] if "block" in kwargs else args[1]
            self._newly_hashed([block.block_id])
        return key

    def _move_block_hashes(self, original, src_block, dst_block) -> Any:
        result = original(src_block, dst_block)
        self.dirty.add(src_block.block_id)
        if dst_block._block_hash is not None:
            self._newly_hashed([dst_block.block_id])
        return result

    def _reset_prefix_cache(self, original, *args: Any, **kwargs: Any) -> Any:
        done = original(*args, **kwargs)
        if done:
            self.cleared = True
        return done
