"""The CPU backend (vLLM's CPU attention backend has this job): the torch backend's prefills,
K/V stored by one native call per layer (vLLM's reshape_and_cache), and every decode read
straight from the paged cache by kvscope's native kernel (engine/cpu_kernels) instead of
gathered into padded copies for SDPA.

Gathering costs a copy of every decode's keys and values per layer, and padding makes short
sequences pay for the longest of their group; the kernel reads each key and value once, through
the block table (2-core AMD EPYC, 16 decodes of 26-390 tokens, 30 layers: 110 ms gathered and
padded, 15 ms native). Arithmetic in fp32 over an fp32 or bf16 cache: 'auto' picks it on a CPU
in fp32 or bf16 (engine/dtypes.py) where the kernels build."""
from __future__ import annotations

import torch

from ..cpu_kernels import NativeCpuKernels
from .metadata import AttentionMetadata
from .torch_backend import TorchAttentionBackend


class CpuAttentionBackend(TorchAttentionBackend):
    """Torch prefills; native K/V stores and paged decodes."""

    name = "cpu"

    def __init__(self, kernels: NativeCpuKernels) -> None:
        self.kernels = kernels

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        k, v = _rows_contiguous(k), _rows_contiguous(v)
        self.kernels.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, out: torch.Tensor) -> None:
        self.kernels.paged_decode_attention(_rows_contiguous(q), k_cache, v_cache, meta.decode_rows,
                                            meta.decode_seq_lens, meta.decode_block_tables, out)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] as the kernels read it: rows may lie apart (views into the packed qkv
    projection are, and need no copy), each row's heads * d floats contiguous."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()
