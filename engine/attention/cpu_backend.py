"""The CPU backend (vLLM's CPU attention backend has this job): the torch backend's prefills,
and every decode read straight from the paged cache by kvscope's native kernel
(engine/cpu_kernels) instead of gathered into padded copies for SDPA.

Gathering costs a copy of every decode's keys and values per layer, and padding makes short
sequences pay for the longest of their group; the kernel reads each key and value once, through
the block table (2-core AMD EPYC, 16 decodes of 26-390 tokens, 30 layers: 110 ms gathered and
padded, 13 ms native). fp32 only: 'auto' picks it on a CPU in fp32 where the kernels build."""
from __future__ import annotations

import torch

from ..cpu_kernels import NativeCpuKernels
from .metadata import AttentionMetadata
from .torch_backend import TorchAttentionBackend


class CpuAttentionBackend(TorchAttentionBackend):
    """Torch prefills, native paged decodes."""

    name = "cpu"

    def __init__(self, kernels: NativeCpuKernels) -> None:
        self.kernels = kernels

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, out: torch.Tensor) -> None:
        self.kernels.paged_decode_attention(q.contiguous(), k_cache, v_cache, meta.decode_rows,
                                            meta.decode_seq_lens, meta.decode_block_tables, out)
