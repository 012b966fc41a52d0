"""The reference backend in plain torch: the CPU default and the oracle for other kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import AttentionBackend
from .metadata import AttentionMetadata
from .torch_decode import decode_attention, decode_plan


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
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, v)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached tokens of one sequence, [length, KVH, D], read through its blocks."""
    bs = cache.shape[1]
    nblocks = -(-length // bs)
    # index_select, not cache[idx]: advanced indexing is ~50x slower on CPU here.
    return cache.index_select(0, block_table[:nblocks]).flatten(0, 1)[:length]


def causal_mask(num_queries: int, context_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """Query j sits at position context_len + j and sees keys 0 .. context_len + j."""
    q_pos = torch.arange(context_len, context_len + num_queries, device=device)[:, None]
    return torch.arange(seq_len, device=device)[None, :] <= q_pos


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
        meta.probe_probs = attention_probs(q[s:e], ks, causal_mask(e - s, ctx, seq_len, q.device), kvh)


class TorchAttentionBackend(AttentionBackend):
    """Prefills run one SDPA call per sequence (fresh prompts attend to their own K/V, chunks
    and prefix hits read the context from the paged cache); all single-token decodes of the
    step run as a few padded, masked SDPA calls over their gathered block tables, one per
    group of similar lengths, with a shared cached prefix attended once (torch_decode.py)."""

    name = "torch"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        probing = meta.probe_layer is not None
        if not probing:
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping, _all_slots_written(meta))
        decode_set = set(meta.decode_seq_ids)
        out = q.new_empty(q.shape)
        kvh = k.shape[1]
        for i in range(meta.num_seqs):
            if i in decode_set and not probing:
                continue
            s, e = meta.query_start_loc[i], meta.query_start_loc[i + 1]
            ctx, seq_len = meta.context_lens[i], meta.seq_lens[i]
            if ctx == 0 and not probing:
                # Nothing cached before: the fresh K/V are the whole context.
                ks, vs, mask = k[s:e], v[s:e], None
            else:
                ks = gather_context(k_cache, meta.block_tables[i], seq_len)
                vs = gather_context(v_cache, meta.block_tables[i], seq_len)
                mask = causal_mask(e - s, ctx, seq_len, q.device) if e - s > 1 else None
            if probing and layer == meta.probe_layer:
                full_mask = mask if mask is not None else causal_mask(e - s, ctx, seq_len, q.device)
                meta.probe_probs = attention_probs(q[s:e], ks, full_mask, kvh)
            out[s:e] = _sdpa(q[s:e], ks, vs, mask, causal=mask is None and e - s > 1)
        if meta.decode_seq_ids and not probing:
            decode_attention(q, k_cache, v_cache, decode_plan(meta, k_cache.shape[1]), out)
        return out


def _all_slots_written(meta: AttentionMetadata) -> bool:
    """Whether no slot of the step is -1, checked once per step rather than once per layer."""
    if meta.kernel_inputs is None:
        meta.kernel_inputs = {}
    if "torch_all_written" not in meta.kernel_inputs:
        meta.kernel_inputs["torch_all_written"] = bool((meta.slot_mapping >= 0).all())
    return meta.kernel_inputs["torch_all_written"]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """[n, H, D] x [L, KVH, D] -> [n, H, D] with grouped-query heads. The KV heads are
    repeated for their query heads (head i reads KV head i // group): with enable_gqa, CPU
    SDPA falls back to the math path, which materializes every [n, L] score matrix."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    # 4-D [1, H, L, D]: CPU SDPA's flash kernel takes only batched 4-D inputs.
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask,
        is_causal=causal)
    return o[0].transpose(0, 1)
