"""The `triton` attention backend: our own Triton kernels over the paged KV cache.

Importing this module raises ImportError when triton is not installed (get_attention_backend
turns that into a clear ValueError for attention_backend='triton', and falls back to torch
for 'auto'). On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1 set
before triton is first imported): slow, but the same code path as on a GPU.
"""
from __future__ import annotations

from typing import Any

import torch

try:
    import triton  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("the triton package is not installed (pip install triton)") from e

from .backend import AttentionBackend
from .metadata import AttentionMetadata
from .reference_ops import probe_probs_from_cache
from .triton_kernels import paged_decode_attention, paged_prefill_attention, store_kvcache


class TritonAttentionBackend(AttentionBackend):
    """store_kvcache writes the step's K/V; all single-token decodes of the step run as one
    paged_decode_attention launch, every other sequence (fresh prompts, chunks, prefix hits)
    as one paged_prefill_attention launch reading its whole context from the paged cache.

    Probe mode (meta.probe_layer set) writes nothing and runs every sequence through the
    prefill kernel; the probe layer's probabilities come from the torch reference
    (attention_probs over gather_context), i.e. from the same paged cache."""

    name = "triton"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        probing = meta.probing
        if not probing:
            store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        if q.shape[0] == 0:
            return q.new_empty(q.shape)
        scale = q.shape[-1] ** -0.5
        if probing and layer == meta.probe_layer:
            probe_probs_from_cache(q, k_cache, meta)
        inputs = meta.derived(_kernel_inputs)
        decodes = not probing and len(meta.decode_seq_ids) > 0
        if decodes and len(meta.decode_seq_ids) == q.shape[0]:
            # A pure decode step: row b is decode sequence b.
            tables, lens, _ = meta.decode_inputs()
            return paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, window=meta.sliding_window)
        out = q.new_empty(q.shape)
        pre = inputs["prefill"]
        if pre is not None:
            paged_prefill_attention(q, k_cache, v_cache, pre["query_start"], pre["seq_lens"],
                                    pre["context_lens"], pre["block_tables"], scale,
                                    out=out, max_query_len=pre["max_query_len"], window=meta.sliding_window)
        if decodes:
            tables, lens, rows = meta.decode_inputs()
            dec = paged_decode_attention(q.index_select(0, rows), k_cache, v_cache, tables, lens, scale,
                                         window=meta.sliding_window)
            out.index_copy_(0, rows, dec)
        return out


def _kernel_inputs(meta: AttentionMetadata) -> dict[str, Any]:
    """The prefill kernel's index tensors for this step's non-decode sequences (all of them
    when probing); built once per step through `meta.derived`."""
    device = meta.block_tables.device
    skip = set() if meta.probing else set(meta.decode_seq_ids)
    ids = [i for i in range(meta.num_seqs) if i not in skip]
    prefill = None
    if ids:
        def i32(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        all_ids = len(ids) == meta.num_seqs
        prefill = {
            "query_start": i32([meta.query_start_loc[i] for i in ids]),
            "seq_lens": i32([meta.seq_lens[i] for i in ids]),
            "context_lens": i32([meta.context_lens[i] for i in ids]),
            "block_tables": meta.block_tables if all_ids else
            meta.block_tables.index_select(0, torch.tensor(ids, dtype=torch.long, device=device)),
            "max_query_len": max(meta.seq_lens[i] - meta.context_lens[i] for i in ids),
        }
    return {"prefill": prefill}
