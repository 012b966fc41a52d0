"""The reference backend in plain torch: the CPU default and the oracle for other kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import AttentionBackend
from .metadata import AttentionMetadata


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store each token's K/V at its slot (= block * block_size + offset); -1 slots are skipped."""
    kvh, d = k.shape[1], k.shape[2]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
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


class TorchAttentionBackend(AttentionBackend):
    """Prefills run one SDPA call per sequence (fresh prompts attend to their own K/V, chunks
    and prefix hits read the context from the paged cache); all single-token decodes of the
    step run as one padded, masked SDPA call over their gathered block tables."""

    name = "torch"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        probing = meta.probe_layer is not None
        if not probing:
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        decode_set = set(meta.decode_seq_ids)
        out = q.new_empty(q.shape) if len(decode_set) < q.shape[0] or probing else None
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
            if len(meta.decode_seq_ids) == q.shape[0]:  # a pure decode step: rows are the sequences
                return self._batched_decode(q, k_cache, v_cache, meta)
            # index_select / index_copy_, not q[rows] / out[rows] = ...: far cheaper on CPU.
            rows = meta.decode_rows
            out.index_copy_(0, rows, self._batched_decode(q.index_select(0, rows), k_cache, v_cache, meta))
        return out

    @staticmethod
    def _batched_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata) -> torch.Tensor:
        tables = meta.decode_block_tables
        b, max_blocks = tables.shape
        bs = k_cache.shape[1]
        flat = tables.reshape(-1)
        ks = k_cache.index_select(0, flat).view(b, max_blocks * bs, *k_cache.shape[2:])  # [B, S, KVH, D]
        vs = v_cache.index_select(0, flat).view(b, max_blocks * bs, *v_cache.shape[2:])
        if meta.decode_mask is None:  # the same for every layer of the step: build it once
            valid = torch.arange(max_blocks * bs, device=q.device)[None, :] < meta.decode_seq_lens[:, None]
            meta.decode_mask = valid[:, None, None, :]
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2),                      # [B, H, 1, D]
            ks.transpose(1, 2), vs.transpose(1, 2),
            attn_mask=meta.decode_mask, enable_gqa=True)
        return o.squeeze(2)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """[n, H, D] x [L, KVH, D] -> [n, H, D] with grouped-query heads."""
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
        attn_mask=mask, is_causal=causal, enable_gqa=True)
    return o.transpose(0, 1)
