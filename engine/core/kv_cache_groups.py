"""KV cache groups (vLLM v1's kv_cache_groups): layers of one attention kind share one block table
per request. A model mixing full-attention and sliding-window (or Mamba) layers has two groups over
the one BlockPool; each group decides alone what a prefix hit is, what it may free and what it caches.

The groups here share the engine's block size (the scheduler block size and the hash block size
are that size too), and nothing speculative runs, so a hit is a whole number of blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .block_pool import NULL_BLOCK_ID, BlockPool

if TYPE_CHECKING:
    from ..report.schema import KVCacheGroupDict


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class FullAttentionSpec:
    """Layers that attend to every earlier token: their blocks stay until the request ends."""

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def find_longest_cache_hit(self, pool: BlockPool, hashes: list[int], max_length: int, group: int,
                               block_size: int) -> list[int]:
        """The cached blocks of the longest run from the first block (chained hashes: a miss ends it)."""
        hits = []
        for h in hashes[:max_length // block_size]:
            b = pool.lookup(h, group)
            if b is None:
                break
            hits.append(b)
        return hits

    def admission_cap(self, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int | None:
        return None

    def cacheable_mask(self, start: int, end: int, block_size: int, retention_interval: int | None,
                       boundaries: list[int]) -> list[bool] | None:
        return None  # every full block can serve a hit


@dataclass(frozen=True)
class SlidingWindowSpec:
    """Layers whose token t attends to tokens (t - sliding_window, t] only: blocks wholly before
    the window of the next token are freed (the null block takes their place in the table), and
    a prefix hit only needs the blocks the window of its first computed token reads."""
    sliding_window: int

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the next token to compute (the next token sees the
        sliding_window - 1 before it)."""
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def contiguous_blocks_for_hit(self, block_size: int) -> int:
        return cdiv(self.sliding_window - 1, block_size)

    def find_longest_cache_hit(self, pool: BlockPool, hashes: list[int], max_length: int, group: int,
                               block_size: int) -> list[int]:
        """The longest hit whose last `contiguous_blocks_for_hit` blocks are cached, searched from
        the right; the blocks before that run are the null block (no one reads them). Without such
        a run, the run of cached blocks from the first block, however short."""
        need = self.contiguous_blocks_for_hit(block_size)
        hits = [NULL_BLOCK_ID] * (max_length // block_size)
        run = 0
        for i in range(len(hits) - 1, -1, -1):
            b = pool.lookup(hashes[i], group)
            if b is None:
                run = 0
                continue
            hits[i] = b
            run += 1
            if run >= need:
                return hits[:i + run]
        return hits[:run]

    def admission_cap(self, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int | None:
        """The most blocks a request can hold at once: the window behind its computed tokens plus
        the tokens still in flight, and one more because a window rarely starts on a block's edge.
        Admission reserves no more than this for the group (vLLM's
        SlidingWindowSpec.max_admission_blocks_per_request)."""
        return cdiv(min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1

    def cacheable_mask(self, start: int, end: int, block_size: int, retention_interval: int | None,
                       boundaries: list[int]) -> list[bool] | None:
        """Which of blocks [start, end) are worth registering: only a hit's last `need` blocks are
        ever read, so only the runs that end where a hit can end. `retention_interval` None: every
        block boundary (all blocks, unless the window needs none); 0 (vLLM's default): only the
        runs ending at `boundaries` (where a resend of the prompt, or a sibling sharing a prefix
        with it, would hit); n > 0: also one run per n tokens."""
        need = self.contiguous_blocks_for_hit(block_size)
        mask = [False] * (end - start)
        per_segment = block_size if retention_interval is None else retention_interval
        if per_segment:
            blocks_per_segment = per_segment // block_size
            if need >= blocks_per_segment:
                return None
            for i in range(start, end):
                mask[i - start] = i % blocks_per_segment >= blocks_per_segment - need
        if retention_interval is not None:
            for boundary in boundaries:
                last = boundary // block_size  # the run ends before the block holding the boundary
                for j in range(max(start, last - need), min(end, last)):
                    mask[j - start] = True
        return mask


@dataclass(frozen=True)
class MambaSpec:
    """Mamba (state-space) layers, cached in vLLM's "align" mode: a request's state after token t
    lives in the block of position t, only the latest state is read, and a state is worth keeping
    only where it ends a block. Its table is the null block but for the one or two states still
    in use. A hit is the one cached state furthest to the right, with null blocks before it."""

    def skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)  # only the last computed token's state is read

    def find_longest_cache_hit(self, pool: BlockPool, hashes: list[int], max_length: int, group: int,
                               block_size: int) -> list[int]:
        for i in range(max_length // block_size - 1, -1, -1):
            if (b := pool.lookup(hashes[i], group)) is not None:
                return [NULL_BLOCK_ID] * i + [b]
        return []

    def admission_cap(self, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int | None:
        return None  # MambaStates.blocks_to_allocate asks for one state block at most anyway

    def cacheable_mask(self, start: int, end: int, block_size: int, retention_interval: int | None,
                       boundaries: list[int]) -> list[bool] | None:
        """Which of blocks [start, end) to register: `retention_interval` None: every state; 0
        (vLLM's default): only the states ending where a hit can resume (`boundaries`, floored to a
        block); n > 0: also the state ending each n-token segment."""
        if retention_interval is None or 0 < retention_interval <= block_size:
            return None
        per_segment = retention_interval // block_size
        mask = [bool(per_segment) and (i + 1) % per_segment == 0 for i in range(start, end)]
        for boundary in boundaries:
            if start <= boundary // block_size - 1 < end:
                mask[boundary // block_size - 1 - start] = True
        return mask


KVCacheSpec = FullAttentionSpec | SlidingWindowSpec | MambaSpec


def blocks_to_allocate(spec: KVCacheSpec, table: list[int], hits: list[int], num_tokens: int,
                       num_computed_tokens: int, block_size: int, cap: int | None, pool: BlockPool) -> int:
    """Blocks one group takes from the free queue to hold `num_tokens` (with `hits` taken now):
    new ones, plus the free cached hits that leave the queue. `cap`: admission's per-request
    ceiling (a sliding window's). Blocks the window already skips are not needed."""
    required = cdiv(num_tokens, block_size)
    if cap is not None:
        required = min(required, cap)
    if not hits:  # a running request, or an admission without hits: its table is all it holds
        return max(required - len(table), 0)
    skipped_blocks = spec.skipped_tokens(num_computed_tokens) // block_size
    new = max(required - max(skipped_blocks, len(hits) + len(table)), 0)
    kept_hits = hits[max(0, skipped_blocks - len(table)):]
    return new + sum(1 for b in kept_hits if b != NULL_BLOCK_ID and pool.blocks[b].ref_count == 0)


def kv_cache_group(spec: KVCacheSpec, layers: list[int]) -> KVCacheGroupDict:
    """model_info's entry for a group of `spec` holding `layers`' KV."""
    kind = "mamba" if isinstance(spec, MambaSpec) else (
        "sliding_window" if isinstance(spec, SlidingWindowSpec) else "full_attention")
    return {"kind": kind, "sliding_window": spec.sliding_window if isinstance(spec, SlidingWindowSpec) else None,
            "layers": layers}


# A recording's short name for each kind of group model_info names (Settings.kv_cache_groups
# lists them in the order vLLM allocated them: "sliding,sliding,full" for a 3-layer Gemma 3,
# "full,mamba" for a hybrid Mamba model cached in vLLM's align mode).
RECORDED_GROUP_KIND = {"full_attention": "full", "sliding_window": "sliding", "mamba": "mamba"}
RECORDED_GROUP_KINDS = tuple(RECORDED_GROUP_KIND.values())


def parse_group_kinds(text: str) -> list[str]:
    """"sliding,sliding,full" -> its kinds, each checked (a ValueError names the field)."""
    kinds = [k.strip() for k in text.split(",")]
    bad = [k for k in kinds if k not in RECORDED_GROUP_KINDS]
    if bad or "full" not in kinds or kinds.count("mamba") > 1:
        raise ValueError(f"kv_cache_groups must list {', '.join(RECORDED_GROUP_KINDS)} groups, comma-separated, "
                         f"with at least one full one and one mamba one at most, got {text!r}")
    return kinds


def attention_group_specs(sliding_window: int | None) -> list[KVCacheSpec] | None:
    """The KV cache groups of a model whose sliding-window layers (if any) have `sliding_window`,
    as the KV cache manager takes them (None: one full-attention group): the full-attention
    group first, as ModelSpec.kv_cache_group_layers orders them."""
    if sliding_window is None:
        return None
    return [FullAttentionSpec(), SlidingWindowSpec(sliding_window)]
