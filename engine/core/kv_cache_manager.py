"""Per-request block tables on top of the BlockPool: prefix-cache lookup, slot allocation,
registration of full blocks (at allocation, as vLLM's KVCacheManager does), and freeing.
With several KV cache groups (full attention + sliding window) the work goes to
engine/core/hybrid_kv_cache.py; with one (the default) it runs here."""
from __future__ import annotations

from collections.abc import Sequence

from ..request import Request
from .block_pool import BlockPool
from .hashing import extend_block_hashes
from .hybrid_kv_cache import HybridKVCacheCoordinator
from .kv_cache_groups import FullAttentionSpec, KVCacheSpec, cdiv


class KVCacheManager:
    """Allocates KV blocks to requests and runs the prefix cache (full blocks only)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, max_model_len: int,
                 kv_cache_groups: Sequence[KVCacheSpec] | None = None, max_in_flight_tokens: int | None = None,
                 prefix_cache_retention_interval: int | None = 0) -> None:
        """`kv_cache_groups`: one spec per group, full attention first (None: one full-attention
        group). With a sliding window, `max_in_flight_tokens` (vLLM's: max_num_batched_tokens per
        step in flight; default max_model_len) bounds what admission reserves, and
        `prefix_cache_retention_interval` (vLLM's setting, 0 by default) which blocks it caches."""
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.pool = BlockPool(num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_cache_queries = 0  # tokens looked up (vLLM counts tokens)
        self.prefix_cache_hits = 0     # tokens found
        if kv_cache_groups is not None and not isinstance(kv_cache_groups[0], FullAttentionSpec):
            raise ValueError("the first KV cache group must be full attention (its table is block_table)")
        self.hybrid = None if kv_cache_groups is None or len(kv_cache_groups) < 2 else HybridKVCacheCoordinator(
            kv_cache_groups, self.pool, block_size, max_model_len,
            max_model_len if max_in_flight_tokens is None else max_in_flight_tokens, prefix_cache_retention_interval)

    def set_prefix_caching(self, enabled: bool) -> None:
        if self.enable_prefix_caching and not enabled:
            self.pool.reset_prefix_cache()
        self.enable_prefix_caching = enabled

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Longest run of cached full blocks at the start of the request's tokens.

        At most num_tokens - 1 tokens may hit, so at least one token is computed and its
        logits sampled (a full hit recomputes the last block)."""
        if self.hybrid is not None:  # caching off: a lookup of nothing (every group's hit 0)
            return self.hybrid.find_longest_cache_hit(req, req.num_tokens - 1 if self.enable_prefix_caching else 0)
        if not self.enable_prefix_caching:
            return [], 0
        extend_block_hashes(req.block_hashes, req.all_token_ids, self.block_size)
        max_hit_blocks = (req.num_tokens - 1) // self.block_size
        hits = []
        for h in req.block_hashes[:max_hit_blocks]:
            b = self.pool.lookup(h)
            if b is None:
                break
            hits.append(b)
        return hits, len(hits) * self.block_size

    def record_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count a lookup once, when its request is admitted (a failed admission retries)."""
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(self, req: Request, num_new_tokens: int, computed_blocks: Sequence[int] = (),
                       full_sequence_must_fit: bool = False) -> list[int] | None:
        """Give the request room for `num_new_tokens` more tokens after its computed ones
        (plus `computed_blocks` prefix hits taken now), and register the full blocks those
        tokens complete. None if the pool cannot.

        `full_sequence_must_fit` (vLLM's scheduler_reserve_full_isl, for admissions): refuse
        unless blocks for the request's whole known sequence fit, not only this chunk's."""
        if self.hybrid is not None:
            return self.hybrid.allocate_slots(req, num_new_tokens, computed_blocks, full_sequence_must_fit,
                                              self.enable_prefix_caching)
        bs = self.block_size
        if not computed_blocks and not full_sequence_must_fit:
            # A running request whose blocks already hold the new tokens (most decodes): nothing
            # to allocate, only full blocks to register, as below with no block needed.
            end = req.num_computed_tokens + num_new_tokens
            if cdiv(min(end, self.max_model_len), bs) <= len(req.block_table):
                self.cache_blocks(req, min(end, req.num_tokens))
                return []
        num_computed = req.num_computed_tokens + len(computed_blocks) * bs
        # Hits on free cached blocks also consume free-queue entries.
        taken_from_free = sum(1 for b in computed_blocks if self.pool.blocks[b].ref_count == 0)
        held = len(req.block_table) + len(computed_blocks)
        if full_sequence_must_fit:
            need_all = cdiv(min(req.num_tokens, self.max_model_len), bs) - held
            if max(need_all, 0) + taken_from_free > self.pool.num_free_blocks:
                return None
        need = cdiv(min(num_computed + num_new_tokens, self.max_model_len), bs) - held
        if max(need, 0) + taken_from_free > self.pool.num_free_blocks:
            return None
        if computed_blocks:
            self.pool.touch(list(computed_blocks))
            req.block_table.extend(computed_blocks)
            req.num_cached_blocks = len(req.block_table)  # hits hold their hashes already
        new = self.pool.allocate(max(need, 0))
        req.block_table.extend(new)
        # The tokens computed in this step are known now: their full blocks become findable at
        # once, so a request admitted later in this step hits them (their KV is written in this
        # step's forward, before any layer reads it).
        self.cache_blocks(req, min(num_computed + num_new_tokens, req.num_tokens))
        return new

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Register the request's full blocks among its first `num_tokens` tokens."""
        if not self.enable_prefix_caching:
            return
        if self.hybrid is not None:
            return self.hybrid.cache_blocks(req, num_tokens)
        bs = self.block_size
        extend_block_hashes(req.block_hashes, req.all_token_ids, bs)
        num_full = num_tokens // bs
        for i in range(req.num_cached_blocks, num_full):
            self.pool.register(req.block_table[i], req.block_hashes[i], req.all_token_ids[i * bs:(i + 1) * bs])
        req.num_cached_blocks = max(req.num_cached_blocks, num_full)

    def free(self, req: Request) -> None:
        """Return the request's blocks, last block first (see BlockPool.free)."""
        if self.hybrid is not None:
            return self.hybrid.free(req)
        self.pool.free(list(reversed(req.block_table)))
        req.block_table = []
        req.num_cached_blocks = 0
