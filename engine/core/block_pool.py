"""The physical KV block pool: refcounts, the LRU free queue and the hash -> block map.

Block 0 is the null block (vLLM v1): never allocated, used as padding in block tables.
A free block may still hold a cached hash ("free but cached"): it stays findable by the
prefix cache until allocation reaches it at the head of the free queue and evicts it.
As in vLLM, equal full blocks are not de-duplicated: one hash may name several blocks (a
full-hit request recomputes its last block into a fresh one), a lookup takes the one
registered first, and each stays findable until it is evicted itself.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TypedDict

NULL_BLOCK_ID = 0


@dataclass
class KVBlock:
    """One physical KV block's bookkeeping (its K/V live in the runner's per-layer pools)."""
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()  # the full block's tokens, stored when its hash is registered
    kv_cache_group_id: int = 0  # the group whose hash it holds: equal hashes of two groups are two entries


class BlockEventsDict(TypedDict):
    """BlockEvents.to_dict(), the StepRecord's `blocks` (engine/report/schema.py): what the step
    did to blocks, block ids per event in the order it happened. Its keys are BlockEvents'
    fields, in their order (schema.py checks it at import)."""
    allocated: list[int]
    freed: list[int]
    cached: list[int]
    hits: list[int]
    evicted: list[int]
    same_step_hits: list[int]


@dataclass
class BlockEvents:
    """What happened to blocks during one step (ids in the order it happened). The field names
    are the StepRecord's `blocks` keys (BlockEventsDict)."""

    allocated: list[int] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    # Hits on blocks registered earlier in this same step: their KV does not exist yet when the
    # request is admitted; the step's forward writes it before any layer reads it.
    same_step_hits: list[int] = field(default_factory=list)

    def to_dict(self) -> BlockEventsDict:
        """StepRecord.blocks (copies of the lists)."""
        return {"allocated": list(self.allocated), "freed": list(self.freed), "cached": list(self.cached),
                "hits": list(self.hits), "evicted": list(self.evicted), "same_step_hits": list(self.same_step_hits)}


class BlockPool:
    """Owns every KV block's bookkeeping. The free queue is an OrderedDict used as an O(1)
    doubly linked list: allocation pops the head, cached blocks are freed to the tail (kept
    longest), blocks with nothing reusable to the head (reused first), and a prefix hit on a
    free cached block removes it from the middle."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        # hash -> the blocks registered under it, in registration order (an ordered set). Group 0's
        # key is the hash itself; another KV cache group's is (group, hash), as vLLM keys by both.
        self.cached_blocks_of_hash: dict[int | tuple[int, int], dict[int, None]] = {}
        self._events = BlockEvents()  # since the last take_events()
        # Every block whose refcount, hash or place changed since the last take_touched(): what
        # a step's changes must resend (a shared block that lost one reference has no event).
        self._touched: set[int] = set()

    # -- queries ------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of allocatable blocks in use (vLLM's kv_cache_usage)."""
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def lookup(self, block_hash: int, group: int = 0) -> int | None:
        """The first block still registered under this hash (in KV cache group `group`), or None."""
        blocks = self.cached_blocks_of_hash.get(_key(block_hash, group))
        return next(iter(blocks)) if blocks else None

    def is_free(self, block_id: int) -> bool:
        return block_id in self.free_queue

    # -- mutations ----------------------------------------------------------------------
    def take_events(self) -> BlockEvents:
        """What happened to blocks since the last call (vLLM's BlockPool.take_events). The
        engine takes them once per step, after the scheduler's update, so blocks an abort
        freed between two steps show in the next step's record rather than vanish."""
        events, self._events = self._events, BlockEvents()
        return events

    def take_touched(self) -> set[int]:
        """The blocks touched since the last call (engine/report/change_notes.py takes them)."""
        touched, self._touched = self._touched, set()
        return touched

    def touch(self, block_ids: list[int]) -> None:
        """Take prefix-cache hits: bump refcounts, pulling free cached blocks out of the queue."""
        for b in block_ids:
            if b == NULL_BLOCK_ID:  # a sliding window's padding: nobody's to take
                continue
            block = self.blocks[b]
            if block.ref_count == 0:
                del self.free_queue[b]
            block.ref_count += 1
            self._touched.add(b)
            self._events.hits.append(b)
            if b in self._events.cached:
                self._events.same_step_hits.append(b)

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free_blocks:
            raise RuntimeError(f"cannot allocate {n} blocks, only {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            b, _ = self.free_queue.popitem(last=False)
            block = self.blocks[b]
            if block.block_hash is not None:  # lazy eviction: only now does the cached content go
                self._unregister(block, block.block_hash)
                self._events.evicted.append(b)
            block.ref_count = 1
            out.append(b)
        self._events.allocated.extend(out)
        self._touched.update(out)
        return out

    def free(self, block_ids_in_free_order: list[int]) -> None:
        """Drop one reference from each block, in the given order (a request passes its block
        table reversed). Blocks reaching refcount 0 join the free queue: cached ones at the tail,
        the rest at the head keeping this order, so the next allocation reuses them first."""
        to_head = []
        for b in block_ids_in_free_order:
            if b == NULL_BLOCK_ID:  # a sliding window's padding: never referenced, never freed
                continue
            block = self.blocks[b]
            block.ref_count -= 1
            self._touched.add(b)
            if block.ref_count < 0:
                raise RuntimeError(f"block {b} freed more often than it was referenced")
            if block.ref_count == 0:
                self._events.freed.append(b)
                if block.block_hash is not None:
                    self.free_queue[b] = None
                else:
                    to_head.append(b)
        for b in reversed(to_head):
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)

    def register(self, block_id: int, block_hash: int, token_ids: list[int], group: int = 0) -> None:
        """Make a full block findable by its hash, also when another block already holds the
        same hash (vLLM keeps both, so block tables stay append-only)."""
        block = self.blocks[block_id]
        block.block_hash, block.token_ids, block.kv_cache_group_id = block_hash, tuple(token_ids), group
        self.cached_blocks_of_hash.setdefault(_key(block_hash, group), {})[block_id] = None
        self._events.cached.append(block_id)
        self._touched.add(block_id)

    def _unregister(self, block: KVBlock, block_hash: int) -> None:
        key = _key(block_hash, block.kv_cache_group_id)
        blocks = self.cached_blocks_of_hash[key]
        del blocks[block.block_id]
        if not blocks:
            del self.cached_blocks_of_hash[key]
        block.block_hash, block.token_ids = None, ()

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (used when prefix caching is switched off)."""
        for block in self.blocks:
            if block.block_hash is not None:
                self._touched.add(block.block_id)
            block.block_hash, block.token_ids = None, ()
        self.cached_blocks_of_hash.clear()


def _key(block_hash: int, group: int) -> int | tuple[int, int]:
    """The prefix cache's key: group 0's is the bare hash (one group: the keys as ever)."""
    return block_hash if group == 0 else (group, block_hash)
