"""Several KV cache groups over one BlockPool (vLLM's HybridKVCacheCoordinator): one full-attention
group first, then sliding-window or Mamba ones. The KVCacheManager hands its work here when it has
several groups; group 0's table is the request's `block_table`, the others' `extra_block_tables`.

- A prefix hit must hold in every group: the full group's hit bounds the sliding group's search,
  and the sliding group's (shorter or equal) hit is the request's; the full group keeps as many
  blocks as that.
- Before each allocation a sliding group frees the blocks that left its window, on the tokens
  whose forward is done (not those in flight), and puts the null block in their place.
- An allocation needs blocks in every group; admission with `full_sequence_must_fit` caps what a
  sliding group reserves at the most it can ever hold at once.
- A Mamba group (align mode) holds one state block per chunk end: each allocation nulls the
  positions before the new state, the state before the previous one is freed, and a hit on a
  state cached in this very step waits a step (its state is written by this step's forward).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..request import Request
from .block_pool import NULL_BLOCK_ID, BlockPool
from .hashing import extend_block_hashes
from .kv_cache_groups import FullAttentionSpec, KVCacheSpec, MambaSpec, blocks_to_allocate, cdiv
from .mamba_group import MambaStates


class GroupedHits(list[int]):
    """A prefix hit as the Scheduler passes it on: group 0's blocks (a plain list to anyone who
    reads one group), with every group's blocks in `by_group` (leading null blocks included)."""

    def __init__(self, by_group: list[list[int]], tokens_by_group: list[int]) -> None:
        super().__init__(by_group[0])
        self.by_group = by_group
        self.tokens_by_group = tokens_by_group  # each group's own hit, before the intersection


class HybridKVCacheCoordinator:
    """Every KV cache group of a request, over one BlockPool: hits, allocation, caching, freeing."""

    def __init__(self, specs: Sequence[KVCacheSpec], pool: BlockPool, block_size: int, max_model_len: int,
                 max_in_flight_tokens: int, retention_interval: int | None) -> None:
        if not isinstance(specs[0], FullAttentionSpec) or any(isinstance(s, FullAttentionSpec) for s in specs[1:]):
            raise ValueError("KV cache groups: one full-attention group first, then sliding-window or Mamba ones")
        if sum(isinstance(s, MambaSpec) for s in specs) > 1:
            raise ValueError("KV cache groups: one Mamba group at most")
        self.specs, self.pool, self.block_size, self.max_model_len = list(specs), pool, block_size, max_model_len
        self.caps = [s.admission_cap(block_size, max_in_flight_tokens, max_model_len) for s in specs]
        self.retention_interval = retention_interval
        # Per group: request id -> its leading blocks registered (or skipped) in the prefix cache.
        # A request is in it once it has hits or cached blocks (vLLM's num_cached_block).
        self.num_cached_block: list[dict[str, int]] = [{} for _ in specs]
        self.num_blocks_left_window = 0  # blocks freed because they left a sliding window
        self.mamba = MambaStates(pool)  # a Mamba group's per-request states (unused without one)
        self.mamba_group = next((g for g, s in enumerate(specs) if isinstance(s, MambaSpec)), None)

    def tables(self, req: Request) -> list[list[int]]:
        if len(req.extra_block_tables) != len(self.specs) - 1:
            req.extra_block_tables = [[] for _ in self.specs[1:]]
        return [req.block_table, *req.extra_block_tables]

    # -- prefix hits -------------------------------------------------------------------------
    def find_longest_cache_hit(self, req: Request, max_length: int) -> tuple[GroupedHits, int]:
        """Every group's hit blocks and the hit length all groups share. With one full group and
        one other, one pass settles it (vLLM's simple hybrid); more groups iterate to a fixed point."""
        extend_block_hashes(req.block_hashes, req.all_token_ids, self.block_size)
        by_group: list[list[int]] = [[] for _ in self.specs]
        full_length = length = max_length
        while True:
            bound = length
            for g, spec in enumerate(self.specs):
                if g == 0 and by_group[0]:  # full attention: a shorter hit is a prefix of the longer
                    bound = min(bound, len(by_group[0]) * self.block_size)
                    continue
                by_group[g] = spec.find_longest_cache_hit(self.pool, req.block_hashes, bound, g, self.block_size)
                bound = len(by_group[g]) * self.block_size
                if g == 0:
                    full_length = bound
            if bound >= length:
                break
            length = bound
            if len(self.specs) == 2:
                break
        tokens_by_group = [full_length, *(len(hits) * self.block_size for hits in by_group[1:])]
        del by_group[0][cdiv(length, self.block_size):]
        # A prefix the full group has and a sliding group has not cached: its end is worth caching
        # in the sliding group when this request computes it, so the next sibling hits it all.
        req.shared_prefix_boundary = full_length if full_length > length else 0
        return GroupedHits(by_group, tokens_by_group), length

    # -- allocation --------------------------------------------------------------------------
    def allocate_slots(self, req: Request, num_new_tokens: int, hits: Sequence[int], full_sequence_must_fit: bool,
                       caching: bool) -> list[int] | None:
        bs, tables = self.block_size, self.tables(req)
        by_group = hits.by_group if isinstance(hits, GroupedHits) else [[] for _ in self.specs]
        num_computed = min(req.num_computed_tokens + len(by_group[0]) * bs, self.max_model_len)
        if full_sequence_must_fit:
            need_all = self._blocks_needed(req, tables, by_group, min(req.num_tokens, self.max_model_len),
                                           num_computed, capped=True)
            if need_all > self.pool.num_free_blocks:
                return None
        num_tokens = min(num_computed + num_new_tokens, self.max_model_len)
        self.remove_skipped_blocks(req, tables, max(0, num_computed - req.num_in_flight_tokens))
        need = self._blocks_needed(req, tables, by_group, num_tokens, num_computed, capped=False)
        if need > self.pool.num_free_blocks:
            return None
        if any(by_group) and req.request_id not in self.num_cached_block[0]:
            for g, spec in enumerate(self.specs):  # every group's hits are taken before any allocation
                skipped = spec.skipped_tokens(num_computed) // bs
                kept = by_group[g][skipped:]
                self.pool.touch(kept)
                tables[g].extend([NULL_BLOCK_ID] * skipped + kept)
                self.num_cached_block[g][req.request_id] = len(tables[g])
        new: list[int] = []
        for spec, table in zip(self.specs, tables):
            if isinstance(spec, MambaSpec):
                new += self.mamba.allocate(req.request_id, table, num_tokens, bs)
                continue
            fresh = self.pool.allocate(max(cdiv(num_tokens, bs) - len(table), 0))
            table.extend(fresh)
            new += fresh
        if caching:
            self.cache_blocks(req, min(num_computed + num_new_tokens, req.num_tokens))
        req.num_cached_blocks = self.num_cached_block[0].get(req.request_id, 0)
        if isinstance(hits, GroupedHits):  # an admission: the records show each group's hit
            req.group_hit_tokens = list(hits.tokens_by_group)
        return new

    def _blocks_needed(self, req: Request, tables: list[list[int]], by_group: list[list[int]], num_tokens: int,
                       num_computed: int, capped: bool) -> int:
        hits = by_group if req.request_id not in self.num_cached_block[0] else [[] for _ in self.specs]
        return sum(self.mamba.blocks_to_allocate(tables[g], hits[g], num_tokens, self.block_size)
                   if isinstance(spec, MambaSpec) else
                   blocks_to_allocate(spec, tables[g], hits[g], num_tokens, num_computed, self.block_size,
                                      self.caps[g] if capped else None, self.pool)
                   for g, spec in enumerate(self.specs))

    def remove_skipped_blocks(self, req: Request, tables: list[list[int]], num_done_tokens: int) -> None:
        """Free each group's blocks wholly before the window of the next token, last first, up to
        the first null block (the ones before it went earlier)."""
        for spec, table in zip(self.specs, tables):
            if isinstance(spec, MambaSpec):
                self.mamba.remove_skipped(req.request_id, table, num_done_tokens, self.block_size)
                continue
            skipped = min(spec.skipped_tokens(num_done_tokens) // self.block_size, len(table))
            freed = []
            for i in range(skipped - 1, -1, -1):
                if table[i] == NULL_BLOCK_ID:
                    break
                freed.append(table[i])
                table[i] = NULL_BLOCK_ID
            self.pool.free(freed)
            self.num_blocks_left_window += len(freed)

    # -- the prefix cache --------------------------------------------------------------------
    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Register, per group, the full blocks among the first `num_tokens` tokens that a later hit
        could read (a sliding group: see SlidingWindowSpec.cacheable_mask)."""
        bs, tables = self.block_size, self.tables(req)
        extend_block_hashes(req.block_hashes, req.all_token_ids, bs)
        num_full = num_tokens // bs
        boundaries = [req.num_prompt_tokens - 1] + ([req.shared_prefix_boundary] if req.shared_prefix_boundary else [])
        for g, spec in enumerate(self.specs):
            start = self.num_cached_block[g].get(req.request_id, 0)
            if start >= num_full:
                continue
            mask = spec.cacheable_mask(start, num_full, bs, self.retention_interval, boundaries)
            for i in range(start, num_full):
                b = tables[g][i]
                if b != NULL_BLOCK_ID and (mask is None or mask[i - start]):
                    self.pool.register(b, req.block_hashes[i], req.all_token_ids[i * bs:(i + 1) * bs], g)
                    if isinstance(spec, MambaSpec):
                        self.mamba.cached_this_step.add(req.block_hashes[i])
            self.num_cached_block[g][req.request_id] = num_full
        if (m := self.mamba_group) is not None:
            self.mamba.recache_prompt_state(req, tables[m], num_full, m, bs)
        req.num_cached_blocks = self.num_cached_block[0].get(req.request_id, 0)

    def free(self, req: Request) -> None:
        """Each group returns its blocks, last first, one group after the other."""
        for g, table in enumerate(self.tables(req)):
            self.pool.free(list(reversed(table)))
            self.num_cached_block[g].pop(req.request_id, None)
        self.mamba.forget(req.request_id)
        req.block_table, req.extra_block_tables = [], []
        req.num_cached_blocks = 0
