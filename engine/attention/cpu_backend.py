"""The CPU backend (vLLM's CPU attention backend has this job): K/V stored by one native call
per layer (vLLM's reshape_and_cache), and every prompt and decode row's attention read straight
from the paged cache by kvscope's native kernels (engine/cpu_kernels) instead of gathered into
copies for SDPA.

Gathering costs a copy of every sequence's keys and values per layer, and padding makes short
decodes pay for the longest of their group; the kernels read each key and value through the
block table (2-core AMD EPYC, 16 decodes of 26-390 tokens, 30 layers: 110 ms gathered and
padded, 15 ms native). Prompts take the tiled prefill kernel, which computes each query row
alone in a fixed order: a chunked prompt or a prefix hit gets the bits of the whole fresh
prompt (2-core AMD EPYC Zen 4, 16 prompts of 20-400 tokens, one layer: 24 ms in SDPA with the
bf16 cache's rounding copies, 7.5 ms native). Arithmetic in fp32 over an fp32 or bf16 cache:
'auto' picks it on a CPU in fp32 or bf16 (engine/dtypes.py) where the kernels build. The
attention probe still takes the torch backend's path, which keeps the probabilities."""
from __future__ import annotations

import torch

from ..cpu_kernels import NativeCpuKernels
from .metadata import AttentionMetadata
from .torch_backend import TorchAttentionBackend


class CpuAttentionBackend(TorchAttentionBackend):
    """Native K/V stores, paged prefills and paged decodes; the torch backend's path for probes."""

    name = "cpu"

    def __init__(self, kernels: NativeCpuKernels) -> None:
        self.kernels = kernels

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if meta.probing:
            return super().forward(layer, q, k, v, k_cache, v_cache, meta)
        self.write_kv(k, v, k_cache, v_cache, meta)
        out = q.new_empty(q.shape)
        q = _rows_contiguous(q)
        prompts = meta.derived(_prompt_plan)
        if prompts is not None:
            self.kernels.paged_prefill_attention(q, k_cache, v_cache, *prompts, out, meta.sliding_window)
        if meta.decode_seq_ids:
            self.decode(q, k_cache, v_cache, meta, out)
        return out

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        k, v = _rows_contiguous(k), _rows_contiguous(v)
        self.kernels.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, out: torch.Tensor) -> None:
        tables, lens, rows = meta.decode_inputs()
        self.kernels.paged_decode_attention(_rows_contiguous(q), k_cache, v_cache, rows, lens, tables, out,
                                            meta.sliding_window)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] as the kernels read it: rows may lie apart (views into the packed qkv
    projection are, and need no copy), each row's heads * d floats contiguous."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def _prompt_plan(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The step's prompt sequences (more than one query row) as the prefill kernel takes them:
    their first query rows, query counts, cached context lengths and block tables; None when
    every sequence is a decode."""
    decodes = set(meta.decode_seq_ids)
    ids = [i for i in range(meta.num_seqs) if i not in decodes]
    if not ids:
        return None
    starts = [meta.query_start_loc[i] for i in ids]
    lens = [meta.query_start_loc[i + 1] - meta.query_start_loc[i] for i in ids]
    tables = meta.block_tables if len(ids) == meta.num_seqs else meta.block_tables[torch.tensor(ids)]
    return (torch.tensor(starts), torch.tensor(lens), torch.tensor([meta.context_lens[i] for i in ids]),
            tables.contiguous())
