"""Attention written out in plain torch, shared by every backend: storing K/V by slot,
reading a sequence's context through its block table, the causal mask, and the softmax
probabilities the attention probe shows (the kernel backends never materialise them)."""
from __future__ import annotations

import torch

from .metadata import AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, all_written: bool | None = None) -> None:
    """Store each token's K/V at its slot (= block * block_size + offset); -1 slots are skipped.
    `all_written`: the caller knows whether every slot is >= 0 (saves a check per layer)."""
    kvh, d = k.shape[1], k.shape[2]
    if all_written is None:
        all_written = bool((slot_mapping >= 0).all())
    if not all_written:
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def as_cached(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """K or V as the cache holds it, in x's dtype: rounded where the cache is narrower (bf16 KV
    under fp32 arithmetic on a CPU, engine/dtypes.py), so a prompt attends to the same values
    whether they come fresh from its projection or from the cache (a prefix hit, a chunk)."""
    return x if cache.dtype == x.dtype else x.to(cache.dtype).to(x.dtype)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, length: int,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """The first `length` cached tokens of one sequence, [length, KVH, D], read through its
    blocks (in `dtype`: the arithmetic's, where it is wider than the cache's)."""
    bs = cache.shape[1]
    nblocks = -(-length // bs)
    # index_select, not cache[idx]: advanced indexing is ~50x slower on CPU here.
    return cache.index_select(0, block_table[:nblocks]).flatten(0, 1)[:length].to(dtype or cache.dtype)


def causal_mask(num_queries: int, context_len: int, seq_len: int, device: torch.device,
                sliding_window: int | None = None) -> torch.Tensor:
    """Query j sits at position context_len + j and sees keys 0 .. context_len + j; with a
    sliding window, only the last `sliding_window` of them (transformers' and vLLM's window)."""
    q_pos = torch.arange(context_len, context_len + num_queries, device=device)[:, None]
    k_pos = torch.arange(seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    return mask if sliding_window is None else mask & (k_pos > q_pos - sliding_window)


def attention_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) with the causal mask, in fp32: [H, Q, K]."""
    h, d = q.shape[1], q.shape[2]
    k = k.repeat_interleave(h // num_kv_heads, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * d ** -0.5
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return scores.softmax(-1)


def probe_probs_from_cache(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMetadata) -> None:
    """Set meta.probe_probs to the probe layer's softmax probabilities [H, Q, K] in fp32, from
    the keys in the paged cache (the last sequence's; a probe batch holds one). The kernel
    backends (triton, flash_attn) never materialise probabilities; this is how they probe."""
    kvh = k_cache.shape[2]
    for i in range(meta.num_seqs):
        s, e = meta.query_start_loc[i], meta.query_start_loc[i + 1]
        ctx, seq_len = meta.context_lens[i], meta.seq_lens[i]
        ks = gather_context(k_cache, meta.block_tables[i], seq_len)
        mask = causal_mask(e - s, ctx, seq_len, q.device, meta.sliding_window)
        meta.probe_probs = attention_probs(q[s:e], ks, mask, kvh)
