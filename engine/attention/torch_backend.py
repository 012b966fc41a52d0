"""The reference backend in plain torch: the CPU default and the oracle for other kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import AttentionBackend
from .metadata import AttentionMetadata
from .reference_ops import as_cached, attention_probs, causal_mask, gather_context, write_kv
from .torch_decode import decode_attention, decode_plan


class TorchAttentionBackend(AttentionBackend):
    """Prefills run one SDPA call per sequence (fresh prompts attend to their own K/V, chunks
    and prefix hits read the context from the paged cache); all single-token decodes of the
    step run as a few padded, masked SDPA calls over their gathered block tables, one per
    group of similar lengths, with a shared cached prefix attended once (torch_decode.py)."""

    name = "torch"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        probing = meta.probing
        if not probing:
            self.write_kv(k, v, k_cache, v_cache, meta)
        window = meta.sliding_window
        # The batched decode path attends to whole contexts: a sliding window's decodes take
        # the masked path below, one sequence at a time.
        batched_decodes = not probing and window is None
        decode_set = set(meta.decode_seq_ids) if batched_decodes else set()
        out = q.new_empty(q.shape)
        kvh = k.shape[1]
        for i in range(meta.num_seqs):
            if i in decode_set:
                continue
            s, e = meta.query_start_loc[i], meta.query_start_loc[i + 1]
            ctx, seq_len = meta.context_lens[i], meta.seq_lens[i]
            if ctx == 0 and not probing:
                # Nothing cached before: the fresh K/V are the whole context.
                ks, vs = as_cached(k[s:e], k_cache), as_cached(v[s:e], v_cache)
            else:
                # A sliding group's blocks before the window are the null block: read, then masked.
                ks = gather_context(k_cache, meta.block_tables[i], seq_len, q.dtype)
                vs = gather_context(v_cache, meta.block_tables[i], seq_len, q.dtype)
            # SDPA's own causal mask where it is the whole mask (no window, no cached context).
            plain = window is None and ((ctx == 0 and not probing) or e - s == 1)
            mask = None if plain else causal_mask(e - s, ctx, seq_len, q.device, window)
            if probing and layer == meta.probe_layer:
                full_mask = mask if mask is not None else causal_mask(e - s, ctx, seq_len, q.device)
                meta.probe_probs = attention_probs(q[s:e], ks, full_mask, kvh)
            out[s:e] = _sdpa(q[s:e], ks, vs, mask, causal=mask is None and e - s > 1)
        if decode_set:
            self.decode(q, k_cache, v_cache, meta, out)
        return out

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        """Stores the step's new K/V at their slots."""
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, _all_slots_written(meta))

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, out: torch.Tensor) -> None:
        """Writes the attention of every single-query (decode) row of the step into out."""
        decode_attention(q, k_cache, v_cache, decode_plan(meta), out)


def _all_slots_written(meta: AttentionMetadata) -> bool:
    """Whether no slot of the step is -1, checked once per step rather than once per layer."""
    return meta.derived(_no_skipped_slot)


def _no_skipped_slot(meta: AttentionMetadata) -> bool:
    return bool((meta.slot_mapping >= 0).all())


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
