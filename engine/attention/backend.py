"""The attention backend interface (engine/attention/selector.py picks an implementation)."""
from __future__ import annotations

import torch

from .metadata import AttentionMetadata


class AttentionBackend:
    """Computes attention for one layer of a packed batch over the paged KV cache."""

    name = "base"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, KVH, D]; caches: [num_blocks, block_size, KVH, D].
        Returns [T, H, D]."""
        raise NotImplementedError
