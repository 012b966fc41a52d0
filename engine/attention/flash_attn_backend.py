"""The `flash_attn` attention backend: FlashAttention-2's kernels over the paged KV cache.

The same two entry points nano-vLLM and vLLM's FlashAttention backend use:
  - a pure decode step: `flash_attn_with_kvcache` with one query per sequence, the paged
    caches, `cache_seqlens` and `block_table` (split-KV decode; launchable inside a CUDA
    graph, so decode steps replay graphs as with the triton backend);
  - every other step (fresh prompts, chunks, prefix hits, decodes mixed in): one
    `flash_attn_varlen_func` call over the paged caches with `block_table`, `cu_seqlens_k`
    counting each sequence's whole context. flash-attn aligns the causal mask to the bottom
    right when a sequence has fewer queries than keys, so query j of a chunk at positions
    context_len .. seq_len - 1 sees keys 0 .. context_len + j: prefix hits and chunked
    prefill need no special case, and a decode row is a one-query sequence.
flash-attn reads paged K/V only in pages of a multiple of 256 tokens and computes in fp16 or
bf16: EngineConfig refuses other block sizes and dtypes for this backend, naming the field.
It has no slot-mapped store, so this step's K/V are written by our Triton store kernel (vLLM
uses its own reshape_and_cache kernel for the same job); off a GPU, which only the tests'
transcription of flash-attn reaches, by the torch reference's write_kv (the two are tested
equal), not the Triton kernel crawling under its interpreter. The probe reads the paged
cache through the torch reference, as with the triton backend.

Importing this module raises ImportError when flash-attn (or triton) is not installed;
get_attention_backend turns that into a clear error, or falls back for 'auto'.
"""
from __future__ import annotations

import torch

try:
    from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("the flash-attn package is not installed (it builds against CUDA: "
                      "pip install flash-attn --no-build-isolation, on a machine with an NVIDIA GPU)") from e

from .backend import AttentionBackend
from .metadata import AttentionMetadata
from .reference_ops import probe_probs_from_cache, write_kv
from .triton_kernels import store_kvcache

PAGE_MULTIPLE = 256                                # flash-attn's paged KV: page_block_size % 256 == 0
DTYPES = (torch.float16, torch.bfloat16)           # what flash-attn computes in


class FlashAttentionBackend(AttentionBackend):
    """Paged attention through flash-attn's kernels (CUDA only; see the module docstring)."""
    name = "flash_attn"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        probing = meta.probing
        if not probing:
            store = store_kvcache if k.is_cuda else write_kv
            store(k, v, k_cache, v_cache, meta.slot_mapping)
        if q.shape[0] == 0:
            return q.new_empty(q.shape)
        if probing and layer == meta.probe_layer:
            probe_probs_from_cache(q, k_cache, meta)
        scale = q.shape[-1] ** -0.5
        inputs = meta.derived(_kernel_inputs)
        if "cache_seqlens" in inputs:  # a pure decode step: row b is decode sequence b
            out = flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=inputs["cache_seqlens"],
                                          block_table=inputs["block_table"], softmax_scale=scale, causal=True)
            return out.squeeze(1)
        return flash_attn_varlen_func(q, k_cache, v_cache, inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                                      inputs["max_seqlen_q"], inputs["max_seqlen_k"], softmax_scale=scale,
                                      causal=True, block_table=inputs["block_table"])


def _kernel_inputs(meta: AttentionMetadata) -> dict[str, torch.Tensor | int]:
    """flash-attn's index tensors (int32, as it requires) for this step, built once and reused
    by every layer. For a pure decode step they are converted from the metadata's device
    tensors (inside a CUDA-graph capture the conversion is captured too, reading the static
    buffers); otherwise they come from the host lists. Built once per step (`meta.derived`)."""
    device = meta.block_tables.device
    inputs: dict[str, torch.Tensor | int]
    if not meta.probing and meta.decode_seq_ids and len(meta.decode_seq_ids) == meta.num_seqs:
        tables, lens, _ = meta.decode_inputs()
        inputs = {"cache_seqlens": lens.to(torch.int32), "block_table": tables.to(torch.int32)}
    else:
        cu_k = [0]
        for n in meta.seq_lens:
            cu_k.append(cu_k[-1] + n)
        qsl = meta.query_start_loc
        inputs = {
            "cu_seqlens_q": torch.tensor(qsl[:meta.num_seqs + 1], dtype=torch.int32, device=device),
            "cu_seqlens_k": torch.tensor(cu_k, dtype=torch.int32, device=device),
            "max_seqlen_q": max(qsl[i + 1] - qsl[i] for i in range(meta.num_seqs)),
            "max_seqlen_k": max(meta.seq_lens),
            "block_table": meta.block_tables.to(torch.int32),
        }
    return inputs
